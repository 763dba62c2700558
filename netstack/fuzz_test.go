package netstack

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/userproxy/userproxy/conntrack"
)

// FuzzGate feeds arbitrary bytes to the stack as packets from the link, in
// both families, through the gate (its reassembler included) and (when the
// gate lets them) gVisor: no input may panic, and a well-formed SYN injected
// afterwards must still be answered.
func FuzzGate(f *testing.F) {
	syn := tcpPacket(client, service, header.TCPFlagSyn, 1000, 0)
	ack := tcpPacket(client, service, header.TCPFlagAck, 1000, 2000)
	f.Add(syn)
	f.Add(ack)
	f.Add(syn[:30])
	f.Add([]byte{0x60, 0, 0, 0, 0, 8, 17, 64})
	f.Add([]byte{})
	for _, frags := range [][][]byte{
		fragmentDatagram(udpDatagram(client, service, make([]byte, 2000)), 1480),
		fragmentDatagram(udpDatagram(netip.MustParseAddrPort("[fd00::7]:40000"), netip.MustParseAddrPort("[fd00:96::53]:53"), make([]byte, 2000)), 1232),
	} {
		f.Add(frags[0]) // a first fragment, which the next input may complete
		f.Add(frags[len(frags)-1])
	}

	ct, err := conntrack.NewTable(conntrack.Config{Max: 4096})
	if err != nil {
		f.Fatal(err)
	}
	link := NewMemoryLink(0, 8)
	// StrayResets: a segment of no flow is answered (buildStrayRST reads
	// what conntrack let through as such).
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: func(conntrack.Tuple) Decision { return Accept }, StrayResets: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(st.Close)
	st.SetFlowHandler(echoHandler{})

	f.Fuzz(func(t *testing.T, pkt []byte) {
		link.Inject(pkt)
		for link.ch.Drain() > 0 {
		}
	})

	// Still alive: a fresh SYN gets its SYN-ACK.
	probe := tcpPacket(netip.MustParseAddrPort("192.0.2.99:41000"), service, header.TCPFlagSyn, 7, 0)
	link.Inject(probe)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		out := link.Read(ctx)
		if out == nil {
			f.Fatal("the stack no longer answers a SYN after the fuzz inputs")
		}
		if len(out) >= header.IPv4MinimumSize+header.TCPMinimumSize && header.IPv4(out).Protocol() == uint8(header.TCPProtocolNumber) {
			if tcp := header.TCP(header.IPv4(out).Payload()); tcp.DestinationPort() == 41000 && tcp.Flags()&header.TCPFlagSyn != 0 {
				return
			}
		}
	}
}

// FuzzInboundPacket: of any bytes, newInboundPacket makes a PacketBuffer
// holding exactly those bytes, in two views split at tcpHeadersLen only for
// a TCP segment with splitPayload bytes of payload or more, else in one;
// tcpHeadersLen never reads past b nor returns more than len(b).
func FuzzInboundPacket(f *testing.F) {
	f.Add(tcpData(client, service, 1001, 5001, make([]byte, splitPayload)))
	f.Add(tcpData(client, service, 1001, 5001, make([]byte, 10)))
	f.Add(udpDatagram(client, service, make([]byte, 5000)))
	f.Add([]byte{0x60, 0, 0, 0, 0, 8, 6, 64})
	f.Add([]byte{0x4f, 0, 0, 0, 0, 0, 0, 0, 0, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := tcpHeadersLen(b)
		if h < 0 || h > len(b) {
			t.Fatalf("tcpHeadersLen %d of %d bytes", h, len(b))
		}
		if len(b) == 0 {
			return // a PacketBuffer of nothing has no views
		}
		pkt := newInboundPacket(b, header.IPv4ProtocolNumber)
		defer pkt.DecRef()
		views := pkt.AsSlices()
		if got := bytes.Join(views, nil); !bytes.Equal(got, b) {
			t.Fatalf("the packet holds % x, not % x", got, b)
		}
		split := h > 0 && len(b)-h >= splitPayload
		if split && (len(views) != 2 || len(views[0]) != h) || !split && len(views) != 1 {
			t.Fatalf("views of %v bytes for headers of %d and %d bytes in all", lens(views), h, len(b))
		}
	})
}

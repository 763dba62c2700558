package netstack

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// replyTwiceHandler answers a flow's first datagram with each of sizes
// bytes, once through Reply and once through the flow's gVisor endpoint,
// then closes the flow and reports what Reply said after that.
type replyTwiceHandler struct {
	sizes  []int
	closed chan error
}

func (replyTwiceHandler) HandleTCP(r *TCPRequest) { r.Refuse() }

func (h replyTwiceHandler) HandleUDP(r *UDPRequest) {
	buf := make([]byte, 100)
	if _, err := r.Conn.Read(buf); err != nil {
		h.closed <- err
		return
	}
	for _, n := range h.sizes {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(i * 7)
		}
		if err := r.Reply(p); err != nil {
			h.closed <- err
			return
		}
		if err := r.replyThroughEndpoint(p); err != nil {
			h.closed <- err
			return
		}
	}
	_ = r.Conn.Close()
	h.closed <- r.Reply([]byte("late"))
}

// bytesLink is a memory link's endpoint that also writes bytes, as the
// Linux TUN does (bytesWriter): the gate then writes its UDP replies
// through WriteBytes, which queues them where the memory link's Read finds
// them, and counts them.
type bytesLink struct {
	*channel.Endpoint
	writes atomic.Int64
}

func (l *bytesLink) WriteBytes(b []byte) tcpip.Error {
	l.writes.Add(1)
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	var pl stack.PacketBufferList
	pl.PushBack(pkt)
	defer pl.DecRef()
	_, err := l.Endpoint.WritePackets(pl)
	return err
}

// newReplyTestStack is newTestStack over a memory link that writes bytes
// when bytes is set, and returns that endpoint (nil otherwise).
func newReplyTestStack(t *testing.T, bytes bool) (*Stack, *MemoryLink, *bytesLink) {
	t.Helper()
	if !bytes {
		st, link, _ := newTestStack(t, accept)
		return st, link, nil
	}
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	bl := &bytesLink{Endpoint: link.ch}
	link.Link.ep = bl
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, link, bl
}

// replyModes are the two ways the gate writes a reply: in a PacketBuffer,
// and as bytes to a link that takes them (the Linux TUN).
var replyModes = []struct {
	name  string
	bytes bool
}{{"PacketBuffer", false}, {"bytes", true}}

// TestUDPReplyWrittenByTheGate: a reply Reply builds is, byte for byte, the
// datagram gVisor's UDP endpoint writes (IPv4 and IPv6, an empty payload,
// one that fills the MTU), whether the gate writes it in a PacketBuffer or
// as bytes; a
// reply past the MTU goes through gVisor, which fragments it, as before;
// after the flow's Conn is closed Reply fails.
func TestUDPReplyWrittenByTheGate(t *testing.T) {
	for _, mode := range replyModes {
		t.Run(mode.name, func(t *testing.T) { testUDPReplyWrittenByTheGate(t, mode.bytes) })
	}
}

func testUDPReplyWrittenByTheGate(t *testing.T, bytes bool) {
	for _, tc := range []struct {
		name         string
		client, svc  netip.AddrPort
		fits, beyond int // payload sizes: the largest that fits the MTU of 1500, and one more
	}{
		{"IPv4", netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.53:53"), 1500 - 28, 1500 - 27},
		{"IPv6", netip.MustParseAddrPort("[2001:db8::7]:40000"), netip.MustParseAddrPort("[fd00:96::53]:53"), 1500 - 48, 1500 - 47},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, link, bl := newReplyTestStack(t, bytes)
			h := replyTwiceHandler{sizes: []int{0, 5, tc.fits, tc.beyond}, closed: make(chan error, 1)}
			st.SetFlowHandler(h)
			link.Inject(udpDatagram(tc.client, tc.svc, []byte("q")))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for _, n := range h.sizes[:3] {
				direct, viaGVisor := link.Read(ctx), link.Read(ctx)
				if direct == nil || viaGVisor == nil {
					t.Fatalf("%d bytes: no reply", n)
				}
				if string(direct) != string(viaGVisor) {
					t.Fatalf("%d bytes: the gate's reply\n% x\ndiffers from gVisor's\n% x", n, direct, viaGVisor)
				}
				checkUDPReply(t, direct, tc.svc, tc.client, n)
			}
			select {
			case err := <-h.closed:
				if err == nil || err == ErrReplyDropped {
					t.Fatalf("Reply after Close: %v, want an error that ends the flow", err)
				}
			case <-ctx.Done():
				t.Fatal("the handler did not finish")
			}
			// gVisor's endpoint sent only the replies through it and the two
			// past the MTU: the others were the gate's.
			if got := st.s.Stats().UDP.PacketsSent.Value(); got != uint64(len(h.sizes)+1) {
				t.Errorf("gVisor's UDP sent %d datagrams, want %d", got, len(h.sizes)+1)
			}
			// Past the MTU both replies are gVisor's: fragments, which the
			// gate drops as INVALID (docs/conformance.md, differences).
			if got := st.counters.invalidOut.Load(); got != 4 {
				t.Errorf("%d outbound packets INVALID, want the 4 fragments of the 2 replies past the MTU", got)
			}
			if bl != nil && bl.writes.Load() != 3 {
				t.Errorf("%d replies written as bytes, want the 3 that fit the MTU", bl.writes.Load())
			}
			short, cancelShort := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancelShort()
			if p := link.Read(short); p != nil {
				t.Errorf("a %d-byte packet past the replies", len(p))
			}
		})
	}
}

// TestBuildReplySetsEveryByte: a reply written as bytes is built in a
// pooled buffer that earlier packets have dirtied, so buildReply must set
// every byte of the datagram: built over 0x00 and over 0xa5, the two agree.
func TestBuildReplySetsEveryByte(t *testing.T) {
	for _, r := range []*UDPRequest{
		{client: netip.MustParseAddrPort("192.0.2.7:40000"), svc: netip.MustParseAddrPort("10.96.0.53:53")},
		{client: netip.MustParseAddrPort("[2001:db8::7]:40000"), svc: netip.MustParseAddrPort("[fd00:96::53]:53")},
	} {
		payload := []byte("answer")
		size := header.IPv4MinimumSize + header.UDPMinimumSize + len(payload)
		if r.client.Addr().Is6() {
			size = header.IPv6MinimumSize + header.UDPMinimumSize + len(payload)
		}
		clean, dirty := make([]byte, size), make([]byte, size)
		for i := range dirty {
			dirty[i] = 0xa5
		}
		r.buildReply(clean, payload)
		r.buildReply(dirty, payload)
		if string(clean) != string(dirty) {
			t.Fatalf("%v: built over 0x00\n% x\nover 0xa5\n% x", r.client, clean, dirty)
		}
		checkUDPReply(t, clean, r.svc, r.client, len(payload))
	}
}

// checkUDPReply checks that p is an n-byte UDP datagram from -> to with
// valid checksums, TTL 64 and, for IPv4, DF.
func checkUDPReply(t *testing.T, p []byte, from, to netip.AddrPort, n int) {
	t.Helper()
	var u header.UDP
	var src, dst tcpip.Address
	if from.Addr().Is4() {
		ip := header.IPv4(p)
		if !ip.IsValid(len(p)) || !ip.IsChecksumValid() || ip.TTL() != 64 || ip.Flags()&header.IPv4FlagDontFragment == 0 {
			t.Fatalf("IPv4 header % x: want valid, TTL 64, DF", p[:20])
		}
		u, src, dst = header.UDP(ip.Payload()), ip.SourceAddress(), ip.DestinationAddress()
	} else {
		ip := header.IPv6(p)
		if !ip.IsValid(len(p)) || ip.HopLimit() != 64 {
			t.Fatalf("IPv6 header % x: want valid, hop limit 64", p[:40])
		}
		u, src, dst = header.UDP(ip.Payload()), ip.SourceAddress(), ip.DestinationAddress()
	}
	if src != tcpip.AddrFromSlice(from.Addr().AsSlice()) || dst != tcpip.AddrFromSlice(to.Addr().AsSlice()) ||
		u.SourcePort() != from.Port() || u.DestinationPort() != to.Port() || len(u.Payload()) != n {
		t.Fatalf("reply %v:%d -> %v:%d with %d bytes, want %v -> %v with %d", src, u.SourcePort(), dst, u.DestinationPort(), len(u.Payload()), from, to, n)
	}
	if !u.IsChecksumValid(src, dst, checksum.Checksum(u.Payload(), 0)) || u.Checksum() == 0 {
		t.Fatalf("UDP checksum %#04x is not valid", u.Checksum())
	}
}

// TestUDPReplyAfterClose: once the stack is closing, a reply written by the
// gate fails before it reaches the link (which may be closed already: its
// descriptor reused), not by the link's refusal.
func TestUDPReplyAfterClose(t *testing.T) {
	for _, mode := range replyModes {
		t.Run(mode.name, func(t *testing.T) {
			st, _, bl := newReplyTestStack(t, mode.bytes)
			g := st.gates[linkNIC]
			st.Close()
			before := st.counters.outbound.Load()
			r := &UDPRequest{client: netip.MustParseAddrPort("192.0.2.7:40000"), svc: netip.MustParseAddrPort("10.96.0.53:53"), out: g}
			if done, err := r.replyDirect([]byte("late")); !done || err == nil || err == ErrReplyDropped {
				t.Fatalf("a reply after Close: %v, %v; want an error that ends the flow", done, err)
			}
			if n := st.counters.outbound.Load() - before; n != 0 || (bl != nil && bl.writes.Load() != 0) {
				t.Fatalf("%d packets handed to the gate's outbound path after Close, want 0", n)
			}
		})
	}
}

// TestUDPReplyOfNoFlowIsInvalid: a reply for a flow conntrack holds no entry
// of is classified INVALID on the way out, dropped and counted, in either
// mode, as WritePackets drops any such packet; Reply does not fail for it.
func TestUDPReplyOfNoFlowIsInvalid(t *testing.T) {
	for _, mode := range replyModes {
		t.Run(mode.name, func(t *testing.T) {
			st, link, bl := newReplyTestStack(t, mode.bytes)
			r := &UDPRequest{client: netip.MustParseAddrPort("192.0.2.7:40000"), svc: netip.MustParseAddrPort("10.96.0.53:53"), out: st.gates[linkNIC]}
			if done, err := r.replyDirect([]byte("stray")); !done || err != nil {
				t.Fatalf("replyDirect: %v, %v; want done and no error", done, err)
			}
			if got := st.counters.invalidOut.Load(); got != 1 {
				t.Fatalf("%d outbound packets INVALID, want 1", got)
			}
			if bl != nil && bl.writes.Load() != 0 {
				t.Fatal("an INVALID reply reached the link")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if p := link.Read(ctx); p != nil {
				t.Fatalf("an INVALID reply reached the link: % x", p)
			}
		})
	}
}

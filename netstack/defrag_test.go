package netstack

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/userproxy/userproxy/conntrack"
)

// udpDatagram builds a UDP datagram with correct checksums, IPv4 or IPv6 by
// the addresses.
func udpDatagram(src, dst netip.AddrPort, payload []byte) []byte {
	ulen := header.UDPMinimumSize + len(payload)
	s, d := tcpip.AddrFromSlice(src.Addr().AsSlice()), tcpip.AddrFromSlice(dst.Addr().AsSlice())
	var b []byte
	var l4 []byte
	if src.Addr().Is4() {
		b = make([]byte, header.IPv4MinimumSize+ulen)
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), ID: 0x4242, TTL: 64, Protocol: uint8(header.UDPProtocolNumber), SrcAddr: s, DstAddr: d})
		ip.SetChecksum(^ip.CalculateChecksum())
		l4 = b[header.IPv4MinimumSize:]
	} else {
		b = make([]byte, header.IPv6MinimumSize+ulen)
		header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: uint16(ulen), TransportProtocol: header.UDPProtocolNumber, HopLimit: 64, SrcAddr: s, DstAddr: d})
		l4 = b[header.IPv6MinimumSize:]
	}
	u := header.UDP(l4)
	u.Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(ulen)})
	copy(l4[header.UDPMinimumSize:], payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, s, d, uint16(ulen))
	u.SetChecksum(^checksum.Checksum(l4, xsum))
	return b
}

// fragmentDatagram cuts an IPv4 or IPv6 datagram (without extension
// headers) into fragments carrying size bytes of its payload each (a
// multiple of 8), as a sender with a small MTU would.
func fragmentDatagram(pkt []byte, size int) [][]byte {
	var out [][]byte
	if header.IPVersion(pkt) == header.IPv4Version {
		ihl := int(header.IPv4(pkt).HeaderLength())
		p := pkt[ihl:]
		for off := 0; off < len(p); off += size {
			end := min(off+size, len(p))
			f := append(append([]byte(nil), pkt[:ihl]...), p[off:end]...)
			ip := header.IPv4(f)
			ip.SetTotalLength(uint16(len(f)))
			flags := uint8(0)
			if end < len(p) {
				flags = header.IPv4FlagMoreFragments
			}
			ip.SetFlagsFragmentOffset(flags, uint16(off))
			ip.SetChecksum(0)
			ip.SetChecksum(^ip.CalculateChecksum())
			out = append(out, f)
		}
		return out
	}
	p := pkt[header.IPv6MinimumSize:]
	next := pkt[6]
	for off := 0; off < len(p); off += size {
		end := min(off+size, len(p))
		f := append([]byte(nil), pkt[:header.IPv6MinimumSize]...)
		fo := uint16(off)
		if end < len(p) {
			fo |= 1 // M
		}
		f = append(f, next, 0, byte(fo>>8), byte(fo), 0, 0, 0x42, 0x42)
		f = append(f, p[off:end]...)
		f[6] = uint8(header.IPv6FragmentHeader)
		binary.BigEndian.PutUint16(f[4:], uint16(len(f)-header.IPv6MinimumSize))
		out = append(out, f)
	}
	return out
}

// udpCollector hands the first datagram of each UDP flow to got.
type udpCollector struct{ got chan []byte }

func (udpCollector) HandleTCP(r *TCPRequest) { r.Refuse() }

func (h udpCollector) HandleUDP(r *UDPRequest) {
	defer r.Conn.Close()
	buf := make([]byte, 65536)
	_ = r.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := r.Conn.Read(buf); err == nil {
		h.got <- append([]byte(nil), buf[:n]...)
	}
}

// TestFragmentedUDPReachesHandler: a 4000-byte UDP datagram to a service,
// sent as fragments for a 1500-byte link (1280 for IPv6) and out of order,
// is reassembled by the gate, classified once as a new flow, and reaches the
// flow handler intact as one datagram. Nothing is INVALID.
func TestFragmentedUDPReachesHandler(t *testing.T) {
	payload := make([]byte, 4000)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	for _, tc := range []struct {
		name   string
		c, s   netip.AddrPort
		size   int
		family int
	}{
		{"ipv4", client, netip.MustParseAddrPort("10.96.0.53:53"), 1480, 4},
		{"ipv6", netip.MustParseAddrPort("[fd00::7]:40000"), netip.MustParseAddrPort("[fd00:96::53]:53"), 1232, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, link, ct := newTestStack(t, accept)
			h := udpCollector{got: make(chan []byte, 1)}
			st.SetFlowHandler(h)
			frags := fragmentDatagram(udpDatagram(tc.c, tc.s, payload), tc.size)
			if len(frags) < 3 {
				t.Fatalf("%d fragments", len(frags))
			}
			link.Inject(frags[len(frags)-1]) // last first, then in order
			for _, f := range frags[:len(frags)-1] {
				link.Inject(f)
			}
			select {
			case got := <-h.got:
				if !bytes.Equal(got, payload) {
					t.Fatalf("the handler read %d bytes, not the %d sent", len(got), len(payload))
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("the datagram never reached the handler; conntrack %+v", ct.Stats().Invalid)
			}
			rs := st.gates[linkNIC].defrag.Stats()
			if rs.Fragments != uint64(len(frags)) || rs.Reassembled != 1 || rs.Queues != 0 {
				t.Errorf("reassembler stats %+v", rs)
			}
			if s := ct.Stats(); s.InvalidTotal != 0 || s.Inserted != 1 {
				t.Errorf("conntrack: %d INVALID, %d entries inserted; want 0, 1", s.InvalidTotal, s.Inserted)
			}
			if s := st.Stats(); s.InvalidIn != 0 || s.Accepted != 1 {
				t.Errorf("gate: InvalidIn %d, Accepted %d", s.InvalidIn, s.Accepted)
			}
		})
	}
}

// icmpEcho builds an ICMP or ICMPv6 echo request from src to dst.
func icmpEcho(src, dst netip.Addr) []byte {
	s, d := tcpip.AddrFromSlice(src.AsSlice()), tcpip.AddrFromSlice(dst.AsSlice())
	if src.Is4() {
		b := make([]byte, header.IPv4MinimumSize+header.ICMPv4MinimumSize+8)
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber), SrcAddr: s, DstAddr: d})
		ip.SetChecksum(^ip.CalculateChecksum())
		icmp := header.ICMPv4(ip.Payload())
		icmp.SetType(header.ICMPv4Echo)
		icmp.SetIdent(7)
		icmp.SetChecksum(^checksum.Checksum(icmp, 0))
		return b
	}
	b := make([]byte, header.IPv6MinimumSize+header.ICMPv6EchoMinimumSize+8)
	header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: uint16(len(b) - header.IPv6MinimumSize), TransportProtocol: header.ICMPv6ProtocolNumber, HopLimit: 64, SrcAddr: s, DstAddr: d})
	icmp := header.ICMPv6(b[header.IPv6MinimumSize:])
	icmp.SetType(header.ICMPv6EchoRequest)
	icmp.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{Header: icmp, Src: s, Dst: d}))
	return b
}

// TestICMPEchoNotInvalid: a ping to a service address is dropped without an
// answer, as with kube-proxy, but it is not INVALID: conntrack counts it as
// unsupported ICMP, and neither ct_state_invalid_dropped_packets_total's
// source (InvalidTotal) nor the gate's INVALID count moves.
func TestICMPEchoNotInvalid(t *testing.T) {
	st, link, ct := newTestStack(t, accept)
	link.Inject(icmpEcho(client.Addr(), service.Addr()))
	link.Inject(icmpEcho(netip.MustParseAddr("fd00::7"), netip.MustParseAddr("fd00:96::10")))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if pkt := link.Read(ctx); pkt != nil {
		t.Fatalf("the stack answered a ping: %x", pkt)
	}
	s := ct.Stats()
	if s.InvalidTotal != 0 {
		t.Errorf("InvalidTotal = %d, want 0 (%+v)", s.InvalidTotal, s.Invalid)
	}
	if s.Unsupported[conntrack.ICMP] != 1 || s.Unsupported[conntrack.ICMPv6] != 1 {
		t.Errorf("Unsupported icmp %d, icmpv6 %d; want 1 each", s.Unsupported[conntrack.ICMP], s.Unsupported[conntrack.ICMPv6])
	}
	if n := st.Stats().InvalidIn; n != 0 {
		t.Errorf("gate InvalidIn = %d, want 0", n)
	}
}

// TestFragmentedICMPNotInvalid: a fragmented ping is reassembled, then
// counted as unsupported, not INVALID.
func TestFragmentedPingNotInvalid(t *testing.T) {
	_, link, ct := newTestStack(t, accept)
	echo := icmpEcho(client.Addr(), service.Addr())
	big := append(echo, make([]byte, 3000)...)
	ip := header.IPv4(big)
	ip.SetTotalLength(uint16(len(big)))
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
	icmp := header.ICMPv4(ip.Payload())
	icmp.SetChecksum(0)
	icmp.SetChecksum(^checksum.Checksum(icmp, 0))
	for _, f := range fragmentDatagram(big, 1480) {
		link.Inject(f)
	}
	if s := ct.Stats(); s.InvalidTotal != 0 || s.Unsupported[conntrack.ICMP] != 1 {
		t.Errorf("InvalidTotal %d, Unsupported icmp %d; want 0, 1", s.InvalidTotal, s.Unsupported[conntrack.ICMP])
	}
}

// TestGateInboundNoAllocs: the gate's inbound path for packets that are not
// fragments allocates nothing up to gVisor: here a stray ACK (INVALID) and a
// ping (unsupported), both dropped by the gate.
func TestGateInboundNoAllocs(t *testing.T) {
	st, _, _ := newTestStack(t, accept)
	g := st.gates[linkNIC]
	for _, pkt := range [][]byte{
		tcpPacket(client, service, header.TCPFlagAck, 1000, 2000),
		icmpEcho(client.Addr(), service.Addr()),
	} {
		pb := newPacket(pkt, header.IPv4ProtocolNumber)
		if a := testing.AllocsPerRun(100, func() { g.DeliverNetworkPacket(header.IPv4ProtocolNumber, pb) }); a != 0 {
			t.Errorf("%d-byte packet: %.1f allocations", len(pkt), a)
		}
		pb.DecRef()
	}
}

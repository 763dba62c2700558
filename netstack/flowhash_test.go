package netstack

import (
	"fmt"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// A packet and its reply hash alike, whether the hash reads raw bytes
// (flowHashPacket: the translator's and the gate's writes) or gVisor's
// headers (flowHash: WritePackets), so that a multi-queue TUN writes both
// directions of a flow on one queue, as the kernel's symmetric flow hash
// (__skb_get_hash_symmetric, used by tun_flow_update) reads them alike.
func TestFlowHashSymmetric(t *testing.T) {
	for _, c := range []struct{ a, b string }{
		{"192.0.2.7:40000", "10.96.0.10:80"},
		{"10.96.0.10:80", "10.96.0.10:81"},
		{"[2001:db8::7]:40000", "[fd00::10]:443"},
	} {
		a, b := netip.MustParseAddrPort(c.a), netip.MustParseAddrPort(c.b)
		var there, back uint32
		if a.Addr().Is4() {
			there, back = flowHashPacket(tcpPacket(a, b, header.TCPFlagSyn, 1, 0)), flowHashPacket(tcpPacket(b, a, header.TCPFlagAck, 2, 2))
		} else {
			p, q := gvisorSegment(a, b, 1, 0, nil, []byte("x")), gvisorSegment(b, a, 2, 2, nil, nil)
			there, back = flowHash(p.NetworkHeader().Slice(), p.TransportHeader().Slice()), flowHash(q.NetworkHeader().Slice(), q.TransportHeader().Slice())
			p.DecRef()
			q.DecRef()
		}
		if there != back {
			t.Errorf("%s <-> %s: %#x one way, %#x the other", a, b, there, back)
		}
	}
	// gVisor's headers and the same packet's bytes hash alike.
	a, b := netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.10:80")
	p := gvisorSegment(a, b, 1, 0, nil, []byte("x"))
	defer p.DecRef()
	raw := tcpPacket(b, a, header.TCPFlagAck, 2, 2)
	if h, r := flowHash(p.NetworkHeader().Slice(), p.TransportHeader().Slice()), flowHashPacket(raw); h != r {
		t.Errorf("gVisor's packet hashes %#x, its reply's bytes %#x", h, r)
	}
}

// Flows spread evenly over the queues: 20,000 client ports to one service
// over 2, 4 and 16 queues, each queue within 10% of its share.
func TestFlowHashSpreads(t *testing.T) {
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	const flows = 20000
	for _, queues := range []uint32{2, 4, 16} {
		t.Run(fmt.Sprint(queues), func(t *testing.T) {
			count := make([]int, queues)
			for i := range flows {
				c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i % 7)}), uint16(32768+i))
				count[flowHashPacket(tcpPacket(c, svc, header.TCPFlagSyn, 1, 0))%queues]++
			}
			share := flows / int(queues)
			for q, n := range count {
				if n < share*9/10 || n > share*11/10 {
					t.Errorf("queue %d of %d has %d flows, its share is %d", q, queues, n, share)
				}
			}
		})
	}
}

// Short, truncated and non-IP input neither panics nor reads past its end;
// every fragment of a datagram, the first one too, hashes by its addresses
// and protocol alone (the kernel's flow dissector reads no ports past a
// fragment header), so all of them leave on one queue.
func TestFlowHashMalformed(t *testing.T) {
	for _, b := range [][]byte{nil, {0x45}, {0x60, 0, 0}, {0x10, 1, 2, 3}, make([]byte, 19), {0x4f, 0, 0, 20}} {
		_ = flowHashPacket(b)
	}
	a, b := netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.10:80")
	first := tcpPacket(a, b, header.TCPFlagAck, 1, 1)
	first[6] = 0x20 // more fragments, offset 0
	later := tcpPacket(a, b, header.TCPFlagAck, 1, 1)
	later[6], later[7] = 0, 10 // fragment offset 80: no ports
	other := tcpPacket(netip.AddrPortFrom(a.Addr(), 40001), b, header.TCPFlagAck, 1, 1)
	other[6], other[7] = 0, 10
	if flowHashPacket(later) != flowHashPacket(other) {
		t.Error("two later fragments of the same addresses hash apart: their ports were read")
	}
	if flowHashPacket(first) != flowHashPacket(later) {
		t.Error("a datagram's first fragment and a later one hash apart: the first one's ports were read")
	}
}

func FuzzFlowHash(f *testing.F) {
	a, b := netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.10:80")
	f.Add(tcpPacket(a, b, header.TCPFlagSyn, 1, 0))
	f.Add([]byte{0x60, 0, 0, 0, 0, 0, 6})
	f.Fuzz(func(t *testing.T, b []byte) {
		h := flowHashPacket(b)
		if len(b) < 20 && h != 0 {
			t.Fatalf("%d bytes hash to %#x: shorter than any IP header", len(b), h)
		}
		// The same packet with its ends swapped (addresses and, past the
		// IPv4 header's options, ports) hashes alike.
		if len(b) < 20 || b[0]>>4 != 4 {
			return
		}
		r := append([]byte(nil), b...)
		copy(r[12:16], b[16:20])
		copy(r[16:20], b[12:16])
		if ihl := int(b[0]&0x0f) * 4; ihl >= 20 && ihl+4 <= len(b) {
			copy(r[ihl:ihl+2], b[ihl+2:ihl+4])
			copy(r[ihl+2:ihl+4], b[ihl:ihl+2])
		}
		if flowHashPacket(r) != h {
			t.Fatalf("%x hashes to %#x, with its ends swapped to %#x", b, h, flowHashPacket(r))
		}
	})
}

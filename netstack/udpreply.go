package netstack

// UDP replies written by the gate: Reply builds a reply's IP and UDP headers
// itself, as gVisor's UDP endpoint would (from the service address, TTL or
// hop limit 64, IPv4 with DF and ID 0: gVisor's default path MTU discovery,
// "want"), and hands the datagram to the gate's outbound path, where it is
// classified in the Reply direction and written to the link like every
// packet of the stack. The flow's gVisor endpoint is skipped: its locks, its
// send buffer accounting, its route and its header building, per datagram
// (BENCHMARKS.md, tuning log). A reply that does not fit the link's MTU
// still goes through the endpoint, which fragments it, and the gate then
// drops the fragments as INVALID (docs/conformance.md, differences). An ICMP error the
// client sent no longer costs the next reply: the endpoint reported it as
// that reply's failure, and the datagram was dropped; the gate writes it, as
// the kernel's NAT would forward it.

import (
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// replyTTL is gVisor's default TTL and hop limit (ipv4.DefaultTTL,
// ipv6.DefaultTTL).
const replyTTL = 64

// errReplyClosed is Reply's error once the flow's Conn is closed, as the
// endpoint's write would fail then.
var errReplyClosed = errors.New("netstack: UDP reply: the flow is closed")

// udpConn is a flow's Conn: it tells Reply when the handler closed it.
type udpConn struct {
	net.Conn
	closed *atomic.Bool
}

func (c udpConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// replyDirect writes b to the client from the service address through
// r.out; it reports false when b does not fit the link's MTU, and nothing
// was written. A link that writes bytes (the Linux TUN) gets the datagram
// built in a pooled buffer; any other gets it in a PacketBuffer.
func (r *UDPRequest) replyDirect(b []byte) (bool, error) {
	out := r.out
	hlen := header.IPv6MinimumSize
	if r.client.Addr().Is4() {
		hlen = header.IPv4MinimumSize
	}
	total := hlen + header.UDPMinimumSize + len(b)
	if total > int(out.MTU()) {
		return false, nil
	}
	if r.closed.Load() {
		return true, errReplyClosed
	}
	var err tcpip.Error
	if out.bytesOut != nil {
		bp := packetPool.Get().(*[]byte)
		p := (*bp)[:total]
		r.buildReply(p, b)
		err = out.writeOwnBytes(p)
		packetPool.Put(bp)
	} else {
		v := buffer.NewViewSize(total)
		pkt := packetOf(buffer.MakeWithView(v), r.buildReply(v.AsSlice(), b))
		var pl stack.PacketBufferList
		pl.PushBack(pkt)
		_, err = out.writeOwn(pl)
		pl.DecRef()
	}
	switch err.(type) {
	case nil:
		return true, nil
	case *tcpip.ErrClosedForSend:
		return true, errors.New("netstack: UDP reply: " + err.String())
	}
	return true, ErrReplyDropped
}

// buildReply writes into p, sized to fit, the datagram that carries b from
// the service address to the client, and returns its network protocol.
func (r *UDPRequest) buildReply(p, b []byte) tcpip.NetworkProtocolNumber {
	var src, dst tcpip.Address
	proto := header.IPv6ProtocolNumber
	if r.client.Addr().Is4() {
		src, dst = tcpip.AddrFrom4(r.svc.Addr().As4()), tcpip.AddrFrom4(r.client.Addr().As4())
		proto = header.IPv4ProtocolNumber
	} else {
		src, dst = tcpip.AddrFrom16(r.svc.Addr().As16()), tcpip.AddrFrom16(r.client.Addr().As16())
	}
	ulen := uint16(header.UDPMinimumSize + len(b))
	hlen := putIPHeader(p, src, dst, header.UDPProtocolNumber, int(ulen))
	u := header.UDP(p[hlen:])
	u.Encode(&header.UDPFields{SrcPort: r.svc.Port(), DstPort: r.client.Port(), Length: ulen})
	copy(u.Payload(), b)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, src, dst, ulen)
	xsum = checksum.Checksum(u, xsum)
	if xsum != 0xffff {
		xsum = ^xsum
	}
	binary.BigEndian.PutUint16(u[6:], xsum) // a sum of 0 is sent as 0xffff (RFC 768)
	return proto
}

// putIPHeader writes at p's start the IP header of a packet the gate builds
// itself (a UDP reply) carrying transportLen bytes of proto from src to
// dst, and returns its length: IPv4 with DF set and its checksum, or IPv6,
// by src's family; TTL replyTTL.
func putIPHeader(p []byte, src, dst tcpip.Address, proto tcpip.TransportProtocolNumber, transportLen int) int {
	if src.Len() == header.IPv4AddressSize {
		ip := header.IPv4(p)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(header.IPv4MinimumSize + transportLen),
			Flags:       header.IPv4FlagDontFragment,
			TTL:         replyTTL,
			Protocol:    uint8(proto),
			SrcAddr:     src,
			DstAddr:     dst,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		return header.IPv4MinimumSize
	}
	header.IPv6(p).Encode(&header.IPv6Fields{
		PayloadLength:     uint16(transportLen),
		TransportProtocol: proto,
		HopLimit:          replyTTL,
		SrcAddr:           src,
		DstAddr:           dst,
	})
	return header.IPv6MinimumSize
}

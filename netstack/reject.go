package netstack

import (
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// iptables' REJECT target (kube-proxy's for services without endpoints, with
// the default --reject-with icmp-port-unreachable / icmp6-port-unreachable)
// answers with an ICMP error built by the kernel's icmp_send / icmpv6_send:
// the offending packet is quoted from its IP header on, as much of it as
// keeps the error within 576 bytes (IPv4, RFC 1812) or 1280 bytes (IPv6, RFC
// 4443); the error travels from the address the client wrote to (here the
// ClusterIP) back to the client.

const (
	icmpv4MaxError = 576
	icmpv6MaxError = 1280
)

// buildPortUnreachable returns the ICMP or ICMPv6 port unreachable for the
// packet b (already validated by conntrack), or nil if b is not IP.
func buildPortUnreachable(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	switch header.IPVersion(b) {
	case header.IPv4Version:
		if len(b) < header.IPv4MinimumSize {
			return nil
		}
		in := header.IPv4(b)
		quote := b[:min(len(b), icmpv4MaxError-header.IPv4MinimumSize-header.ICMPv4MinimumSize)]
		out := make([]byte, header.IPv4MinimumSize+header.ICMPv4MinimumSize+len(quote))
		ip := header.IPv4(out)
		ip.Encode(&header.IPv4Fields{
			TOS:         tosInternetControl(in),
			TotalLength: uint16(len(out)),
			TTL:         64,
			Protocol:    uint8(header.ICMPv4ProtocolNumber),
			SrcAddr:     in.DestinationAddress(),
			DstAddr:     in.SourceAddress(),
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		icmp := header.ICMPv4(out[header.IPv4MinimumSize:])
		icmp.SetType(header.ICMPv4DstUnreachable)
		icmp.SetCode(header.ICMPv4PortUnreachable)
		copy(icmp[header.ICMPv4MinimumSize:], quote)
		icmp.SetChecksum(^checksum.Checksum(icmp, 0))
		return out
	case header.IPv6Version:
		if len(b) < header.IPv6MinimumSize {
			return nil
		}
		in := header.IPv6(b)
		quote := b[:min(len(b), icmpv6MaxError-header.IPv6MinimumSize-header.ICMPv6DstUnreachableMinimumSize)]
		out := make([]byte, header.IPv6MinimumSize+header.ICMPv6DstUnreachableMinimumSize+len(quote))
		ip := header.IPv6(out)
		src, dst := in.DestinationAddress(), in.SourceAddress()
		ip.Encode(&header.IPv6Fields{
			PayloadLength:     uint16(len(out) - header.IPv6MinimumSize),
			TransportProtocol: header.ICMPv6ProtocolNumber,
			HopLimit:          64,
			SrcAddr:           src,
			DstAddr:           dst,
		})
		icmp := header.ICMPv6(out[header.IPv6MinimumSize:])
		icmp.SetType(header.ICMPv6DstUnreachable)
		icmp.SetCode(header.ICMPv6PortUnreachable)
		copy(icmp[header.ICMPv6DstUnreachableMinimumSize:], quote)
		icmp.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{
			Header:      icmp[:header.ICMPv6DstUnreachableMinimumSize],
			Src:         src,
			Dst:         dst,
			PayloadCsum: checksum.Checksum(quote, 0),
			PayloadLen:  len(quote),
		}))
		return out
	}
	return nil
}

// newPacket wraps raw packet bytes in a PacketBuffer for writing to a link.
func newPacket(b []byte, proto tcpip.NetworkProtocolNumber) *stack.PacketBuffer {
	return packetOf(buffer.MakeWithData(b), proto)
}

// packetOf returns a PacketBuffer of protocol proto holding buf.
func packetOf(buf buffer.Buffer, proto tcpip.NetworkProtocolNumber) *stack.PacketBuffer {
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buf})
	pb.NetworkProtocolNumber = proto
	return pb
}

// rejecter rate-limits the ICMP errors the gate sends, as the kernel's
// icmp_global_allow does (net.ipv4.icmp_msgs_per_sec 1000, icmp_msgs_burst
// 50): a token bucket shared by all destinations.
type rejecter struct {
	mu     sync.Mutex
	rate   float64 // tokens per second
	burst  float64
	tokens float64
	last   time.Time
	now    func() time.Time
}

func newRejecter(perSecond, burst int, now func() time.Time) *rejecter {
	return &rejecter{rate: float64(perSecond), burst: float64(burst), tokens: float64(burst), now: now}
}

func (r *rejecter) allow() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if !r.last.IsZero() {
		r.tokens = min(r.burst, r.tokens+now.Sub(r.last).Seconds()*r.rate)
	}
	r.last = now
	if r.tokens < 1 {
		return false
	}
	r.tokens--
	return true
}

// tosInternetControl is the TOS of an ICMP error about in: in's TOS bits with
// the precedence "internetwork control" (icmp_send: IPTOS_PREC_INTERNETCONTROL).
func tosInternetControl(in header.IPv4) uint8 {
	tos, _ := in.TOS()
	return tos&0x1E | 0xC0
}

// buildClientRST returns a RST from the client side of id (RemoteAddress:
// RemotePort to LocalAddress:LocalPort) with sequence number seq.
func buildClientRST(id stack.TransportEndpointID, seq uint32) []byte {
	return buildRST(id, seq, 0, header.TCPFlagRst)
}

// buildStrayRST returns the RST a host sends for the client's segment b
// when it has no connection for it (RFC 9293 3.10.7.1, CLOSED): from the
// service back to the client, with the sequence number of the segment's
// ACK, or with sequence number 0 acknowledging the segment when it has no
// ACK. It returns nil for a RST (never answered) or what is not a TCP
// segment in IPv4 or IPv6 without extension headers.
func buildStrayRST(b []byte) []byte {
	off, ok := tcpOffset(b)
	if !ok {
		return nil
	}
	tcp := header.TCP(b[off:])
	flags := tcp.Flags()
	if flags&header.TCPFlagRst != 0 {
		return nil
	}
	var id stack.TransportEndpointID
	end := len(b)
	if b[0]>>4 == 4 {
		ip := header.IPv4(b)
		id.RemoteAddress, id.LocalAddress = ip.DestinationAddress(), ip.SourceAddress()
		end = min(end, int(ip.TotalLength()))
	} else {
		ip := header.IPv6(b)
		id.RemoteAddress, id.LocalAddress = ip.DestinationAddress(), ip.SourceAddress()
		end = min(end, header.IPv6MinimumSize+int(ip.PayloadLength()))
	}
	id.RemotePort, id.LocalPort = tcp.DestinationPort(), tcp.SourcePort()
	if flags&header.TCPFlagAck != 0 {
		return buildRST(id, tcp.AckNumber(), 0, header.TCPFlagRst)
	}
	segLen := uint32(max(end-off-int(tcp.DataOffset()), 0))
	if flags&header.TCPFlagSyn != 0 {
		segLen++
	}
	if flags&header.TCPFlagFin != 0 {
		segLen++
	}
	return buildRST(id, 0, tcp.SequenceNumber()+segLen, header.TCPFlagRst|header.TCPFlagAck)
}

// buildRST returns a segment with flags (a RST, with or without an ACK)
// from id.RemoteAddress:RemotePort to id.LocalAddress:LocalPort.
func buildRST(id stack.TransportEndpointID, seq, ack uint32, flags header.TCPFlags) []byte {
	src, dst := id.RemoteAddress, id.LocalAddress
	var b []byte
	var tcpOff int
	switch src.Len() {
	case 4:
		b = make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: src, DstAddr: dst})
		ip.SetChecksum(^ip.CalculateChecksum())
		tcpOff = header.IPv4MinimumSize
	case 16:
		b = make([]byte, header.IPv6MinimumSize+header.TCPMinimumSize)
		header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: header.TCPMinimumSize, TransportProtocol: header.TCPProtocolNumber, HopLimit: 64, SrcAddr: src, DstAddr: dst})
		tcpOff = header.IPv6MinimumSize
	default:
		return nil
	}
	t := header.TCP(b[tcpOff:])
	t.Encode(&header.TCPFields{SrcPort: id.RemotePort, DstPort: id.LocalPort, SeqNum: seq, AckNum: ack, DataOffset: header.TCPMinimumSize, Flags: flags})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(t)))
	t.SetChecksum(^checksum.Checksum(t, xsum))
	return b
}

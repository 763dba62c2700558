package conntrack

// Test packet builders. They compute every checksum with refChecksum, a plain
// 16-bit word sum written independently of checksum.go, so a mistake in the
// optimised sum cannot hide itself.

import (
	"encoding/binary"
	"net/netip"
)

// refChecksum is RFC 1071 done the slow, obvious way over the concatenation
// of the parts.
func refChecksum(parts ...[]byte) uint16 {
	var all []byte
	for _, p := range parts {
		all = append(all, p...)
	}
	if len(all)%2 == 1 {
		all = append(all, 0)
	}
	var s uint32
	for i := 0; i < len(all); i += 2 {
		s += uint32(all[i])<<8 | uint32(all[i+1])
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// pseudoHeader builds the TCP/UDP/ICMPv6 pseudo-header.
func pseudoHeader(src, dst netip.Addr, proto uint8, length int) []byte {
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		h := append(s[:], d[:]...)
		return append(h, 0, proto, byte(length>>8), byte(length))
	}
	s, d := src.As16(), dst.As16()
	h := append(s[:], d[:]...)
	return append(h, byte(length>>24), byte(length>>16), byte(length>>8), byte(length), 0, 0, 0, proto)
}

// ipOpts tweaks ipPacket.
type ipOpts struct {
	ipv4Options []byte // appended to the IPv4 header (a multiple of 4 bytes)
	fragment    uint16 // IPv4 flags+offset field
	extHeaders  []byte // IPv6 extension headers, first next-header in extFirst
	extFirst    uint8
	noL4Csum    bool // leave the transport checksum as the caller wrote it
}

// ipPacket wraps l4 in an IPv4 or IPv6 header from src to dst, filling the
// transport checksum at csumOff (if >= 0) and the IPv4 header checksum.
func ipPacket(src, dst netip.Addr, proto uint8, l4 []byte, csumOff int, o ipOpts) []byte {
	l4 = append([]byte(nil), l4...)
	if csumOff >= 0 && !o.noL4Csum {
		l4[csumOff], l4[csumOff+1] = 0, 0
		var c uint16
		if proto == 1 { // ICMPv4 has no pseudo-header
			c = refChecksum(l4)
		} else {
			c = refChecksum(pseudoHeader(src, dst, proto, len(l4)), l4)
		}
		if proto == 17 && c == 0 {
			c = 0xffff // RFC 768: a computed zero is sent as all ones
		}
		binary.BigEndian.PutUint16(l4[csumOff:], c)
	}
	if src.Is4() {
		hl := 20 + len(o.ipv4Options)
		h := make([]byte, hl)
		h[0] = 0x40 | byte(hl/4)
		binary.BigEndian.PutUint16(h[2:], uint16(hl+len(l4)))
		binary.BigEndian.PutUint16(h[4:], 0x1234)
		binary.BigEndian.PutUint16(h[6:], o.fragment)
		h[8] = 64
		h[9] = proto
		s, d := src.As4(), dst.As4()
		copy(h[12:], s[:])
		copy(h[16:], d[:])
		copy(h[20:], o.ipv4Options)
		binary.BigEndian.PutUint16(h[10:], refChecksum(h))
		return append(h, l4...)
	}
	h := make([]byte, 40)
	h[0] = 0x60
	binary.BigEndian.PutUint16(h[4:], uint16(len(o.extHeaders)+len(l4)))
	h[6] = proto
	if len(o.extHeaders) > 0 {
		h[6] = o.extFirst
	}
	h[7] = 64
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	h = append(h, o.extHeaders...)
	return append(h, l4...)
}

// tcpSeg describes a TCP segment for tcpPacket.
type tcpSeg struct {
	src, dst netip.AddrPort
	flags    uint8
	seq, ack uint32
	win      uint16
	payload  int    // bytes of payload
	opts     []byte // raw options, padded here to a multiple of 4
	doff     int    // override the data offset field (words), 0 = computed
	ip       ipOpts
}

func tcpPacket(s tcpSeg) []byte {
	opts := append([]byte(nil), s.opts...)
	for len(opts)%4 != 0 {
		opts = append(opts, 1) // NOP padding
	}
	hl := 20 + len(opts)
	b := make([]byte, hl+s.payload)
	binary.BigEndian.PutUint16(b[0:], s.src.Port())
	binary.BigEndian.PutUint16(b[2:], s.dst.Port())
	binary.BigEndian.PutUint32(b[4:], s.seq)
	binary.BigEndian.PutUint32(b[8:], s.ack)
	doff := hl / 4
	if s.doff != 0 {
		doff = s.doff
	}
	b[12] = byte(doff << 4)
	b[13] = s.flags
	binary.BigEndian.PutUint16(b[14:], s.win)
	copy(b[20:], opts)
	for i := hl; i < len(b); i++ {
		b[i] = byte(i)
	}
	return ipPacket(s.src.Addr(), s.dst.Addr(), 6, b, 16, s.ip)
}

func udpPacket(src, dst netip.AddrPort, payload int, o ipOpts) []byte {
	b := make([]byte, 8+payload)
	binary.BigEndian.PutUint16(b[0:], src.Port())
	binary.BigEndian.PutUint16(b[2:], dst.Port())
	binary.BigEndian.PutUint16(b[4:], uint16(len(b)))
	for i := 8; i < len(b); i++ {
		b[i] = byte(i * 7)
	}
	return ipPacket(src.Addr(), dst.Addr(), 17, b, 6, o)
}

// icmpError builds an ICMP (IPv4) or ICMPv6 error of the given type from src
// to dst quoting the first quoteLen bytes of quoted (all of it if negative).
func icmpError(src, dst netip.Addr, typ, code uint8, quoted []byte, quoteLen int) []byte {
	if quoteLen >= 0 && quoteLen < len(quoted) {
		quoted = quoted[:quoteLen]
	}
	b := append(make([]byte, 8), quoted...)
	b[0], b[1] = typ, code
	proto := uint8(1)
	if src.Is6() {
		proto = 58
	}
	return ipPacket(src, dst, proto, b, 2, ipOpts{})
}

// icmpInfo builds a non-error ICMP message such as an echo request.
func icmpInfo(src, dst netip.Addr, typ uint8) []byte {
	b := make([]byte, 16)
	b[0] = typ
	proto := uint8(1)
	if src.Is6() {
		proto = 58
	}
	return ipPacket(src, dst, proto, b, 2, ipOpts{})
}

// Option builders.
func tcpOptMSS(v uint16) []byte   { return []byte{2, 4, byte(v >> 8), byte(v)} }
func tcpOptWScale(s uint8) []byte { return []byte{1, 3, 3, s} } // NOP + window scale
func tcpOptSackPerm() []byte      { return []byte{1, 1, 4, 2} } // NOP NOP + SACK permitted
func tcpOptTimestamps(v, e uint32) []byte {
	b := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[4:], v)
	binary.BigEndian.PutUint32(b[8:], e)
	return b
}
func tcpOptSack(blocks ...[2]uint32) []byte {
	b := []byte{1, 1, 5, byte(2 + 8*len(blocks))}
	for _, bl := range blocks {
		b = binary.BigEndian.AppendUint32(b, bl[0])
		b = binary.BigEndian.AppendUint32(b, bl[1])
	}
	return b
}
func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Addresses used throughout the tests.
var (
	client4  = netip.MustParseAddrPort("10.0.0.1:5555")
	service4 = netip.MustParseAddrPort("10.96.0.10:80")
	pod4     = netip.MustParseAddrPort("10.244.0.5:8080")
	client6  = netip.MustParseAddrPort("[fd00::1]:5555")
	service6 = netip.MustParseAddrPort("[fd00:96::10]:80")
)

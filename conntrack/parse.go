package conntrack

// Packet parsing. One pass over the bytes, no allocation, never a panic:
// every way a packet can be malformed is a Reason.
//
// 1. IP header: IPv4 (options skipped by IHL, fragments refused) or IPv6
//    (Hop-by-Hop, Destination Options and exhausted Routing headers skipped,
//    everything else refused).
// 2. Checksums of the IPv4 header and the transport, when asked to verify.
// 3. Transport header: TCP (data offset, flag combination, the options that
//    window tracking needs), UDP (length), or ICMP/ICMPv6 errors, whose quoted
//    packet is parsed leniently into the tuple of the flow it belongs to.

import "encoding/binary"

// packetKind says what parse found.
type packetKind uint8

const (
	kindFlow      packetKind = iota + 1 // a TCP segment or UDP datagram
	kindICMPError                       // an ICMP(v6) error quoting a TCP/UDP packet
)

// TCP header flag bits (byte 13).
const (
	flagFIN = 0x01
	flagSYN = 0x02
	flagRST = 0x04
	flagPSH = 0x08
	flagACK = 0x10
	flagURG = 0x20
	flagECE = 0x40
	flagCWR = 0x80
)

// validTCPFlags has bit f set for each valid combination f of FIN, SYN, RST,
// ACK and URG: the kernel's tcp_valid_flags table (nf_conntrack_proto_tcp.c),
// which tcp_error consults after clearing PSH, ECE and CWR.
const validTCPFlags uint64 = 1<<(flagSYN) |
	1<<(flagSYN|flagURG) |
	1<<(flagSYN|flagACK) |
	1<<(flagRST) |
	1<<(flagRST|flagACK) |
	1<<(flagFIN|flagACK) |
	1<<(flagFIN|flagACK|flagURG) |
	1<<(flagACK) |
	1<<(flagACK|flagURG)

// segment holds what the state machines need from a packet after the bytes
// are gone: Confirm replays it on the entry it creates or joins.
type segment struct {
	ipLen   uint32 // bytes accounted to the flow: the IP datagram length
	seq     uint32
	ack     uint32
	sack    uint32 // ack, or the highest right edge of the first SACK option
	payload uint32 // TCP payload length
	win     uint16 // raw window field
	flags   uint8  // raw TCP flags byte
	wscale  uint8  // window scale option value, if optWScale
	opts    uint8  // optPresent, optWScale, optSackPerm
	lone    bool   // set by tcpInWindow: Result.LoneSegment
}

// segment.opts bits.
const (
	optPresent  = 1 << iota // the header carries options (data offset > 5)
	optWScale               // a well-formed window scale option was seen
	optSackPerm             // a well-formed SACK-permitted option was seen
)

// parsed is the outcome of parse.
type parsed struct {
	kind packetKind
	// tuple is the packet's own tuple for kindFlow, and the tuple of the
	// quoted packet, as it was sent, for kindICMPError.
	tuple Tuple
	// outerDst is the destination of the ICMP error itself (kindICMPError).
	outerDst [16]byte
	seg      segment
}

// IPv6 next-header values.
const (
	nhHopByHop = 0
	nhTCP      = 6
	nhUDP      = 17
	nhRouting  = 43
	nhFragment = 44
	nhICMPv6   = 58
	nhNone     = 59
	nhDestOpts = 60
	nhICMP     = 1
)

// maxExtHeaders bounds the IPv6 extension header chain we walk. RFC 8200
// section 4.1 recommends each header at most once (Destination Options twice),
// so a longer chain is either broken or hostile.
const maxExtHeaders = 8

// parse parses an IP packet into p. verify asks for the IPv4 header and
// transport checksums to be checked.
func parse(b []byte, verify bool, p *parsed) Reason {
	out := parseOut{t: &p.tuple, s: &p.seg, outerDst: &p.outerDst}
	r := parseInto(b, verify, &out)
	p.kind = out.kind
	return r
}

// parseOut says where parseInto writes: Classify points it into its Result
// so that nothing is copied on the packet path. When parsing fails with an
// Unsupported reason, t.proto holds the protocol that was not supported.
type parseOut struct {
	t        *Tuple
	s        *segment
	outerDst *[16]byte
	kind     packetKind
	// missing counts the packet's bytes past the end of the slice parsed:
	// none, except for Table.ClassifyHead, which parses headers alone and
	// never verifies a checksum. The IP layer sets it to what its payload
	// lacks, for the transport layer's lengths.
	missing int
}

// parseInto parses an IP packet into out.
func parseInto(b []byte, verify bool, out *parseOut) Reason {
	if len(b) == 0 {
		return ReasonTruncated
	}
	switch b[0] >> 4 {
	case 4:
		return parseIPv4(b, verify, out)
	case 6:
		return parseIPv6(b, verify, out)
	}
	return ReasonBadIPHeader
}

// parseIPv4 checks the header as ip_rcv_core does before PREROUTING, then
// hands the payload on.
func parseIPv4(b []byte, verify bool, p *parseOut) Reason {
	if len(b) < 20 {
		return ReasonTruncated
	}
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 {
		return ReasonBadIPHeader
	}
	if len(b) < ihl {
		return ReasonTruncated
	}
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if total < ihl {
		return ReasonBadIPHeader
	}
	if total > len(b)+p.missing {
		return ReasonBadLength
	}
	b = b[:p.present(b, total)] // bytes past the total length are link padding
	if verify && !checksumOK(b[:ihl], 0) {
		return ReasonBadChecksum
	}
	// MF or a non-zero offset: the kernel reassembles (nf_defrag_ipv4) before
	// conntrack sees the packet; we do not, so no fragment has a tuple.
	if binary.BigEndian.Uint16(b[6:8])&0x3fff != 0 {
		return ReasonIPFragment
	}
	t := p.t
	t.family = 4
	copy(t.src[:4], b[12:16])
	copy(t.dst[:4], b[16:20])
	p.s.ipLen = uint32(total)
	l4 := b[ihl:]
	switch b[9] {
	case nhTCP:
		return parseTCP(l4, verify, p)
	case nhUDP:
		return parseUDP(l4, verify, p)
	case nhICMP:
		return parseICMPv4(l4, verify, p)
	}
	t.proto = Protocol(b[9])
	return ReasonUnsupportedProtocol
}

// present returns how many of an IP packet's total bytes the slice b holds,
// and leaves in p.missing how many of them it does not (ClassifyHead).
func (p *parseOut) present(b []byte, total int) int {
	n := min(total, len(b))
	p.missing = total - n
	return n
}

// parseIPv6 checks the fixed header as ipv6_rcv does, walks the extension
// headers we accept, and hands the upper-layer payload on.
func parseIPv6(b []byte, verify bool, p *parseOut) Reason {
	if len(b) < 40 {
		return ReasonTruncated
	}
	total := 40 + int(binary.BigEndian.Uint16(b[4:6]))
	if total > len(b)+p.missing {
		return ReasonBadLength
	}
	b = b[:p.present(b, total)]
	nh, off, r := skipIPv6Ext(b, b[6], 40, false)
	if r != ReasonNone {
		if r == ReasonUnsupportedProtocol {
			p.t.proto = Protocol(nh)
		}
		return r
	}
	t := p.t
	t.family = 6
	copy(t.src[:], b[8:24])
	copy(t.dst[:], b[24:40])
	p.s.ipLen = uint32(total)
	l4 := b[off:]
	switch nh {
	case nhTCP:
		return parseTCP(l4, verify, p)
	case nhUDP:
		return parseUDP(l4, verify, p)
	case nhICMPv6:
		return parseICMPv6(l4, verify, p)
	}
	t.proto = Protocol(nh)
	return ReasonUnsupportedProtocol
}

// skipIPv6Ext walks the extension header chain of the IPv6 packet b, starting
// with next header nh at offset off, and returns the upper-layer protocol and
// its offset. Hop-by-Hop (first only), Destination Options and Routing headers
// with no segments left are skipped; their options are not interpreted.
//
// With quoted set (the packet inside an ICMPv6 error) it is lenient the way
// the kernel's ipv6_skip_exthdr is: a Fragment header with offset zero is
// skipped too, since the ports follow it, and Routing headers are skipped
// whatever their segments left.
func skipIPv6Ext(b []byte, nh uint8, off int, quoted bool) (uint8, int, Reason) {
	for n := 0; ; n++ {
		switch nh {
		case nhTCP, nhUDP, nhICMPv6:
			return nh, off, ReasonNone
		case nhHopByHop, nhDestOpts, nhRouting, nhFragment:
		case nhNone:
			return nh, off, ReasonUnsupportedProtocol
		case 50, 51, 135, 139, 140, 253, 254: // ESP, AH, Mobility, HIP, Shim6, experiments
			return nh, off, ReasonIPv6ExtensionHeader
		default:
			return nh, off, ReasonUnsupportedProtocol
		}
		if n == maxExtHeaders {
			return nh, off, ReasonIPv6ExtensionHeader
		}
		if len(b)-off < 8 {
			return nh, off, ReasonTruncated
		}
		h := b[off:]
		size := (int(h[1]) + 1) * 8
		switch nh {
		case nhHopByHop:
			if off != 40 && !quoted { // RFC 8200 section 4.3: only right after the fixed header
				return nh, off, ReasonIPv6ExtensionHeader
			}
		case nhRouting:
			// With segments left the destination field is not the final
			// destination, so neither the tuple nor the checksum would be
			// right.
			if h[3] != 0 && !quoted {
				return nh, off, ReasonIPv6ExtensionHeader
			}
		case nhFragment:
			if !quoted || binary.BigEndian.Uint16(h[2:4])&0xfff8 != 0 {
				return nh, off, ReasonIPFragment
			}
			size = 8
		}
		if len(b)-off < size {
			return nh, off, ReasonTruncated
		}
		nh = h[0]
		off += size
	}
}

// parseTCP checks a TCP header as the kernel's tcp_error does (length and data
// offset, checksum, flag combination) and extracts what tcp_in_window needs.
func parseTCP(b []byte, verify bool, p *parseOut) Reason {
	if len(b) < 20 {
		return ReasonTruncated
	}
	doff := int(b[12]>>4) * 4
	if doff < 20 || doff > len(b)+p.missing {
		return ReasonBadDataOffset
	}
	if doff > len(b) {
		return ReasonTruncated // options past the head ClassifyHead was given
	}
	t := p.t
	if verify && !checksumOK(b, pseudoSum(t.family, &t.src, &t.dst, len(b), nhTCP)) {
		return ReasonBadChecksum
	}
	flags := b[13]
	if validTCPFlags>>(flags&^(flagPSH|flagECE|flagCWR))&1 == 0 {
		return ReasonBadTCPFlags
	}
	t.proto = TCP
	t.srcPort = binary.BigEndian.Uint16(b[0:2])
	t.dstPort = binary.BigEndian.Uint16(b[2:4])
	s := p.s
	s.seq = binary.BigEndian.Uint32(b[4:8])
	s.ack = binary.BigEndian.Uint32(b[8:12])
	s.sack = s.ack
	s.win = binary.BigEndian.Uint16(b[14:16])
	s.flags = flags
	s.payload = uint32(len(b) + p.missing - doff)
	if doff > 20 {
		tcpOptions(b[20:doff], s)
	}
	p.kind = kindFlow
	return ReasonNone
}

// tcpOptions scans TCP options once for what the kernel's tcp_options (window
// scale, SACK permitted) and tcp_sack (highest SACK right edge, from the first
// well-formed SACK option only) look at, stopping where both of them stop: at
// End of Options, at a kind without room for its length byte, and at a length
// below 2 or past the end.
func tcpOptions(o []byte, s *segment) {
	s.opts |= optPresent
	if len(o) == 12 && binary.BigEndian.Uint32(o) == 0x0101080a {
		return // NOP, NOP, timestamps: the common case, nothing for us
	}
	sawSack := false
	for i := 0; i < len(o); {
		kind := o[i]
		if kind == 0 { // End of Option List
			return
		}
		if kind == 1 { // No-Operation
			i++
			continue
		}
		if len(o)-i < 2 {
			return
		}
		size := int(o[i+1])
		if size < 2 || size > len(o)-i {
			return
		}
		switch {
		case kind == 3 && size == 3: // window scale, RFC 7323
			s.opts |= optWScale
			s.wscale = o[i+2]
		case kind == 4 && size == 2: // SACK permitted, RFC 2018
			s.opts |= optSackPerm
		case kind == 5 && size >= 10 && (size-2)%8 == 0 && !sawSack: // SACK blocks
			sawSack = true
			for j := i + 2; j < i+size; j += 8 {
				if right := binary.BigEndian.Uint32(o[j+4 : j+8]); seqAfter(right, s.sack) {
					s.sack = right
				}
			}
		}
		i += size
	}
}

// parseUDP checks a UDP header as the kernel's udp_error does.
//
// Deviations, both deliberate: the checksum covers the UDP length, as the
// receiving stack computes it (the kernel's conntrack checksums the whole IP
// payload, which differs only when the UDP length is short of it); and a zero
// checksum over IPv6 is invalid (RFC 8200 section 8.1: the receiver discards
// it), where conntrack would pass it for the stack to drop.
func parseUDP(b []byte, verify bool, p *parseOut) Reason {
	if len(b) < 8 {
		return ReasonTruncated
	}
	ulen := int(binary.BigEndian.Uint16(b[4:6]))
	if ulen < 8 || ulen > len(b)+p.missing {
		return ReasonBadLength
	}
	t := p.t
	if verify {
		switch {
		case binary.BigEndian.Uint16(b[6:8]) == 0:
			if t.family == 6 {
				return ReasonBadChecksum
			}
		case !checksumOK(b[:ulen], pseudoSum(t.family, &t.src, &t.dst, ulen, nhUDP)):
			return ReasonBadChecksum
		}
	}
	t.proto = UDP
	t.srcPort = binary.BigEndian.Uint16(b[0:2])
	t.dstPort = binary.BigEndian.Uint16(b[2:4])
	p.kind = kindFlow
	return ReasonNone
}

// parseICMPv4 follows nf_conntrack_icmpv4_error: header length, checksum, type
// range, and only errors go on to the quoted packet. Of the other types, the
// requests that icmp_packet lets start a flow (its valid_new) are
// unsupported; the rest could only join an existing ICMP flow, and we track
// none.
func parseICMPv4(b []byte, verify bool, p *parseOut) Reason {
	if len(b) < 8 {
		return ReasonTruncated
	}
	if verify && !checksumOK(b, 0) {
		return ReasonBadChecksum
	}
	switch b[0] {
	case 3, 4, 5, 11, 12: // unreachable, source quench, redirect, time exceeded, parameter problem
		return parseQuoted(b[8:], p)
	case 8, 13, 15, 17: // echo, timestamp, information and address mask requests
		p.t.proto = ICMP
		return ReasonUnsupportedICMP
	}
	return ReasonICMPNoFlow // replies, other types, and types above 18
}

// parseICMPv6 follows nf_conntrack_icmpv6_error: every type below 128 is an
// error (RFC 4443 section 2.1). Neighbour discovery and multicast listener
// messages are left untracked there (noct_valid_new), and echo and node
// information queries may start a flow (valid_new in
// nf_conntrack_icmpv6_packet): those are unsupported; any other type could
// only join an existing ICMPv6 flow.
func parseICMPv6(b []byte, verify bool, p *parseOut) Reason {
	if len(b) < 8 {
		return ReasonTruncated
	}
	t := p.t
	if verify && !checksumOK(b, pseudoSum(6, &t.src, &t.dst, len(b), nhICMPv6)) {
		return ReasonBadChecksum
	}
	switch {
	case b[0] < 128:
		return parseQuoted(b[8:], p)
	case b[0] == 128, b[0] == 139, // echo request, node information query
		b[0] >= 130 && b[0] <= 136, b[0] == 143: // MLD, router/neighbour discovery, MLDv2 report
		t.proto = ICMPv6
		return ReasonUnsupportedICMP
	}
	return ReasonICMPNoFlow
}

// parseQuoted parses the packet quoted by an ICMP error as leniently as the
// kernel's nf_ct_get_tuplepr: only the IP header and the first four bytes of
// the transport header (the ports) must be present; its lengths and checksums
// are not checked, since the quote is usually cut short. The outer tuple's
// family and destination are kept for the caller's checks.
func parseQuoted(b []byte, p *parseOut) Reason {
	t := p.t
	*p.outerDst = t.dst
	family := t.family
	*t = Tuple{family: family}
	var proto uint8
	var l4 []byte
	switch family {
	case 4:
		if len(b) < 20 || b[0]>>4 != 4 {
			return ReasonICMPBadInner
		}
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || binary.BigEndian.Uint16(b[6:8])&0x1fff != 0 {
			return ReasonICMPBadInner
		}
		copy(t.src[:4], b[12:16])
		copy(t.dst[:4], b[16:20])
		proto = b[9]
		if len(b) >= ihl {
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 || b[0]>>4 != 6 {
			return ReasonICMPBadInner
		}
		nh, off, r := skipIPv6Ext(b, b[6], 40, true)
		if r != ReasonNone {
			return ReasonICMPBadInner
		}
		copy(t.src[:], b[8:24])
		copy(t.dst[:], b[24:40])
		proto = nh
		l4 = b[off:]
	}
	if proto != nhTCP && proto != nhUDP {
		return ReasonICMPUnrelated // we track no flow of that protocol
	}
	if len(l4) < 4 {
		return ReasonICMPBadInner
	}
	t.proto = Protocol(proto)
	t.srcPort = binary.BigEndian.Uint16(l4[0:2])
	t.dstPort = binary.BigEndian.Uint16(l4[2:4])
	p.kind = kindICMPError
	return ReasonNone
}

// seqAfter reports whether sequence number a is after b (RFC 793 modular
// comparison; the kernel's after()).
func seqAfter(a, b uint32) bool { return int32(b-a) < 0 }

// seqBefore reports whether a is before b (the kernel's before()).
func seqBefore(a, b uint32) bool { return int32(a-b) < 0 }

package translate

// Segments: what the flow reads of a client's TCP segment (Parse), and how
// it writes its own, whole IP packets from the service to the client, for
// IPv4 and for IPv6 without extension headers (Writer).

import (
	"encoding/binary"
	"net/netip"
)

// TCP header flags (RFC 9293 3.1).
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpPSH = 0x08
	tcpACK = 0x10
)

// TCP option kinds (RFC 9293 3.2, RFC 7323, RFC 2018).
const (
	optEOL       = 0
	optNOP       = 1
	optMSS       = 2
	optWS        = 3
	optSACKOK    = 4
	optSACK      = 5
	optTS        = 8
	maxWndScale  = 14 // RFC 7323 2.3
	tcpHeaderMin = 20
	tcpOptionMax = 40
	ipv4Header   = 20
	ipv6Header   = 40
	// ttl is the TTL and hop limit of the packets written: gVisor's
	// default (ipv4.DefaultTTL, ipv6.DefaultTTL), as the proxy's other
	// replies carry.
	ttl = 64
)

// Segment is a client's TCP segment as the flow reads it: Parse's.
type Segment struct {
	seq, ack uint32
	flags    byte
	wnd      uint16 // as sent: the flow scales it
	payload  []byte // a slice of the packet

	// Options. mss is 0 and ws -1 when absent; both only count on a SYN.
	mss          uint16
	ws           int
	sackOK       bool
	ts           bool
	tsVal, tsEcr uint32
	// The SACK option's blocks (RFC 2018 3), nSack of them.
	sack  [4]seqRange
	nSack int
}

// seqRange is the sequence numbers [start, end).
type seqRange struct{ start, end uint32 }

// Seq returns the segment's sequence number.
func (s *Segment) Seq() uint32 { return s.seq }

// Flags returns the segment's flags byte.
func (s *Segment) Flags() byte { return s.flags }

// IsSYN reports whether the segment is a SYN that opens a connection:
// SYN set, ACK, RST and FIN not.
func (s *Segment) IsSYN() bool { return s.flags&(tcpSYN|tcpACK|tcpRST|tcpFIN) == tcpSYN }

// Parse reads b, a TCP segment (header and payload, nothing past it) whose
// length the caller's IP header vouches for. It reports false for what is
// not a segment it can read: a data offset out of bounds. Options that are
// malformed are read as far as they are whole.
func Parse(b []byte) (Segment, bool) {
	if len(b) < tcpHeaderMin {
		return Segment{}, false
	}
	hl := int(b[12]>>4) * 4
	if hl < tcpHeaderMin || hl > len(b) {
		return Segment{}, false
	}
	s := Segment{
		seq: binary.BigEndian.Uint32(b[4:]), ack: binary.BigEndian.Uint32(b[8:]), flags: b[13],
		wnd: binary.BigEndian.Uint16(b[14:]), payload: b[hl:], ws: -1,
	}
	opts := b[tcpHeaderMin:hl]
	for i := 0; i < len(opts); {
		kind := opts[i]
		if kind == optEOL {
			break
		}
		if kind == optNOP {
			i++
			continue
		}
		if i+1 >= len(opts) {
			break
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			break // malformed: the options read so far stand
		}
		v := opts[i+2 : i+l]
		switch {
		case kind == optMSS && l == 4:
			s.mss = binary.BigEndian.Uint16(v)
		case kind == optWS && l == 3:
			s.ws = int(min(v[0], maxWndScale)) // RFC 7323 2.3: a larger shift is taken as 14
		case kind == optSACKOK && l == 2:
			s.sackOK = true
		case kind == optTS && l == 10:
			s.ts, s.tsVal, s.tsEcr = true, binary.BigEndian.Uint32(v), binary.BigEndian.Uint32(v[4:])
		case kind == optSACK && (l-2)%8 == 0 && l > 2:
			s.nSack = 0
			for b := v; len(b) >= 8 && s.nSack < len(s.sack); b = b[8:] {
				s.sack[s.nSack] = seqRange{binary.BigEndian.Uint32(b), binary.BigEndian.Uint32(b[4:])}
				s.nSack++
			}
		}
		i += l
	}
	return s, true
}

// Writer writes a flow's segments, from src to dst: the service's address
// and port to the client's.
type Writer struct {
	v6       bool
	src, dst netip.AddrPort
	pseudo   uint32 // the pseudo-header's sum, its length left out
}

// NewWriter returns the Writer of segments from src to dst, both IPv4 or
// both IPv6.
func NewWriter(src, dst netip.AddrPort) Writer {
	w := Writer{v6: src.Addr().Is6() && !src.Addr().Is4In6(), src: src, dst: dst}
	a, b := src.Addr().Unmap().AsSlice(), dst.Addr().Unmap().AsSlice()
	w.pseudo = sum(sum(sum(0, a), b), []byte{0, 6})
	return w
}

// IPLen is the length of the IP header the flow's segments carry.
func (w *Writer) IPLen() int {
	if w.v6 {
		return ipv6Header
	}
	return ipv4Header
}

// Build writes into p, which must hold IPLen()+20+len(opts)+len(payload)
// bytes, the segment with these fields, and returns its length. opts must
// be a multiple of 4 bytes long.
func (w *Writer) Build(p []byte, seq, ack uint32, flags byte, wnd uint16, opts, payload []byte) int {
	n := copy(p[w.IPLen()+tcpHeaderMin+len(opts):], payload)
	return w.buildAround(p, seq, ack, flags, wnd, opts, n, false)
}

// buildAround is Build for a payload of n bytes already in place, after
// the headers' room in p. partial leaves the TCP checksum for the kernel to
// complete: the field holds the pseudo-header's sum (Linux's
// CHECKSUM_PARTIAL), and the payload is not read.
func (w *Writer) buildAround(p []byte, seq, ack uint32, flags byte, wnd uint16, opts []byte, n int, partial bool) int {
	hl := tcpHeaderMin + len(opts)
	tcpLen := hl + n
	il := w.IPLen()
	total := il + tcpLen
	p = p[:total]
	w.putIP(p, tcpLen)
	t := p[il:]
	binary.BigEndian.PutUint16(t[0:], w.src.Port())
	binary.BigEndian.PutUint16(t[2:], w.dst.Port())
	binary.BigEndian.PutUint32(t[4:], seq)
	binary.BigEndian.PutUint32(t[8:], ack)
	t[12] = byte(hl/4) << 4
	t[13] = flags
	binary.BigEndian.PutUint16(t[14:], wnd)
	t[16], t[17], t[18], t[19] = 0, 0, 0, 0 // checksum, urgent pointer
	copy(t[tcpHeaderMin:], opts)
	ps := w.pseudo + uint32(tcpLen)
	if partial {
		binary.BigEndian.PutUint16(t[16:], fold(ps))
	} else {
		binary.BigEndian.PutUint16(t[16:], ^fold(sum(ps, t)))
	}
	return total
}

// putIP writes the IP header of a segment of tcpLen bytes at p's start.
func (w *Writer) putIP(p []byte, tcpLen int) {
	if w.v6 {
		p[0], p[1], p[2], p[3] = 0x60, 0, 0, 0
		binary.BigEndian.PutUint16(p[4:], uint16(tcpLen))
		p[6], p[7] = 6, ttl
		a, b := w.src.Addr().As16(), w.dst.Addr().As16()
		copy(p[8:24], a[:])
		copy(p[24:40], b[:])
		return
	}
	p[0], p[1] = 0x45, 0
	binary.BigEndian.PutUint16(p[2:], uint16(ipv4Header+tcpLen))
	p[4], p[5] = 0, 0    // identification
	p[6], p[7] = 0x40, 0 // don't fragment
	p[8], p[9] = ttl, 6  // TTL, TCP
	p[10], p[11] = 0, 0  // checksum
	a, b := w.src.Addr().As4(), w.dst.Addr().As4()
	copy(p[12:16], a[:])
	copy(p[16:20], b[:])
	binary.BigEndian.PutUint16(p[10:], ^fold(sum(0, p[:ipv4Header])))
}

// sum adds b to the ones' complement sum s (RFC 1071), as 16-bit words,
// an odd last byte padded with zero; fold finishes it.
func sum(s uint32, b []byte) uint32 {
	acc := uint64(s)
	for len(b) >= 8 {
		v := binary.BigEndian.Uint64(b)
		acc += v>>48 + v>>32&0xffff + v>>16&0xffff + v&0xffff
		b = b[8:]
	}
	for len(b) >= 2 {
		acc += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint64(b[0]) << 8
	}
	for acc>>32 != 0 {
		acc = acc&0xffffffff + acc>>32
	}
	return uint32(acc)
}

// fold folds a 32-bit ones' complement sum to 16 bits.
func fold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// tsOption is the timestamps option, aligned by two NOPs, as every
// segment of a flow that agreed on timestamps carries it (RFC 7323 3.2).
func tsOption(b []byte, val, ecr uint32) []byte {
	b = append(b, optNOP, optNOP, optTS, 10)
	b = binary.BigEndian.AppendUint32(b, val)
	return binary.BigEndian.AppendUint32(b, ecr)
}

// sackOption is the SACK option of blocks (RFC 2018 3), aligned by two
// NOPs.
func sackOption(b []byte, blocks []seqRange) []byte {
	b = append(b, optNOP, optNOP, optSACK, byte(2+8*len(blocks)))
	for _, r := range blocks {
		b = binary.BigEndian.AppendUint32(b, r.start)
		b = binary.BigEndian.AppendUint32(b, r.end)
	}
	return b
}

// synAckOptions are the options of the flow's SYN-ACK to syn: its MSS,
// and window scaling, SACK and timestamps when the client offered them
// (RFC 7323 1.3, 3.2, RFC 2018 2: only then).
func synAckOptions(b []byte, syn Segment, mss uint16, ws uint8, tsVal uint32) []byte {
	b = append(b, optMSS, 4)
	b = binary.BigEndian.AppendUint16(b, mss)
	if syn.ws >= 0 {
		b = append(b, optNOP, optWS, 3, ws)
	}
	if syn.sackOK {
		b = append(b, optNOP, optNOP, optSACKOK, 2)
	}
	if syn.ts {
		b = tsOption(b, tsVal, syn.tsVal)
	}
	return b
}

package netstack

// The translator's segments: what it reads of a client's TCP segment, and
// how it writes its own, for IPv4 and for IPv6 without extension headers
// (the packets tcpOffset accepts). The translator answers for the service
// address, so every segment it writes goes from the service to the client.

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// clientSeg is a client segment as the translator reads it.
type clientSeg struct {
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

// parseClientSeg reads b, a whole IP packet whose lengths conntrack has
// checked. It reports false for what is not a TCP segment it can read.
func parseClientSeg(b []byte) (clientSeg, bool) {
	off, ok := tcpOffset(b)
	if !ok {
		return clientSeg{}, false
	}
	end := len(b)
	if b[0]>>4 == 4 {
		end = min(end, int(binary.BigEndian.Uint16(b[2:])))
	} else {
		end = min(end, header.IPv6MinimumSize+int(binary.BigEndian.Uint16(b[4:])))
	}
	t := header.TCP(b[off:end])
	hl := int(t.DataOffset())
	if hl < header.TCPMinimumSize || hl > len(t) {
		return clientSeg{}, false
	}
	s := clientSeg{
		seq: t.SequenceNumber(), ack: t.AckNumber(), flags: b[off+13], wnd: t.WindowSize(),
		payload: t[hl:], ws: -1,
	}
	opts := t[header.TCPMinimumSize:hl]
	for i := 0; i < len(opts); {
		kind := opts[i]
		if kind == header.TCPOptionEOL {
			break
		}
		if kind == header.TCPOptionNOP {
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
		case kind == header.TCPOptionMSS && l == 4:
			s.mss = binary.BigEndian.Uint16(v)
		case kind == header.TCPOptionWS && l == 3:
			s.ws = int(min(v[0], header.MaxWndScale)) // RFC 7323 2.3: a larger shift is taken as 14
		case kind == header.TCPOptionSACKPermitted && l == 2:
			s.sackOK = true
		case kind == header.TCPOptionTS && l == 10:
			s.ts, s.tsVal, s.tsEcr = true, binary.BigEndian.Uint32(v), binary.BigEndian.Uint32(v[4:])
		case kind == header.TCPOptionSACK && (l-2)%8 == 0 && l > 2:
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

// segWriter writes a flow's segments: the service's address and port to
// the client's.
type segWriter struct {
	v6           bool
	src, dst     tcpip.Address
	sport, dport uint16
}

// ipLen is the length of the IP header the flow's segments carry.
func (w *segWriter) ipLen() int {
	if w.v6 {
		return header.IPv6MinimumSize
	}
	return header.IPv4MinimumSize
}

// build writes into p, which must hold ipLen()+20+len(opts)+len(payload)
// bytes, the segment with these fields, and returns its length. opts must
// be a multiple of 4 bytes long.
func (w *segWriter) build(p []byte, seq, ack uint32, flags byte, wnd uint16, opts, payload []byte) int {
	n := copy(p[w.ipLen()+header.TCPMinimumSize+len(opts):], payload)
	return w.buildAround(p, seq, ack, flags, wnd, opts, n, false)
}

// buildAround is build for a payload of n bytes already in place, after
// the headers' room in p. partial leaves the TCP checksum for the kernel to
// complete: the field holds the pseudo-header's sum (Linux's
// CHECKSUM_PARTIAL, as gVisor's TCP leaves it under host GSO), and the
// payload is not read.
func (w *segWriter) buildAround(p []byte, seq, ack uint32, flags byte, wnd uint16, opts []byte, n int, partial bool) int {
	hl := header.TCPMinimumSize + len(opts)
	tcpLen := hl + n
	il := w.ipLen()
	total := il + tcpLen
	p = p[:total]
	putIPHeader(p, w.src, w.dst, header.TCPProtocolNumber, tcpLen)
	t := header.TCP(p[il:])
	t.Encode(&header.TCPFields{
		SrcPort:    w.sport,
		DstPort:    w.dport,
		SeqNum:     seq,
		AckNum:     ack,
		DataOffset: uint8(hl),
		Flags:      header.TCPFlags(flags),
		WindowSize: wnd,
	})
	copy(t[header.TCPMinimumSize:], opts)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, w.src, w.dst, uint16(tcpLen))
	if partial {
		t.SetChecksum(xsum)
	} else {
		t.SetChecksum(^checksum.Checksum(t, xsum))
	}
	return total
}

// tsOption is the timestamps option, aligned by two NOPs, as every
// segment of a flow that agreed on timestamps carries it (RFC 7323 3.2).
func tsOption(b []byte, val, ecr uint32) []byte {
	b = append(b, header.TCPOptionNOP, header.TCPOptionNOP, header.TCPOptionTS, 10)
	b = binary.BigEndian.AppendUint32(b, val)
	return binary.BigEndian.AppendUint32(b, ecr)
}

// sackOption is the SACK option of blocks (RFC 2018 3), aligned by two
// NOPs.
func sackOption(b []byte, blocks []seqRange) []byte {
	b = append(b, header.TCPOptionNOP, header.TCPOptionNOP, header.TCPOptionSACK, byte(2+8*len(blocks)))
	for _, r := range blocks {
		b = binary.BigEndian.AppendUint32(b, r.start)
		b = binary.BigEndian.AppendUint32(b, r.end)
	}
	return b
}

// synAckOptions are the options of the translator's SYN-ACK to syn: its
// MSS, and window scaling, SACK and timestamps when the client offered
// them (RFC 7323 1.3, 3.2, RFC 2018 2: only then).
func synAckOptions(b []byte, syn clientSeg, mss uint16, ws uint8, tsVal uint32) []byte {
	b = append(b, header.TCPOptionMSS, 4)
	b = binary.BigEndian.AppendUint16(b, mss)
	if syn.ws >= 0 {
		b = append(b, header.TCPOptionNOP, header.TCPOptionWS, 3, ws)
	}
	if syn.sackOK {
		b = append(b, header.TCPOptionNOP, header.TCPOptionNOP, header.TCPOptionSACKPermitted, 2)
	}
	if syn.ts {
		b = tsOption(b, tsVal, syn.tsVal)
	}
	return b
}

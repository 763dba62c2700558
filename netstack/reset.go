package netstack

// Resets after the entry: when a TCP flow is ended from outside after its
// conntrack entry left the table (a flush, an expiry), the RST gVisor writes
// to the client finds no entry, and the gate would drop it as a Reply without
// an entry — the client would hang until its own timeout. So:
//
//  1. TCPConn.Abort marks the flow's tuple as resetting for resetHold when
//     its entry is gone already, then closes the endpoint with SO_LINGER 0
//     (gVisor writes the RST inside Close, synchronously). A flow whose
//     entry is live is not marked: its RST is classified as usual, and the
//     gates need not look at every TCP packet while flows reset each other
//     by the thousand.
//  2. While a flow is marked and has no entry, the gate lets its RSTs out
//     to the client, and lets the client's non-SYN segments in to gVisor.
//     The second half matters when segments were dropped after the entry
//     went (the expiry was met by one of them): the RST's sequence number
//     is then ahead of what the client received, the client answers it
//     with a challenge ACK (RFC 5961), and gVisor, which no longer has the
//     connection, answers that ACK with a RST at exactly the sequence
//     number the client expects, as a closed port does.
//  3. A marked flow that has an entry again (a new connection from the same
//     port) is classified as usual. The RSTs let out are counted as
//     ResetsAfterEntry, the client's segments let in as SegmentsAfterEntry.

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/userproxy/userproxy/conntrack"
)

// resetHold is how long a flow stays marked after its RST: long enough for
// a client's challenge ACK to come back.
const resetHold = 2 * time.Second

// resetting is the set of flows being reset, shared by a Stack's gates.
type resetting struct {
	ct    *conntrack.Table
	n     atomic.Int64 // marked flows: the gates look only when > 0
	flows sync.Map     // conntrack.Tuple -> *resetMark
}

type resetMark struct{}

// mark marks t for resetHold if its entry is gone (step 1).
func (r *resetting) mark(t conntrack.Tuple) {
	if _, live := r.ct.Get(t); live {
		return
	}
	m := &resetMark{}
	if old, loaded := r.flows.Swap(t, m); !loaded || old == nil {
		r.n.Add(1)
	}
	time.AfterFunc(resetHold, func() {
		if r.flows.CompareAndDelete(t, m) {
			r.n.Add(-1)
		}
	})
}

// passOut reports whether b, a packet the stack writes, is the RST of a
// marked flow without an entry (step 2), and returns the flow's tuple when
// it is.
func (r *resetting) passOut(b []byte) (conntrack.Tuple, bool) {
	if r.n.Load() == 0 {
		return conntrack.Tuple{}, false
	}
	t, flags, ok := tcpSegment(b, conntrack.Reply)
	return t, ok && flags&tcpRST != 0 && r.ended(t)
}

// passIn reports whether b, a packet from the client, is a non-SYN segment
// of a marked flow without an entry (step 2).
func (r *resetting) passIn(b []byte) bool {
	if r.n.Load() == 0 {
		return false
	}
	t, flags, ok := tcpSegment(b, conntrack.Original)
	return ok && flags&tcpSYN == 0 && r.ended(t)
}

// ended reports whether t is marked and has no live entry (step 3).
func (r *resetting) ended(t conntrack.Tuple) bool {
	if _, marked := r.flows.Load(t); !marked {
		return false
	}
	_, live := r.ct.Get(t)
	return !live
}

// TCP flags, as tcpSegment and readTCPSeg (ackhold.go) report them.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10
)

// tcpOffset returns where the TCP header of b starts when b is a TCP
// segment in IPv4 or in IPv6 without extension headers, with room for the
// header's fixed part.
func tcpOffset(b []byte) (int, bool) {
	var off int
	switch {
	case len(b) >= 20 && b[0]>>4 == 4 && b[9] == 6:
		off = int(b[0]&0x0f) * 4
	case len(b) >= 40 && b[0]>>4 == 6 && b[6] == 6:
		off = 40
	default:
		return 0, false
	}
	return off, off >= 20 && len(b) >= off+20
}

// tcpSegment returns the Original-direction tuple (client -> service) and
// the flags of b when b is a TCP segment (tcpOffset), travelling in
// direction dir.
func tcpSegment(b []byte, dir conntrack.Direction) (conntrack.Tuple, byte, bool) {
	off, ok := tcpOffset(b)
	if !ok {
		return conntrack.Tuple{}, 0, false
	}
	var src, dst netip.Addr
	if b[0]>>4 == 4 {
		src, dst = netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
	} else {
		src, dst = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
	}
	from := netip.AddrPortFrom(src, binary.BigEndian.Uint16(b[off:]))
	to := netip.AddrPortFrom(dst, binary.BigEndian.Uint16(b[off+2:]))
	if dir == conntrack.Reply {
		from, to = to, from
	}
	return conntrack.MakeTuple(conntrack.TCP, from, to), b[off+13], true
}

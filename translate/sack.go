package translate

// Selective acknowledgments both ways (RFC 2018), when the client offered
// SACK in its SYN:
//
//  1. Receive: the client's segments past a gap are kept, a copy each,
//     bounded per flow (keptSegs, keptBytes) and over all flows
//     (KeptTotal), so that a reordering or a loss on the way in (a veth,
//     the TUN's queue) costs the client no more than the missing segments:
//     our ACKs name what is kept in SACK blocks, and the client resends
//     only the holes. The kept segments are written once the gap fills.
//  2. Send: the client's SACK blocks mark what it holds past sndUna (the
//     scoreboard, and the sent log's records, sentlog.go). RACK (rack.go)
//     declares the losses; a rewind after a timeout skips what is SACKed.

import "sync/atomic"

// Kept segments' bounds: per flow in count and bytes, and over every
// flow of a stack in bytes (a budget the flows share; 10,000 flows with
// their windows full of reordered data would otherwise keep gigabytes).
const (
	keptSegs  = 1024
	keptBytes = 4 << 20
	KeptTotal = 64 << 20
)

type keptSeg struct {
	seq uint32
	b   []byte
}

// keptQueue is a flow's segments past a gap, sorted by sequence number.
type keptQueue struct {
	segs  []keptSeg
	bytes int
	// budget is the stack's kept bytes left, shared by its flows; nil:
	// only the flow's own bounds.
	budget *atomic.Int64
	last   uint32 // the sequence number of the segment kept last (RFC 2018 4: the first block names it)
}

// keep keeps a copy of payload at seq, within the bounds; edge is the
// right edge of the window offered. It reports whether payload was a
// duplicate: inside one segment kept already.
func (q *keptQueue) keep(seq uint32, payload []byte, edge uint32) (dup bool) {
	end := seq + uint32(len(payload))
	if len(payload) == 0 {
		return false
	}
	i := 0
	for i < len(q.segs) && int32(q.segs[i].seq-seq) < 0 {
		i++
	}
	for _, j := range []int{i - 1, i} {
		if j >= 0 && j < len(q.segs) && int32(seq-q.segs[j].seq) >= 0 && int32(q.segs[j].seq+uint32(len(q.segs[j].b))-end) >= 0 {
			q.last = seq
			return true // a copy of one kept
		}
	}
	if len(q.segs) == keptSegs || q.bytes+len(payload) > keptBytes || int32(end-edge) > 0 {
		return false
	}
	if q.budget != nil && q.budget.Add(-int64(len(payload))) < 0 {
		q.budget.Add(int64(len(payload)))
		return false
	}
	b := append([]byte(nil), payload...) // its own size: a kept byte costs a byte
	q.segs = append(q.segs, keptSeg{})
	copy(q.segs[i+1:], q.segs[i:])
	q.segs[i] = keptSeg{seq: seq, b: b}
	q.bytes += len(b)
	q.last = seq
	return false
}

// next returns the first kept segment if it starts at or before rcvNxt,
// taking it out of the queue.
func (q *keptQueue) next(rcvNxt uint32) (keptSeg, bool) {
	if len(q.segs) == 0 || int32(rcvNxt-q.segs[0].seq) < 0 {
		return keptSeg{}, false
	}
	k := q.segs[0]
	q.segs[0] = keptSeg{}
	q.segs = q.segs[1:]
	q.release(len(k.b))
	if len(q.segs) == 0 {
		q.segs = nil
	}
	return k, true
}

func (q *keptQueue) release(n int) {
	q.bytes -= n
	if q.budget != nil {
		q.budget.Add(int64(n))
	}
}

// drop forgets every kept segment.
func (q *keptQueue) drop() {
	q.release(q.bytes)
	q.segs, q.bytes = nil, 0
}

func (q *keptQueue) len() int { return len(q.segs) }

// blocks appends to b the SACK blocks of what is kept (RFC 2018 4): the
// range holding the segment kept last first, then the others from the
// highest down, up to n.
func (q *keptQueue) blocks(b []seqRange, n int) []seqRange {
	var ranges [sackMaxBlocks * 2]seqRange
	all := ranges[:0]
	// Merged ranges from the top: the highest matter most to a sender
	// that resends from the bottom.
	for i := len(q.segs) - 1; i >= 0 && len(all) < cap(ranges); i-- {
		s := q.segs[i]
		r := seqRange{s.seq, s.seq + uint32(len(s.b))}
		if k := len(all) - 1; k >= 0 && int32(all[k].start-r.end) <= 0 {
			if int32(r.start-all[k].start) < 0 {
				all[k].start = r.start
			}
			continue
		}
		all = append(all, r)
	}
	first := -1
	for i, r := range all {
		if int32(q.last-r.start) >= 0 && int32(q.last-r.end) < 0 {
			first = i
			b = append(b, r)
			break
		}
	}
	for i, r := range all {
		if len(b) >= n {
			break
		}
		if i != first {
			b = append(b, r)
		}
	}
	return b
}

// sackMaxBlocks is how many SACK blocks fit the options with timestamps
// (RFC 2018 3: 3; 4 without).
const sackMaxBlocks = 4

// scoreboard holds what the client SACKed past sndUna: disjoint ranges in
// order, at most scoreRanges of them (the highest are let go first; a
// range forgotten is only sent again).
type scoreboard struct {
	r []seqRange
}

const scoreRanges = 32

// add records a SACK block, within (una, max].
func (sb *scoreboard) add(r seqRange, una, max uint32) {
	if int32(r.end-r.start) <= 0 || int32(r.start-una) < 0 || int32(r.end-max) > 0 {
		return // empty, below the cumulative ACK (a D-SACK) or beyond what was sent: ignored
	}
	i := 0
	for i < len(sb.r) && int32(sb.r[i].end-r.start) < 0 {
		i++
	}
	j := i
	for j < len(sb.r) && int32(sb.r[j].start-r.end) <= 0 {
		if int32(sb.r[j].start-r.start) < 0 {
			r.start = sb.r[j].start
		}
		if int32(sb.r[j].end-r.end) > 0 {
			r.end = sb.r[j].end
		}
		j++
	}
	sb.r = append(sb.r[:i], append([]seqRange{r}, sb.r[j:]...)...)
	if len(sb.r) > scoreRanges {
		sb.r = sb.r[:scoreRanges]
	}
}

// ackedTo forgets what the cumulative ACK una covers.
func (sb *scoreboard) ackedTo(una uint32) {
	k := 0
	for _, r := range sb.r {
		if int32(r.end-una) <= 0 {
			continue
		}
		if int32(r.start-una) < 0 {
			r.start = una
		}
		sb.r[k] = r
		k++
	}
	sb.r = sb.r[:k]
}

func (sb *scoreboard) clear() { sb.r = sb.r[:0] }

// sacked is how many bytes below end are SACKed.
func (sb *scoreboard) sacked(end uint32) int {
	n := 0
	for _, r := range sb.r {
		if int32(r.start-end) >= 0 {
			break
		}
		if int32(r.end-end) > 0 {
			r.end = end
		}
		n += int(r.end - r.start)
	}
	return n
}

// skip returns where sending from seq goes on: past the SACKed range
// holding seq, if one does; and how far it may go before the next SACKed
// range (limit, or 0 for no limit).
func (sb *scoreboard) skip(seq uint32) (from uint32, limit int) {
	for _, r := range sb.r {
		if int32(r.end-seq) <= 0 {
			continue
		}
		if int32(r.start-seq) <= 0 {
			seq = r.end
			continue
		}
		return seq, int(r.start - seq)
	}
	return seq, 0
}

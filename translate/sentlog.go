package translate

// The sent log: a record per segment the flow sent and the client has not
// acknowledged, with the time it was last sent, for RACK (rack.go). The
// records lie in sequence order in a ring; those in flight (neither SACKed
// nor taken for lost) are also linked in the order they were last sent,
// oldest first, as Linux's tsorted_sent_queue, so that finding the lost
// ones costs the segments sent before the last one delivered, not the
// window.

import "time"

// sentRec is a segment sent and not acknowledged. It starts where the
// record before it ends (the log's una for the first).
type sentRec struct {
	at  time.Duration // when it was last sent, since the flow's t0
	end uint32
	// prev and next link the records in flight by send time: slots, -1
	// for none.
	prev, next int32
	sacked     bool // the client SACKed it (RFC 2018): delivered
	lost       bool // taken for lost and not sent again since
	rexmit     bool // sent more than once
}

// sentLog holds the records of what is between sndUna and sndMax, the
// FIN aside.
type sentLog struct {
	r      []sentRec // a ring, its length a power of two
	head   int       // the slot of the first record
	n      int       // records held
	una    uint32    // where the first record starts
	oldest int32     // the in-flight list's ends: slots, -1 for none
	newest int32
	flight int // bytes in the records in flight: RFC 6675's pipe
	lost   int // records taken for lost and not sent again
}

// The ring's bounds. At sentLogMax records, what is sent next joins the
// last record (a record may then span several segments); a flow with that
// many segments in flight at a 1448-byte MSS has 5.9 MB in flight. A
// record is 24 bytes: the log costs a flow at most 96 KiB, and nothing
// once all is acknowledged.
const (
	sentLogMin = 64
	sentLogMax = 4096
)

func newSentLog(una uint32) sentLog { return sentLog{una: una, oldest: -1, newest: -1} }

func (l *sentLog) slot(i int) int32 { return int32((l.head + i) & (len(l.r) - 1)) }

// start is where the i-th record starts.
func (l *sentLog) start(i int) uint32 {
	if i == 0 {
		return l.una
	}
	return l.r[l.slot(i-1)].end
}

// end is where the last record ends: sndMax, the FIN aside.
func (l *sentLog) end() uint32 {
	if l.n == 0 {
		return l.una
	}
	return l.r[l.slot(l.n-1)].end
}

// size is the i-th record's length in bytes.
func (l *sentLog) size(i int) int { return int(l.r[l.slot(i)].end - l.start(i)) }

// find returns the index of the first record ending after seq, or n.
func (l *sentLog) find(seq uint32) int {
	lo, hi := 0, l.n
	for lo < hi {
		m := (lo + hi) / 2
		if int32(l.r[l.slot(m)].end-seq) > 0 {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

func (l *sentLog) unlink(s int32) {
	r := &l.r[s]
	if r.prev >= 0 {
		l.r[r.prev].next = r.next
	} else {
		l.oldest = r.next
	}
	if r.next >= 0 {
		l.r[r.next].prev = r.prev
	} else {
		l.newest = r.prev
	}
	r.prev, r.next = -1, -1
}

func (l *sentLog) pushNewest(s int32) {
	r := &l.r[s]
	r.prev, r.next = l.newest, -1
	if l.newest >= 0 {
		l.r[l.newest].next = s
	} else {
		l.oldest = s
	}
	l.newest = s
}

// grow doubles the ring, the records and links moved to the same order
// from slot 0.
func (l *sentLog) grow() {
	size := max(2*len(l.r), sentLogMin)
	r := make([]sentRec, size)
	at := func(s int32) int32 {
		if s < 0 {
			return -1
		}
		return (s - int32(l.head)) & int32(len(l.r)-1)
	}
	for i := range l.n {
		rec := l.r[l.slot(i)]
		rec.prev, rec.next = at(rec.prev), at(rec.next)
		r[i] = rec
	}
	l.oldest, l.newest = at(l.oldest), at(l.newest)
	l.r, l.head = r, 0
}

// full reports whether nothing more can be sent at sndMax until the
// client acknowledges some: the ring is at its bound and its last record
// can take no more (SACKed or lost).
func (l *sentLog) full() bool {
	if l.n < sentLogMax {
		return false
	}
	last := &l.r[l.slot(l.n-1)]
	return last.sacked || last.lost
}

// sent records bytes [from, to) sent at at, in records of mss bytes at
// most: what is past the log's end is new, what is within it sent again.
func (l *sentLog) sent(from, to uint32, at time.Duration, mss int) {
	end := l.end()
	for i := l.find(from); i < l.n && int32(l.start(i)-to) < 0; i++ {
		s := l.slot(i)
		r := &l.r[s]
		switch {
		case r.sacked:
			continue
		case r.lost:
			r.lost = false
			l.lost--
			l.flight += l.size(i)
		default:
			l.unlink(s)
		}
		r.rexmit, r.at = true, at
		l.pushNewest(s)
	}
	if int32(from-end) > 0 {
		from = end // the rest of a segment that started within the log
	}
	for int32(to-end) > 0 {
		n := min(int(to-end), mss)
		if l.n == len(l.r) && len(l.r) < sentLogMax {
			l.grow()
		}
		if l.n == len(l.r) {
			// At the bound: the last record takes the rest (full()
			// kept the pump from sending if it could not).
			s := l.slot(l.n - 1)
			r := &l.r[s]
			l.unlink(s)
			r.end, r.at = to, at
			l.flight += int(to - end)
			l.pushNewest(s)
			return
		}
		s := l.slot(l.n)
		l.r[s] = sentRec{end: end + uint32(n), at: at, prev: -1, next: -1}
		l.n++
		l.pushNewest(s)
		l.flight += n
		end += uint32(n)
	}
}

// ackTo drops the records the cumulative ACK una covers, calling
// delivered for each one not SACKed before.
func (l *sentLog) ackTo(una uint32, delivered func(r *sentRec)) {
	if int32(una-l.una) <= 0 {
		return
	}
	for l.n > 0 && int32(l.r[l.head].end-una) <= 0 {
		s := int32(l.head)
		r := &l.r[s]
		switch {
		case r.sacked:
		case r.lost:
			l.lost--
			delivered(r)
		default:
			l.flight -= int(r.end - l.una)
			l.unlink(s)
			delivered(r)
		}
		l.una = r.end
		l.head = (l.head + 1) & (len(l.r) - 1)
		l.n--
	}
	if l.n > 0 {
		if r := &l.r[l.head]; !r.sacked && !r.lost {
			l.flight -= int(una - l.una) // the first record acknowledged in part
		}
	}
	l.una = una
	if l.n == 0 && len(l.r) > sentLogMin {
		l.r, l.head = nil, 0 // nothing in flight: the ring goes
	}
}

// sack marks the records the SACK block b covers whole as delivered,
// calling delivered for each.
func (l *sentLog) sack(b seqRange, delivered func(r *sentRec)) {
	for i := l.find(b.start); i < l.n; i++ {
		start := l.start(i)
		if int32(start-b.end) >= 0 {
			return
		}
		s := l.slot(i)
		r := &l.r[s]
		if r.sacked || int32(start-b.start) < 0 || int32(r.end-b.end) > 0 {
			continue // partly covered: not delivered whole
		}
		r.sacked = true
		if r.lost {
			r.lost = false
			l.lost--
		} else {
			l.flight -= int(r.end - start)
			l.unlink(s)
		}
		delivered(r)
	}
}

// markLost takes the record in slot s, in flight, for lost.
func (l *sentLog) markLost(s int32) {
	r := &l.r[s]
	if r.sacked || r.lost {
		return
	}
	l.unlink(s)
	r.lost = true
	l.lost++
	l.flight -= int(r.end - l.startOfSlot(s))
}

// startOfSlot is where the record in slot s starts.
func (l *sentLog) startOfSlot(s int32) uint32 {
	return l.start(int((int(s) - l.head) & (len(l.r) - 1)))
}

// allLost is a retransmission timeout: every record is taken for lost,
// what was SACKed too (RFC 2018 8: the client may have dropped it).
func (l *sentLog) allLost() {
	for i := range l.n {
		r := &l.r[l.slot(i)]
		if !r.lost {
			r.lost = true
			l.lost++
		}
		r.sacked, r.prev, r.next = false, -1, -1
	}
	l.oldest, l.newest, l.flight = -1, -1, 0
}

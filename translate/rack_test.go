package translate

import (
	"bytes"
	"fmt"
	"testing"
	"time"
)

// check verifies the sent log's invariants: records contiguous from una in
// sequence order, the in-flight list holding exactly the records neither
// SACKed nor lost, in send-time order, flight and lost their counts, the
// ring within its bound.
func (l *sentLog) check() error {
	if l.n > sentLogMax || (l.n > 0 && l.n > len(l.r)) {
		return fmt.Errorf("%d records in a ring of %d", l.n, len(l.r))
	}
	flight, lost, inList := 0, 0, 0
	for i := range l.n {
		r := &l.r[l.slot(i)]
		size := int32(r.end - l.start(i))
		if size <= 0 {
			return fmt.Errorf("record %d of %d bytes", i, size)
		}
		switch {
		case r.sacked && r.lost:
			return fmt.Errorf("record %d both SACKed and lost", i)
		case r.lost:
			lost++
		case !r.sacked:
			flight += int(size)
			inList++
		}
	}
	if flight != l.flight || lost != l.lost {
		return fmt.Errorf("flight %d, lost %d; the records say %d, %d", l.flight, l.lost, flight, lost)
	}
	n, prev := 0, int32(-1)
	for s := l.oldest; s >= 0; s = l.r[s].next {
		r := &l.r[s]
		if r.sacked || r.lost || r.prev != prev {
			return fmt.Errorf("slot %d in the list: sacked %v lost %v prev %d (want %d)", s, r.sacked, r.lost, r.prev, prev)
		}
		if prev >= 0 && l.r[prev].at > r.at {
			return fmt.Errorf("the list out of send order at slot %d", s)
		}
		if n++; n > l.n {
			return fmt.Errorf("the list loops")
		}
		prev = s
	}
	if n != inList || l.newest != prev {
		return fmt.Errorf("%d records in the list, %d in flight; newest %d, want %d", n, inList, l.newest, prev)
	}
	return nil
}

// rackHarness is a flow with SACK, MSS 100, timestamps off, that sent 20
// segments of 100 bytes 1 ms after a measured round trip of 1 ms.
func rackHarness(t *testing.T) *harness {
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue = bytes.Repeat([]byte("0123456789"), 200)
	h.f.Readable() // 10 segments: the initial window
	if got := payloads(h.take()); len(got) != 10 {
		t.Fatalf("the first flight: %v", got)
	}
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(1000, 65535) // slow start: 20 more
	if got := payloads(h.take()); len(got) != 10 {
		t.Fatalf("after the first flight's ACK: %v", got)
	}
	return h
}

// TestFlowRACKHoles: two holes in one window, each with three segments
// SACKed past it, are both sent again on one ACK, and nothing the client
// holds or has not yet had time to get is (RFC 8985 6.2; before RACK the
// recovery sent again the whole window from the acknowledged point).
func TestFlowRACKHoles(t *testing.T) {
	h := rackHarness(t)
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(1000, 65535, [2]uint32{1100, 1500}, [2]uint32{1600, 2000})
	got := payloads(h.take())
	if len(got) != 2 || got[0] != [2]uint32{1000, 100} || got[1] != [2]uint32{1500, 100} {
		t.Fatalf("sent %v; want the holes at 1000 and 1500 only", got)
	}
	if !h.f.inRecovery {
		t.Fatal("not in recovery")
	}
	if err := h.f.log.check(); err != nil {
		t.Fatal(err)
	}
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(2000, 65535)
	if h.f.inRecovery || h.f.log.n != 0 || h.f.log.flight != 0 {
		t.Fatalf("after the full ACK: recovery %v, %d records, flight %d", h.f.inRecovery, h.f.log.n, h.f.log.flight)
	}
}

// TestFlowRACKReordering: with reordering seen, segments SACKed past a
// hole start the reordering timer, not a retransmission; the hole's
// delivery before it fires costs nothing, no retransmission and no cut of
// the window (RFC 8985 6.2 step 4, 6.3).
func TestFlowRACKReordering(t *testing.T) {
	h := rackHarness(t)
	h.f.rack.reoSeen = true
	cwnd := h.f.cc.window()
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(1000, 65535, [2]uint32{1100, 1400})
	if got := payloads(h.take()); len(got) != 0 {
		t.Fatalf("sent %v at once; want the reordering window's wait", got)
	}
	if h.f.rack.timer == 0 {
		t.Fatal("no reordering timer")
	}
	h.sackAck(1400, 65535) // the hole arrives, reordered
	if got := payloads(h.take()); len(got) != 0 || h.f.inRecovery || h.f.cc.window() < cwnd {
		t.Fatalf("after the reordered segment: sent %v, recovery %v, cwnd %d (was %d)", got, h.f.inRecovery, h.f.cc.window(), cwnd)
	}

	// Another hole, which stays one: the timer takes it for lost.
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(1400, 65535, [2]uint32{1500, 1600})
	if got := payloads(h.take()); len(got) != 0 || h.f.rack.timer == 0 {
		t.Fatalf("sent %v, timer %v; want the wait", got, h.f.rack.timer)
	}
	h.now = h.now.Add(h.f.rtoDelay())
	h.f.OnRTO()
	if got := payloads(h.take()); len(got) == 0 || got[0] != [2]uint32{1400, 100} || !h.f.inRecovery {
		t.Fatalf("the reordering timer sent %v, recovery %v; want the hole at 1400", got, h.f.inRecovery)
	}
}

// TestFlowRACKLostRetransmission: a hole's retransmission is lost again
// while segments sent after it arrive: once they are SACKed and a round
// trip has passed, the hole goes again, though it is not the segment at
// the acknowledged point (which resendLost watches) and no timer fired.
func TestFlowRACKLostRetransmission(t *testing.T) {
	h := rackHarness(t)
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(1000, 65535, [2]uint32{1100, 1200}, [2]uint32{1300, 1700})
	if got := payloads(h.take()); len(got) != 2 || got[0] != [2]uint32{1000, 100} || got[1] != [2]uint32{1200, 100} {
		t.Fatalf("recovery sent %v; want the holes at 1000 and 1200", got)
	}
	h.sock.queue = append(h.sock.queue, bytes.Repeat([]byte("x"), 300)...)
	h.sackAck(1100, 65535, [2]uint32{1300, 1800}) // the first hole's copy arrives; new data goes
	if got := payloads(h.take()); len(got) == 0 || got[0][0] < 2000 {
		t.Fatalf("sent %v; want new data only", got)
	}
	h.now = h.now.Add(2 * time.Millisecond)
	h.sackAck(1100, 65535, [2]uint32{1300, 2100}) // what was sent after the second copy arrives, not the copy
	if got := payloads(h.take()); len(got) == 0 || got[0] != [2]uint32{1200, 100} {
		t.Fatalf("sent %v; want the hole at 1200 a third time", got)
	}
	if err := h.f.log.check(); err != nil {
		t.Fatal(err)
	}
}

// TestSentLogBounds: a client with the smallest MSS and a window that
// takes everything: the log stops at sentLogMax records, the last one
// taking what comes after; its accounting holds through SACKs, losses and
// a timeout, and the ring goes once everything is acknowledged.
func TestSentLogBounds(t *testing.T) {
	l := newSentLog(1)
	var at time.Duration
	for seq := uint32(1); seq < 1+sentLogMax*48+5000; seq += 480 {
		at += time.Microsecond
		l.sent(seq, seq+480, at, 48)
		if err := l.check(); err != nil {
			t.Fatal(err)
		}
	}
	if l.n != sentLogMax || l.full() {
		t.Fatalf("%d records, full %v", l.n, l.full())
	}
	delivered := 0
	count := func(*sentRec) { delivered++ }
	l.sack(seqRange{1 + 480, 1 + 960}, count)
	l.markLost(l.slot(0))
	l.sent(1, 1+48, at+time.Microsecond, 48)
	l.allLost()
	if err := l.check(); err != nil || delivered != 10 || l.lost != sentLogMax {
		t.Fatalf("%v; %d delivered, %d lost", err, delivered, l.lost)
	}
	l.ackTo(l.end(), count)
	if err := l.check(); err != nil || l.n != 0 || l.r != nil {
		t.Fatalf("%v; %d records, ring of %d", err, l.n, len(l.r))
	}
}

// TestSentLogLostThenSACKed: a record taken for lost, then SACKed (the
// original arrived late), then a timeout: it counts once as lost, not as
// lost and SACKed at once.
func TestSentLogLostThenSACKed(t *testing.T) {
	l := newSentLog(1)
	l.sent(1, 1+300, time.Microsecond, 100)
	l.markLost(l.slot(1))
	l.sack(seqRange{101, 201}, func(*sentRec) {})
	if err := l.check(); err != nil {
		t.Fatal(err)
	}
	l.allLost()
	if err := l.check(); err != nil || l.lost != 3 {
		t.Fatalf("%v; %d lost", err, l.lost)
	}
}

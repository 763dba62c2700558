package translate

import (
	"bytes"
	"testing"
	"time"
)

// sackAck sends the client's pure ACK of ack with window wnd and SACK
// blocks, given as offsets past the ISS+1.
func (h *harness) sackAck(ack uint32, wnd uint16, blocks ...[2]uint32) bool {
	s := Segment{seq: h.seq, ack: testISS + 1 + ack, flags: tcpACK, wnd: wnd, ws: -1}
	for _, b := range blocks {
		s.sack[s.nSack] = seqRange{testISS + 1 + b[0], testISS + 1 + b[1]}
		s.nSack++
	}
	return h.f.Input(s)
}

// payloads returns the offsets and lengths of the segments' payloads.
func payloads(out []Segment) [][2]uint32 {
	var r [][2]uint32
	for _, s := range out {
		if len(s.payload) > 0 {
			r = append(r, [2]uint32{s.seq - (testISS + 1), uint32(len(s.payload))})
		}
	}
	return r
}

// TestFlowSACKReceive: SACK is offered when the client offers it; a
// segment past a gap is answered at once with SACK blocks naming what is
// kept, the block of the segment kept last first (RFC 2018 4); the gap's
// filling acknowledges all of it, with no block left.
func TestFlowSACKReceive(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, ts: true, tsVal: 1, sackOK: true, wnd: 512})
	if !h.out[0].sackOK {
		t.Fatalf("SYN-ACK without SACK-permitted: %+v", h.out[0])
	}
	h.established(512)
	for _, off := range []uint32{100, 300, 110} { // [100,120) and [300,310) kept
		h.seq = testIRS + 1 + off
		h.segment(0, testISS+1, 512, "0123456789")
	}
	out := h.take()
	if len(out) != 3 {
		t.Fatalf("past gaps: %d segments", len(out))
	}
	last := out[2]
	want := []seqRange{{testIRS + 1 + 100, testIRS + 1 + 120}, {testIRS + 1 + 300, testIRS + 1 + 310}}
	if last.ack != testIRS+1 || last.nSack != 2 || last.sack[0] != want[0] || last.sack[1] != want[1] {
		t.Fatalf("duplicate ACK %+v; want SACK blocks %v", last, want)
	}
	h.seq = testIRS + 1
	h.segment(0, testISS+1, 512, string(bytes.Repeat([]byte("x"), 100)))
	out = h.take()
	if len(out) != 1 || out[0].ack != testIRS+1+120 || out[0].nSack != 1 || out[0].sack[0] != want[1] {
		t.Fatalf("the first gap filled: %+v", out)
	}
}

// sentFlight returns an established flow with SACK and an MSS of 100 that
// has sent its initial window, 10 segments of its 1000 bytes, a round trip
// (1 ms) ago.
func sentFlight(t *testing.T) *harness {
	t.Helper()
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue = bytes.Repeat([]byte("abcdefghij"), 100)
	h.f.Readable()
	if got := payloads(h.take()); len(got) != 10 {
		t.Fatalf("first flight: %v; want the initial window of 10 segments", got)
	}
	h.now = h.now.Add(time.Millisecond)
	return h
}

// TestFlowSACKSend: the client's SACK blocks past a hole declare a loss
// once three segments' worth is SACKed (RFC 6675 4), and the rewind sends
// the hole, not what the client holds.
func TestFlowSACKSend(t *testing.T) {
	h := sentFlight(t)
	// The segment at 100 was lost; the client holds [200, 600).
	h.sackAck(100, 65535, [2]uint32{200, 400})
	if out := h.take(); len(out) != 0 {
		t.Fatalf("two segments SACKed: %+v", out)
	}
	h.sackAck(100, 65535, [2]uint32{200, 600})
	got := payloads(h.take())
	if len(got) == 0 || got[0] != [2]uint32{100, 100} {
		t.Fatalf("recovery sent %v; want the hole [100, 200) first", got)
	}
	for _, p := range got {
		if p[0] >= 200 && p[0] < 600 {
			t.Fatalf("recovery sent %v, which the client SACKed", got)
		}
	}
	if !h.f.inRecovery || h.f.recover != testISS+1+1000 {
		t.Fatalf("in recovery %v, recover %d", h.f.inRecovery, h.f.recover-testISS-1)
	}
	h.sackAck(1000, 65535)
	if h.f.inRecovery || h.f.cc.window() != h.f.cc.ssthreshold() {
		t.Fatalf("after the full ACK: in recovery %v, cwnd %d", h.f.inRecovery, h.f.cc.window())
	}
}

// TestFlowCongestionWindow: the first flight is the initial window (10
// segments, RFC 6928), slow start grows it by what is acknowledged, a
// timeout cuts it to one segment (RFC 5681 3.1).
func TestFlowCongestionWindow(t *testing.T) {
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue = bytes.Repeat([]byte("x"), 10000)
	h.f.Readable()
	if got := payloads(h.take()); len(got) != 10 {
		t.Fatalf("first flight: %d segments; want 10", len(got))
	}
	h.sackAck(1000, 65535)
	if got := payloads(h.take()); len(got) != 20 {
		t.Fatalf("after the first window's ACK: %d segments; want 20", len(got))
	}
	h.now = h.now.Add(time.Second)
	h.f.OnRTO()
	if got := payloads(h.take()); len(got) != 1 || got[0] != [2]uint32{1000, 100} {
		t.Fatalf("after a timeout: %v; want one segment at 1000", got)
	}
	// CUBIC's reduction: 0.7 of the window of 20 segments.
	if h.f.cc.window() != 100 || h.f.cc.ssthreshold() != 1400 {
		t.Fatalf("after a timeout: cwnd %d, ssthresh %d", h.f.cc.window(), h.f.cc.ssthreshold())
	}
}

// TestFlowRTO: the timeout follows the round trips measured (RFC 6298),
// by timestamps or by a timed segment, with a 200 ms floor; a flow whose
// client stops answering is reset after tcp_retries2's time, not before.
func TestFlowRTO(t *testing.T) {
	for _, ts := range []bool{true, false} {
		h := newHarness(t, Segment{mss: 1460, ws: 7, ts: ts, tsVal: 1, wnd: 65535})
		if d := h.f.rtoDelay(); d != RTOInit {
			t.Fatalf("timestamps %v: the SYN-ACK's timeout %v; want %v", ts, d, RTOInit)
		}
		h.take()
		h.now = h.now.Add(400 * time.Millisecond)
		h.f.Input(Segment{seq: h.seq, ack: testISS + 1, flags: tcpACK, wnd: 65535, ts: ts, tsVal: 2, tsEcr: 7000, ws: -1})
		// One sample of 400 ms: SRTT 400, RTTVAR 200: 1.2 s.
		if d := h.f.rtoDelay(); d != 1200*time.Millisecond {
			t.Fatalf("timestamps %v: after a 400 ms handshake the timeout is %v; want 1.2 s", ts, d)
		}
		for i := range 40 {
			h.sock.queue = append(h.sock.queue, 'x')
			h.f.Readable()
			h.take()
			h.now = h.now.Add(time.Millisecond)
			tsEcr := h.f.tsNow() - 1
			off := uint32(i + 1)
			h.f.Input(Segment{seq: h.seq, ack: testISS + 1 + off, flags: tcpACK, wnd: 65535, ts: ts, tsVal: 3, tsEcr: tsEcr, ws: -1})
		}
		if d := h.f.rtoDelay(); d != rtoMin {
			t.Fatalf("timestamps %v: after 1 ms round trips the timeout is %v; want the %v floor", ts, d, rtoMin)
		}
	}

	h := newHarness(t, Segment{mss: 1460, ws: 7, wnd: 65535})
	h.established(65535)
	h.sock.queue = []byte("lost")
	h.f.Readable()
	start := h.now
	for i := 0; ; i++ {
		h.now = h.now.Add(h.f.rtoDelay())
		if !h.f.OnRTO() {
			break
		}
		if h.f.rtoDelay() > rtoMax {
			t.Fatalf("backed off to %v", h.f.rtoDelay())
		}
		if i > 100 {
			t.Fatal("the timeouts never end the flow")
		}
	}
	if gave := h.now.Sub(start); gave < giveUp || gave > giveUp+rtoMax+rtoMin {
		t.Fatalf("gave up after %v; want about %v (tcp_retries2)", gave, giveUp)
	}
}

// TestFlowPersist: with the client's window shut and bytes waiting, a
// probe goes out at each timeout, backed off; nothing waiting, no probe and
// no timer; a client that answers its probes is probed on, one that stops
// is reset after maxProbes.
func TestFlowPersist(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: -1, wnd: 0})
	h.established(0)
	h.f.Readable()
	if h.f.rtoArmed {
		t.Fatal("a timer armed with nothing to send")
	}
	h.sock.queue = []byte("waiting")
	h.f.Readable()
	if !h.f.rtoArmed || len(h.take()) != 0 {
		t.Fatal("no persist timer with bytes waiting")
	}
	prev := time.Duration(0)
	for i := range 8 {
		d := h.f.rtoDelay()
		if d <= prev && d != rtoMax {
			t.Fatalf("probe %d: the timer %v after %v: not backed off", i, d, prev)
		}
		prev = d
		h.now = h.now.Add(d)
		if !h.f.OnRTO() {
			t.Fatal("the flow ended")
		}
		if out := h.take(); len(out) != 1 || out[0].seq != testISS || len(out[0].payload) != 0 {
			t.Fatalf("probe %d: %+v", i, out)
		}
		h.segment(0, testISS+1, 0, "") // answered: still shut
	}
	for i := 0; ; i++ {
		h.now = h.now.Add(h.f.rtoDelay())
		if !h.f.OnRTO() {
			break
		}
		if i > maxProbes {
			t.Fatalf("%d probes unanswered and the flow goes on", i)
		}
	}
}

// TestFlowAckChecks: an ACK of what was never sent draws an ACK and
// changes nothing, its window neither (RFC 9293 3.10.7.4); an ACK older
// than the largest window draws a challenge ACK (RFC 5961 5.2); a segment
// whose timestamp is older than the last one taken is dropped (PAWS, RFC
// 7323 5); a pure ACK ahead of rcvNxt draws nothing.
func TestFlowAckChecks(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: -1, ts: true, tsVal: 100, wnd: 1000})
	h.established(1000)
	h.sock.queue = []byte("0123456789")
	h.f.Readable()
	h.take()
	seg := func(ack uint32, wnd uint16, tsVal uint32, payload string) {
		h.f.Input(Segment{seq: h.seq, ack: ack, flags: tcpACK, wnd: wnd, ts: true, tsVal: tsVal, ws: -1, payload: []byte(payload)})
	}
	seg(testISS+1+5000, 0, 101, "")
	if out := h.take(); len(out) != 1 || h.f.sndUna != testISS+1 || h.f.sndWnd != 1000 {
		t.Fatalf("an ACK past sndMax: sent %+v, sndUna %d, window %d", out, h.f.sndUna-testISS-1, h.f.sndWnd)
	}
	far := uint32(testISS + 1)
	seg(far-100000, 0, 101, "")
	if out := h.take(); len(out) != 1 || h.f.sndWnd != 1000 {
		t.Fatalf("an ACK far below sndUna: sent %+v, window %d", out, h.f.sndWnd)
	}
	seg(testISS+1, 1000, 50, "stale")
	if out := h.take(); len(out) != 1 || len(h.sock.written) != 0 {
		t.Fatalf("an old timestamp: sent %+v, socket %q", out, h.sock.written)
	}
	h.seq += 100
	seg(testISS+1, 1000, 102, "")
	if out := h.take(); len(out) != 0 {
		t.Fatalf("a pure ACK ahead of rcvNxt drew %+v", out)
	}
}

// TestFlowResetAtSndMax: the RST that ends a flow after a rewind carries
// the highest sequence number sent, where the client's next expected
// number is, not the rewound sndNxt.
func TestFlowResetAtSndMax(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 4})
	h.established(4)
	h.sock.queue = []byte("abcdefgh")
	h.f.Readable()
	h.segment(0, testISS+1, 0, "") // the window shuts: nothing more
	h.now = h.now.Add(time.Second)
	h.f.OnRTO() // rewinds to sndUna; the window takes nothing
	h.take()
	h.f.mu.Lock()
	h.f.close(true)
	h.f.mu.Unlock()
	if out := h.take(); len(out) != 1 || out[0].flags&tcpRST == 0 || out[0].seq != testISS+1+4 {
		t.Fatalf("RST %+v; want seq at sndMax (%d)", out, testISS+1+4)
	}
}

// TestFlowFINRetransmitted: after an orderly end, the client's FIN sent
// again (our ACK of it was lost) is acknowledged again, as TIME-WAIT does.
func TestFlowFINRetransmitted(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.sock.eof = true
	h.f.Readable() // our FIN first
	h.segment(tcpFIN, testISS+2, 65535, "")
	if h.f.state != stateClosed {
		t.Fatalf("state %d after both FINs", h.f.state)
	}
	h.take()
	h.seq--
	h.segment(tcpFIN, testISS+2, 65535, "")
	if out := h.take(); len(out) != 1 || out[0].ack != testIRS+2 || out[0].flags&tcpRST != 0 {
		t.Fatalf("the FIN sent again drew %+v", out)
	}
}

// TestFlowShortWindowBackoff: while a stalled endpoint keeps the window
// too short to send into, the looks at it back off from 1 ms to lookMax,
// and client segments do not bring them back to 1 ms; a look that finds
// room brings the next a step sooner.
func TestFlowShortWindowBackoff(t *testing.T) {
	h := newHarness(t, Segment{ws: 7, wnd: 512})
	h.established(512)
	// A socket with 1500 bytes of room, as the SYN-ACK offered it: 500
	// left after the segment, less than the client sends into.
	h.sock.room, h.f.rcvAdv = 1500, h.f.rcvNxt+1500
	h.segment(0, testISS+1, 512, string(make([]byte, 1000)))
	h.f.FlushAck()
	if !h.f.wndShort {
		t.Fatal("the window is not short")
	}
	var total time.Duration
	for range 20 {
		total += h.f.ackDelay()
		h.f.FlushAck()
	}
	if d := h.f.ackDelay(); d != lookMax || total < 10*time.Second {
		t.Fatalf("after 20 looks: the next in %v, %v in all; want %v, backed off", d, total, lookMax)
	}
	h.segment(0, testISS+1, 512, "") // the client's probe
	h.f.FlushAck()
	if d := h.f.ackDelay(); d != lookMax {
		t.Fatalf("after a client's segment: the next look in %v; want still %v", d, lookMax)
	}
	h.sock.room = -1 // drained
	h.f.FlushAck()
	if out := h.take(); len(out) == 0 || out[len(out)-1].wnd == 0 {
		t.Fatalf("no window update once drained: %+v", out)
	}
	if d := h.f.ackDelay(); d >= lookMax {
		t.Fatalf("after a look that found room: the next in %v; want sooner than %v", d, lookMax)
	}
}

// TestFlowDSACK: a segment the client sends again that we had already is
// reported in a D-SACK block first (RFC 2883); a D-SACK from the client
// for what a recovery sent again undoes the window's reduction and raises
// the reordering allowed before the next loss (RFC 2883 5, Linux's
// tcp_try_undo_dsack).
func TestFlowDSACK(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, sackOK: true, wnd: 512})
	h.established(512)
	h.segment(0, testISS+1, 512, "hello")
	h.f.FlushAck()
	h.take()
	h.seq = testIRS + 1
	h.segment(0, testISS+1, 512, "hello") // again
	out := h.take()
	if len(out) != 1 || out[0].nSack != 1 || out[0].sack[0] != (seqRange{testIRS + 1, testIRS + 6}) {
		t.Fatalf("a duplicate drew %+v; want a D-SACK block of it", out)
	}

	s := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: 65535}, 1460, false)
	s.established(65535)
	s.sock.queue = bytes.Repeat([]byte("x"), 1000)
	s.f.Readable()
	s.take()
	s.sackAck(100, 65535, [2]uint32{200, 500}) // a loss at 100: recovery
	cwnd := s.f.cc.window()
	if !s.f.inRecovery || cwnd >= 1000 {
		t.Fatalf("recovery %v, cwnd %d", s.f.inRecovery, cwnd)
	}
	s.sackAck(1000, 65535, [2]uint32{100, 200}) // the hole came after all: reported twice
	if s.f.cc.window() < 1000 || s.f.dupThresh != 2*dupAckThresh {
		t.Fatalf("after a D-SACK: cwnd %d (was %d before the loss), reordering threshold %d", s.f.cc.window(), 1000, s.f.dupThresh)
	}
}

// TestFlowTailLossProbe: the last segments of a flight lost, no ACK comes
// to show it: after two round trips (not the RTO) the last segment goes
// again (RFC 8985 7), the client's answer SACKs it, and the hole before
// it is sent at once.
func TestFlowTailLossProbe(t *testing.T) {
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, ts: true, tsVal: 1, sackOK: true, wnd: 65535}, 1460, false)
	h.take()
	h.now = h.now.Add(10 * time.Millisecond)
	h.f.Input(Segment{seq: h.seq, ack: testISS + 1, flags: tcpACK, wnd: 65535, ts: true, tsVal: 2, tsEcr: 7000, ws: -1})
	h.sock.queue = bytes.Repeat([]byte("x"), 880) // 10 segments of 88
	h.f.Readable()
	h.take()
	h.sackAck(704, 65535) // 8 acknowledged; the last 2 lost
	if d := h.f.rtoDelay(); d >= rtoMin {
		t.Fatalf("the probe's timer %v; want under the RTO (%v)", d, rtoMin)
	}
	h.now = h.now.Add(h.f.rtoDelay())
	h.f.OnRTO()
	got := payloads(h.take())
	if len(got) != 1 || got[0] != [2]uint32{792, 88} {
		t.Fatalf("the probe: %v; want the last segment again", got)
	}
	h.now = h.now.Add(10 * time.Millisecond) // the probe's round trip
	h.sackAck(704, 65535, [2]uint32{792, 880})
	if got := payloads(h.take()); len(got) == 0 || got[0] != [2]uint32{704, 88} || !h.f.inRecovery {
		t.Fatalf("after the probe's SACK: %v, recovery %v; want the hole at 704", got, h.f.inRecovery)
	}
}

// TestFlowLostRetransmission: in recovery, the hole sent again is lost
// again; the client's ACKs keep coming with the hole still open, and once
// two round trips (2 ms at least) have passed the hole goes a third time,
// without waiting for the RTO.
func TestFlowLostRetransmission(t *testing.T) {
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue = bytes.Repeat([]byte("x"), 1000)
	h.f.Readable()
	h.take()
	h.now = h.now.Add(time.Millisecond)        // the flight's round trip
	h.sackAck(100, 65535, [2]uint32{200, 500}) // recovery: the hole at 100 sent again
	if got := payloads(h.take()); len(got) == 0 || got[0] != [2]uint32{100, 100} {
		t.Fatalf("recovery sent %v", got)
	}
	h.sackAck(100, 65535, [2]uint32{200, 1000}) // the rest arrives; the hole does not
	if got := payloads(h.take()); len(got) != 0 {
		t.Fatalf("at once: %v; want nothing yet", got)
	}
	h.now = h.now.Add(3 * time.Millisecond)
	h.sackAck(100, 65535, [2]uint32{200, 1000})
	if got := payloads(h.take()); len(got) != 1 || got[0] != [2]uint32{100, 100} {
		t.Fatalf("3 ms later: %v; want the hole again", got)
	}
}

// TestFlowLostRetransmissionQuiet: the hole sent again in recovery is lost
// again and no ACK comes to show it (everything else is SACKed): the
// timer sends it again after two round trips, not after the RTO, and at
// most maxHeadResends times before the RTO takes over.
func TestFlowLostRetransmissionQuiet(t *testing.T) {
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue = bytes.Repeat([]byte("x"), 1000)
	h.f.Readable()
	h.take()
	h.sackAck(100, 65535, [2]uint32{200, 1000}) // recovery: the hole at 100 sent again
	h.take()
	for i := range maxHeadResends {
		d := h.f.rtoDelay()
		if d >= rtoMin {
			t.Fatalf("copy %d: the timer %v; want under the RTO", i+2, d)
		}
		h.now = h.now.Add(d)
		h.f.OnRTO()
		if got := payloads(h.take()); len(got) != 1 || got[0] != [2]uint32{100, 100} {
			t.Fatalf("copy %d: %v; want the hole", i+2, got)
		}
	}
	if d := h.f.rtoDelay(); d < rtoMin {
		t.Fatalf("after %d copies the timer is %v; want the RTO", maxHeadResends, d)
	}
}

// TestFlowFINLostInRecovery: CI's reordering profile caught a download
// whose FIN never came: a recovery ran when the FIN went, the client got
// every byte but dropped the FIN (it came after a later copy of the data
// before it, and PAWS refused its older timestamp), and acknowledged the
// data only. The timer then fired every millisecond for a minute without
// sending anything (the hole at sndUna was the FIN, which resendLost did
// not send). The FIN must go again, soon, and the flow end once it is
// acknowledged.
func TestFlowFINLostInRecovery(t *testing.T) {
	h := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue, h.sock.eof = bytes.Repeat([]byte("x"), 900), true
	h.f.Readable()
	out := h.take()
	if len(out) != 10 || out[9].flags&tcpFIN == 0 || out[9].seq != testISS+1+900 {
		t.Fatalf("first flight: %d segments, the last %+v; want 9 and the FIN", len(out), out[len(out)-1])
	}
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(100, 65535, [2]uint32{200, 900}) // recovery: the hole at 100 sent again
	h.take()
	h.now = h.now.Add(time.Millisecond)
	h.sackAck(900, 65535) // every byte, not the FIN
	if !h.f.inRecovery {
		t.Fatal("the ACK of the data alone ended the recovery, which the FIN is part of")
	}
	fires, waited := 0, time.Duration(0)
	for ; fires < 20; fires++ {
		d := h.f.rtoDelay()
		h.now, waited = h.now.Add(d), waited+d
		h.f.OnRTO()
		if out := h.take(); len(out) > 0 {
			if len(out) != 1 || out[0].flags&tcpFIN == 0 || out[0].seq != testISS+1+900 || len(out[0].payload) != 0 {
				t.Fatalf("after %v: %+v; want the FIN again", waited, out)
			}
			break
		}
	}
	if fires == 20 || waited >= rtoMin {
		t.Fatalf("the FIN went again after %d firings and %v; want it before the RTO (%v)", fires+1, waited, rtoMin)
	}
	h.sackAck(901, 65535)
	h.segment(tcpFIN, testISS+1+901, 65535, "")
	if !h.f.Ended() {
		t.Fatal("the flow did not end with both FINs acknowledged")
	}
}

// TestFlowTimerNeverSpins: a client's SACK block may name the byte at
// sndUna, which the cumulative ACK says is missing (RFC 2018 allows no
// such block; a hostile client sends it). The hole cannot be sent again
// by resendLost then; the timer must back off to the RTO instead of firing
// every millisecond while sending nothing, for as long as the client
// cares to keep the flow.
func TestFlowTimerNeverSpins(t *testing.T) {
	h := sentFlight(t)
	h.sackAck(100, 65535, [2]uint32{200, 1000}) // recovery
	h.take()
	h.sackAck(100, 65535, [2]uint32{100, 1000}) // sndUna "SACKed"
	var clock time.Duration
	for range 64 {
		d := h.f.rtoDelay()
		h.now, clock = h.now.Add(d), clock+d
		if !h.f.OnRTO() {
			break
		}
	}
	if clock < rtoMin {
		t.Fatalf("64 firings of the timer in %v: it spins", clock)
	}
}

// TestFlowFastRetransmitPast2GiB: a flow that has sent 2 GiB without a
// loss still retransmits on three duplicate ACKs (RFC 5681 3.2). recover
// starts at the ISS (RFC 6582 3.2); left there, sequence space would wrap
// it ahead of sndUna after 2 GiB and turn fast retransmit off for the
// next 2 GiB, each loss left to a timeout.
func TestFlowFastRetransmitPast2GiB(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(4)
	// As after 2 GiB less 100 bytes sent and acknowledged, no loss.
	h.f.recover = h.f.sndUna - (1<<31 - 100)
	una := h.f.sndUna
	for i := 0; i < 50; i++ { // 200 bytes, each 4 acknowledged
		h.sock.queue = append(h.sock.queue, "abcd"...)
		h.f.Readable()
		h.take()
		una += 4
		h.segment(0, una, 4, "")
	}
	h.sock.queue = append(h.sock.queue, "wxyz"...)
	h.f.Readable()
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "wxyz" {
		t.Fatalf("sent: %+v", out)
	}
	for range dupAckThresh {
		h.segment(0, una, 4, "")
	}
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "wxyz" || out[0].seq != una {
		t.Fatalf("after %d duplicate ACKs, 2 GiB into the flow: %+v", dupAckThresh, out)
	}
}

// TestFlowTimeoutInRecoveryKeepsReduction: a timeout that comes in a
// recovery cuts the window to one segment but keeps the recovery's
// threshold (Linux's tcp_enter_loss computes ssthresh only from the open
// state): one reduction per loss episode, not 0.7 of 0.7.
func TestFlowTimeoutInRecoveryKeepsReduction(t *testing.T) {
	h := sentFlight(t)
	h.sackAck(100, 65535, [2]uint32{200, 600})
	h.take()
	// The ACK of the first segment grew the window to 11 segments.
	if !h.f.inRecovery || h.f.cc.ssthreshold() != 770 {
		t.Fatalf("in recovery %v, ssthresh %d; want a recovery at 770 (0.7 of 11 segments)", h.f.inRecovery, h.f.cc.ssthreshold())
	}
	// The hole is sent again up to maxHeadResends times before the RTO
	// takes over.
	for i := 0; i <= maxHeadResends && h.f.cc.window() != 100; i++ {
		h.now = h.now.Add(2 * time.Second)
		h.f.OnRTO()
	}
	if h.f.cc.window() != 100 || h.f.cc.ssthreshold() != 770 {
		t.Fatalf("a timeout in the recovery: cwnd %d, ssthresh %d; want 100, 770", h.f.cc.window(), h.f.cc.ssthreshold())
	}
}

// TestFlowWholeSegments: when the congestion window or the client's window
// stops a send, the flow sends whole segments and waits for the next ACK
// with the rest (Linux's tcp_mss_split_point; RFC 9293 3.8.6.2.1): no runt
// for a window's odd bytes while data is in flight, and no GSO batch whose
// last cut is one.
func TestFlowWholeSegments(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cwnd, wnd int
		gso       bool
	}{
		{"congestion window, GSO", 1050, 65535, true},
		{"client's window", 100000, 1050, false},
		{"client's window, GSO", 100000, 1050, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessLink(t, Segment{mss: 100, ws: 0, sackOK: true, wnd: uint16(tc.wnd)}, 1460, tc.gso)
			h.established(uint16(tc.wnd))
			h.f.cc.(*cubic).cwnd, h.f.cc.(*cubic).ssthresh = tc.cwnd, tc.cwnd // congestion avoidance
			h.sock.queue = bytes.Repeat([]byte("x"), 5000)
			h.f.Readable()
			check := func(what string, want int) {
				t.Helper()
				got := payloads(h.take())
				sum := 0
				for _, p := range got {
					if p[1]%100 != 0 {
						t.Fatalf("%s: sent %v, a runt", what, got)
					}
					sum += int(p[1])
				}
				if sum != want {
					t.Fatalf("%s: sent %v, %d bytes; want %d", what, got, sum, want)
				}
			}
			check("the first flight", 1000)
			h.sackAck(200, uint16(tc.wnd))
			check("after an ACK of two segments", 200)
		})
	}
}

// TestFlowDSACKPastGap: a segment past a gap that the client sends again
// while we keep it is named in a D-SACK block, the SACK block holding it
// next (RFC 2883 4.1.2): without it, a client whose segments are reordered
// takes every spurious retransmission for a needed one, and cuts its
// window each time.
func TestFlowDSACKPastGap(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, sackOK: true, wnd: 512})
	h.established(512)
	for _, off := range []uint32{100, 110} {
		h.seq = testIRS + 1 + off
		h.segment(0, testISS+1, 512, "0123456789")
	}
	h.take()
	for _, c := range []struct {
		off  uint32
		data string
	}{{110, "0123456789"}, {112, "2345"}} { // a copy, and a part of one
		h.seq = testIRS + 1 + c.off
		h.segment(0, testISS+1, 512, c.data)
		out := h.take()
		dup := seqRange{testIRS + 1 + c.off, testIRS + 1 + c.off + uint32(len(c.data))}
		held := seqRange{testIRS + 1 + 100, testIRS + 1 + 120}
		if len(out) != 1 || out[0].ack != testIRS+1 || out[0].nSack != 2 || out[0].sack[0] != dup || out[0].sack[1] != held {
			t.Fatalf("the copy at %d drew %+v; want a D-SACK block %v, then %v", c.off, out, dup, held)
		}
	}
}

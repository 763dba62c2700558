package translate

import (
	"math"
	"testing"
	"time"
)

// cubicAt is a CUBIC state at a window of w segments of 1000 bytes, in
// congestion avoidance, on a clock of its own.
type cubicAt struct {
	c   *cubic
	now time.Time
}

func newCubicAt(w int) *cubicAt {
	c := newCubic(1000)
	c.cwnd, c.ssthresh = w*1000, w*1000
	return &cubicAt{c: c, now: time.Unix(1000, 0)}
}

// run acknowledges a full window per round trip rtt, per segments per
// ACK, for d.
func (a *cubicAt) run(rtt, d time.Duration) { a.runACKs(rtt, d, 1) }

func (a *cubicAt) runACKs(rtt, d time.Duration, per int) {
	for end := a.now.Add(d); a.now.Before(end); a.now = a.now.Add(rtt) {
		for range a.c.cwnd / a.c.mss / per {
			a.c.acked(per*a.c.mss, a.c.cwnd, a.now, rtt)
		}
	}
}

// twins returns two states alike: a loss at 100 segments, then d of
// round trips of 100 ms.
func twins(d time.Duration) (a, b *cubicAt) {
	a, b = newCubicAt(100), newCubicAt(100)
	for _, x := range []*cubicAt{a, b} {
		x.c.lost()
		x.run(100*time.Millisecond, d)
	}
	return a, b
}

func (a *cubicAt) segs() float64 { return float64(a.c.cwnd) / float64(a.c.mss) }

// TestCubicReduction: a loss takes the window and ssthresh to 0.7 of it
// (RFC 9438 4.6, tcp_cubic.c's beta 717/1024); a second loss below the
// last W_max remembers less (fast convergence, RFC 9438 4.7).
func TestCubicReduction(t *testing.T) {
	a := newCubicAt(100)
	a.c.lost()
	if a.c.cwnd != 70000 || a.c.ssthresh != 70000 || a.c.wMax != 100 {
		t.Fatalf("after a loss at 100 segments: cwnd %d, ssthresh %d, W_max %.1f; want 70000, 70000, 100", a.c.cwnd, a.c.ssthresh, a.c.wMax)
	}
	a.c.lost() // at 70, below W_max: W_max = 70 x 1.7 / 2
	if a.c.cwnd != 49000 || math.Abs(a.c.wMax-59.5) > 1e-9 {
		t.Fatalf("after a second loss: cwnd %d, W_max %.2f; want 49000, 59.5", a.c.cwnd, a.c.wMax)
	}
	a.c.recovered()
	if a.c.cwnd != a.c.ssthresh {
		t.Fatalf("recovered: cwnd %d, ssthresh %d", a.c.cwnd, a.c.ssthresh)
	}
}

// TestCubicConcave: on a long round trip the window follows the cubic
// curve a round trip ahead (RFC 9438 4.4-4.5): back at W_max K seconds
// after the loss (eq. 2: K = cbrt(30 / 0.4) = 4.22 s for 100 segments),
// then past it, convex; Reno's estimate stays below.
func TestCubicConcave(t *testing.T) {
	a := newCubicAt(100)
	a.c.lost()
	const rtt = 200 * time.Millisecond
	start := a.now
	k := math.Cbrt(30 / cubicC)
	for _, d := range []time.Duration{2 * time.Second, 2200 * time.Millisecond, 2 * time.Second} {
		a.run(rtt, d)
		// The last round trip's ACKs came at a.now - rtt.
		at := a.now.Sub(start).Seconds()
		want := 100 + cubicC*math.Pow(at-k, 3)
		if w := a.segs(); math.Abs(w-want) > 1.5 || a.c.wEst >= w {
			t.Fatalf("%.1f s after the loss: %.1f segments (Reno's %.1f); want about %.1f (the curve)", at, w, a.c.wEst, want)
		}
	}
}

// TestCubicRenoFriendly: on a short round trip Reno's estimate is ahead of
// the curve and the window follows it (RFC 9438 4.3): 0.53 segments per
// round trip up to W_max, one segment per round trip past it.
func TestCubicRenoFriendly(t *testing.T) {
	a := newCubicAt(100)
	a.c.lost()
	const rtt = time.Millisecond
	a.run(rtt, 100*rtt)
	// 30 segments at alpha take 30 / 0.529 = 56.7 round trips, then 43.3
	// at one: 143.3. The curve at 0.1 s is 72.
	if w := a.segs(); math.Abs(w-143.3) > 2 {
		t.Fatalf("after 100 round trips of 1 ms: %.1f segments; want about 143.3 (Reno's estimate)", w)
	}
}

// TestCubicAppLimited: acknowledgments of a flight the window did not
// limit grow nothing, and the time spent so does not move the curve on
// (tcp_cubic.c's CA_EVENT_TX_START).
func TestCubicAppLimited(t *testing.T) {
	a, b := twins(time.Second)
	// b spends 10 s limited by its endpoint.
	w := b.c.cwnd
	for range 100 {
		b.c.acked(b.c.mss, b.c.cwnd/2, b.now, 100*time.Millisecond)
		b.now = b.now.Add(100 * time.Millisecond)
	}
	if b.c.cwnd != w {
		t.Fatalf("limited by the endpoint: the window went %d -> %d", w, b.c.cwnd)
	}
	a.run(100*time.Millisecond, time.Second)
	b.run(100*time.Millisecond, time.Second)
	if a.c.cwnd != b.c.cwnd {
		t.Fatalf("after 10 s limited by the endpoint: window %d; one never limited %d", b.c.cwnd, a.c.cwnd)
	}
}

// TestCubicTimeoutAndUndo: a timeout leaves one segment and starts the
// curve over; one after it without an ACK keeps the first's ssthresh
// (Linux's tcp_enter_loss); an undo restores the window, the threshold
// and W_max from before the reduction (RFC 9438 4.9).
func TestCubicTimeoutAndUndo(t *testing.T) {
	a := newCubicAt(100)
	a.c.timedOut(false)
	a.c.timedOut(true)
	if a.c.cwnd != 1000 || a.c.ssthresh != 70000 || a.c.wMax != 0 {
		t.Fatalf("after two timeouts: cwnd %d, ssthresh %d, W_max %.1f; want 1000, 70000, 0", a.c.cwnd, a.c.ssthresh, a.c.wMax)
	}
	b := newCubicAt(100)
	b.c.wMax = 120
	b.c.lost()
	b.c.undo()
	if b.c.cwnd != 100000 || b.c.ssthresh != 100000 || b.c.wMax != 120 {
		t.Fatalf("after an undo: cwnd %d, ssthresh %d, W_max %.1f; want 100000, 100000, 120", b.c.cwnd, b.c.ssthresh, b.c.wMax)
	}
}

// TestCubicStretchACKs: ACKs that cover several segments (GRO, delayed
// ACKs) grow the window as one per segment would.
func TestCubicStretchACKs(t *testing.T) {
	a, b := newCubicAt(100), newCubicAt(100)
	a.c.lost()
	b.c.lost()
	const rtt = 200 * time.Millisecond
	a.runACKs(rtt, 4400*time.Millisecond, 1)
	b.runACKs(rtt, 4400*time.Millisecond, 4)
	if math.Abs(a.segs()-b.segs()) > 1 || math.Abs(b.segs()-100) > 2 {
		t.Fatalf("at K: %.1f segments with an ACK per 4 segments, %.1f with one per segment; want about 100", b.segs(), a.segs())
	}
}

// TestCubicTargetCapped: far along the curve (here 100 s after the
// epoch began, with no ACK between) an ACK grows the window by at most
// half of what it acknowledges: the target is capped at 1.5 cwnd (RFC 9438
// 4.4).
func TestCubicTargetCapped(t *testing.T) {
	a := newCubicAt(100)
	a.c.lost()
	a.run(100*time.Millisecond, 100*time.Millisecond) // starts the epoch
	w := a.c.cwnd
	a.now = a.now.Add(100 * time.Second)
	a.c.acked(10*a.c.mss, a.c.cwnd, a.now, 100*time.Millisecond)
	if g := a.c.cwnd - w; g <= 0 || g > 5*a.c.mss {
		t.Fatalf("an ACK of 10 segments 100 s on grew the window by %d bytes; want 1-5000", g)
	}
}

// TestCubicFastConvergenceAlpha: after a second loss below the first, W_max
// is lowered (59.5 segments), but Reno's estimate keeps alpha until it
// reaches the window before the reduction (70, RFC 9438 4.3's cwnd_prior):
// from 49 segments, 60 round trips of 1 ms make 49 + 21 at 0.53 (39.7 round
// trips) + 20.3 at one = 90.3, not 99.5 as alpha one past W_max would.
func TestCubicFastConvergenceAlpha(t *testing.T) {
	a := newCubicAt(100)
	a.c.lost()
	a.c.lost()
	if a.c.cwnd != 49000 {
		t.Fatalf("cwnd %d after two losses; want 49000", a.c.cwnd)
	}
	a.run(time.Millisecond, 60*time.Millisecond)
	if w := a.segs(); math.Abs(w-90.3) > 2 {
		t.Fatalf("60 round trips after the second loss: %.1f segments; want about 90.3", w)
	}
}

// TestCubicRestart: a flow that sends again after 10 s with nothing in
// flight goes on along the curve from where it was, not 10 s further on
// (tcp_cubic.c's CA_EVENT_TX_START).
func TestCubicRestart(t *testing.T) {
	a, b := twins(time.Second)
	b.now = b.now.Add(10 * time.Second)
	b.c.restart(10*time.Second, b.now)
	a.run(100*time.Millisecond, time.Second)
	b.run(100*time.Millisecond, time.Second)
	if a.c.cwnd != b.c.cwnd {
		t.Fatalf("after 10 s idle: window %d; one never idle %d", b.c.cwnd, a.c.cwnd)
	}
}

// TestCubicUndoKeepsCurve: a reduction undone leaves the flow on the curve
// it was on (RFC 9438 4.9), as if the loss had not been.
func TestCubicUndoKeepsCurve(t *testing.T) {
	a, b := twins(5 * time.Second) // past K, convex
	b.c.lost()
	b.c.undo()
	a.run(100*time.Millisecond, 5*time.Second)
	b.run(100*time.Millisecond, 5*time.Second)
	if a.c.cwnd != b.c.cwnd {
		t.Fatalf("after an undone loss: window %d; with no loss %d", b.c.cwnd, a.c.cwnd)
	}
}

// TestCubicHostileInputs: huge acknowledgments and round trips and a clock
// that jumps both ways leave the window a whole number of bytes between
// one segment and maxCwnd.
func TestCubicHostileInputs(t *testing.T) {
	a := newCubicAt(100)
	a.c.lost()
	for i, in := range []struct {
		n   int
		jmp time.Duration
		rtt time.Duration
	}{
		{1 << 30, 0, math.MaxInt64},
		{1, -1 << 62, time.Millisecond},
		{1 << 30, 1 << 62, math.MaxInt64},
		{1 << 30, -1 << 62, 0},
		{1, 1 << 40, 1 << 40},
	} {
		a.now = a.now.Add(in.jmp)
		a.c.acked(in.n, a.c.cwnd, a.now, in.rtt)
		if a.c.cwnd < a.c.mss || a.c.cwnd > maxCwnd || math.IsNaN(a.c.frac) || math.IsNaN(a.c.wEst) {
			t.Fatalf("input %d: cwnd %d, frac %v, W_est %v", i, a.c.cwnd, a.c.frac, a.c.wEst)
		}
	}
}

package translate

import (
	"math"
	"time"
)

// CUBIC (RFC 9438), Linux's default congestion control
// (net/ipv4/tcp_cubic.c), in bytes toward the client. After a loss the
// window comes down to 0.7 of what it was, not half, and grows back along a
// cubic curve in real time, flat near the window where the loss was and
// steep away from it, never slower than Reno would grow at the same
// reduction (RFC 9438 4.3's Reno-friendly region). On a client link that
// loses packets at random, not for want of room, a flow keeps most of its
// window: at 1% loss CUBIC's Reno-friendly window is about 2.4 times
// NewReno's.
//
// Slow start is RFC 5681's, from an initial window of 10 segments (RFC
// 6928, Linux's TCP_INIT_CWND), by every byte acknowledged as Linux's
// tcp_slow_start does (the client's ACKs cover many segments at once under
// GRO). HyStart (Linux's hystart, RFC 9406) is not done: slow start ends at
// the first loss, as with NewReno.

// The constants of RFC 9438 4.1-4.3 (tcp_cubic.c: beta 717/1024, bic_scale
// 41/1024 x 10).
const (
	cubicC    = 0.4
	cubicBeta = 0.7
	// cubicAlpha is the Reno-friendly additive increase, in segments per
	// window acknowledged: RFC 9438 4.3's 3(1-beta)/(1+beta).
	cubicAlpha = 3 * (1 - cubicBeta) / (1 + cubicBeta)
	// maxCwnd bounds the window's growth: past the largest window a
	// client can offer (1 GiB with scaling), growth means nothing.
	maxCwnd = 1 << 30
)

var _ congestionControl = (*cubic)(nil)

type cubic struct {
	mss      int
	cwnd     int
	ssthresh int
	frac     float64 // growth of less than a byte, carried to the next ACK
	curveState
	// idle is when the flow last stopped filling its window while bytes
	// were in flight, zero while it fills it (see acked).
	idle time.Time

	// What the last reduction changed, for undo.
	prior       curveState
	priorCwnd   int
	priorSsthr  int
	priorActive bool
}

// curveState is the congestion avoidance epoch (RFC 9438 4.2-4.3), in
// segments and seconds: it starts at the first ACK past a reduction.
type curveState struct {
	epoch time.Time // zero: no epoch yet
	wMax  float64   // W_max: the window just before the last reduction, less by fast convergence
	k     float64   // K: when the curve is back at wMax, from the epoch
	wEst  float64   // W_est: the window Reno would have (RFC 9438 4.3)
	// cwndPrior is the window just before the last reduction (RFC 9438
	// 4.3's cwnd_prior): Reno's estimate grows by alpha below it, by one
	// segment past it.
	cwndPrior float64
}

func newCubic(mss int) *cubic {
	return &cubic{mss: mss, cwnd: 10 * mss, ssthresh: maxCwnd}
}

func (c *cubic) window() int { return c.cwnd }

func (c *cubic) ssthreshold() int { return c.ssthresh }

// acked grows the window by n bytes acknowledged with flight bytes in
// flight before them, if the window limited the flight: in slow start a
// flight of half the window (tcp_is_cwnd_limited's slack, the window
// doubling per round trip), in congestion avoidance one within a segment of
// it; RFC 7661, RFC 9438 4.6: an application-limited flow does not grow
// its window, nor does its time on the curve run (the epoch moves by it,
// as tcp_cubic.c's CA_EVENT_TX_START moves it when the flow sends again
// from idle, restart).
func (c *cubic) acked(n, flight int, now time.Time, rtt time.Duration) {
	if n <= 0 {
		return
	}
	ss := c.cwnd < c.ssthresh
	if (ss && 2*flight < c.cwnd) || (!ss && flight+c.mss <= c.cwnd) {
		if !c.epoch.IsZero() && c.idle.IsZero() {
			c.idle = now
		}
		return
	}
	if !c.idle.IsZero() {
		c.shift(now.Sub(c.idle), now)
		c.idle = time.Time{}
	}
	if ss {
		grow := min(n, c.ssthresh-c.cwnd)
		c.cwnd += grow
		if n -= grow; n == 0 {
			return
		}
	}
	mss := float64(c.mss)
	cw := float64(c.cwnd) / mss
	if c.epoch.IsZero() {
		c.epoch = now
		if c.wMax <= cw {
			c.k, c.wMax = 0, cw // no loss above: the curve starts here, convex
		} else {
			c.k = math.Cbrt((c.wMax - cw) / cubicC) // RFC 9438 eq. 2
		}
		c.wEst = cw
	}
	segs := float64(n) / mss
	t := max(now.Sub(c.epoch).Seconds(), 0)
	// RFC 9438 4.3: Reno's estimate grows by alpha per window until it
	// reaches the window before the reduction, by one past it.
	alpha := cubicAlpha
	if c.wEst >= c.cwndPrior {
		alpha = 1
	}
	c.wEst += alpha * segs / cw
	var next float64
	if w := c.curve(t); w < c.wEst {
		next = c.wEst
	} else {
		// RFC 9438 4.4-4.5: toward the curve one round trip ahead, by
		// (target - cwnd) / cwnd per segment acknowledged, the target
		// within [cwnd, 1.5 cwnd].
		target := min(max(c.curve(t+rtt.Seconds()), cw), 1.5*cw)
		next = cw + (target-cw)*segs/cw
	}
	c.frac += min(max(next-cw, 0), maxCwnd/mss) * mss
	grow := int(c.frac)
	c.frac -= float64(grow)
	c.cwnd = min(c.cwnd+grow, maxCwnd)
	c.wEst = min(c.wEst, maxCwnd/mss)
}

// restart reports that the flow sends again after idle with nothing in
// flight: the epoch moves by it (tcp_cubic.c's CA_EVENT_TX_START).
func (c *cubic) restart(idle time.Duration, now time.Time) {
	c.shift(idle, now)
}

// shift moves the epoch later by d, never past now.
func (c *cubic) shift(d time.Duration, now time.Time) {
	if c.epoch.IsZero() || d <= 0 {
		return
	}
	if c.epoch = c.epoch.Add(d); c.epoch.After(now) {
		c.epoch = now
	}
}

// curve is W_cubic(t), RFC 9438 eq. 1, in segments.
func (c *cubic) curve(t float64) float64 {
	d := t - c.k
	return cubicC*d*d*d + c.wMax
}

// reduce is RFC 9438 4.6-4.7 at a loss: W_max is the window now, less
// when it is below the last one (fast convergence: another flow may have
// taken the room), and the window and threshold come down to beta of it
// (tcp_cubic.c's cubictcp_recalc_ssthresh, from the window, not the
// flight).
func (c *cubic) reduce() {
	c.prior, c.priorCwnd, c.priorSsthr, c.priorActive = c.curveState, c.cwnd, c.ssthresh, true
	cw := float64(c.cwnd) / float64(c.mss)
	c.cwndPrior = cw
	if cw < c.wMax {
		c.wMax = cw * (1 + cubicBeta) / 2
	} else {
		c.wMax = cw
	}
	c.ssthresh = max(int(float64(c.cwnd)*cubicBeta), 2*c.mss)
	c.epoch, c.idle, c.frac = time.Time{}, time.Time{}, 0
}

func (c *cubic) lost() {
	c.reduce()
	c.cwnd = c.ssthresh
}

func (c *cubic) recovered() { c.cwnd = c.ssthresh }

// timedOut: RFC 5681 3.1's loss window of one segment; the curve starts
// over, as tcp_cubic.c's bictcp_reset on entering the loss state. A
// timeout that follows another, or comes in a recovery, keeps the
// reduction already made (Linux's tcp_enter_loss computes ssthresh only
// from the open state).
func (c *cubic) timedOut(again bool) {
	if !again {
		c.reduce()
	}
	c.cwnd, c.wMax = c.mss, 0
	c.epoch, c.idle = time.Time{}, time.Time{}
}

// undo puts back the window, the threshold and the curve from before the
// last reduction (RFC 9438 4.9).
func (c *cubic) undo() {
	if !c.priorActive {
		return
	}
	c.cwnd, c.ssthresh = max(c.cwnd, c.priorCwnd), max(c.ssthresh, c.priorSsthr)
	c.curveState, c.idle, c.priorActive = c.prior, time.Time{}, false
}

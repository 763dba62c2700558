package translate

// A translated flow's congestion control and round-trip time: how much it
// may have in flight toward the client, and how long it waits before it
// sends again. The client's link may be a pod's veth with a rate limit (the
// CNI bandwidth plugin's TBF) or a lossy wire; without these the flow sent
// its whole window at once and again after every loss, into the same
// limit.

import "time"

// congestionControl decides the congestion window of a flow's sender, in
// bytes. Its methods are called under the flow's lock.
type congestionControl interface {
	// window is the congestion window: the most the flow may have in
	// flight (RFC 5681 2, cwnd).
	window() int
	// ssthreshold is the slow start threshold: where a recovery brings
	// the window down to.
	ssthreshold() int
	// acked reports n bytes newly acknowledged outside loss recovery;
	// limited says whether the flight was limited by the window (RFC 7661:
	// an application-limited flow does not grow it).
	acked(n int, limited bool)
	// lost reports a loss found by duplicate ACKs or SACK with flight
	// bytes in flight: the start of fast recovery (RFC 5681 3.2, RFC 6582).
	lost(flight int)
	// recovered reports the end of fast recovery: every byte in flight
	// when it began is acknowledged (RFC 6582 3.2 step 3).
	recovered()
	// timedOut reports a retransmission timeout with flight bytes in
	// flight (RFC 5681 3.1's loss window).
	timedOut(flight int)
	// undo reports that the last reduction's loss was none: the client
	// got the bytes sent again twice (a D-SACK, RFC 2883 5; Linux's
	// tcp_try_undo_dsack): the window goes back to what it was.
	undo()
}

var _ congestionControl = (*reno)(nil)

// reno is NewReno's congestion control (RFC 5681, RFC 6582), in bytes:
// slow start from an initial window of 10 segments (RFC 6928, Linux's
// TCP_INIT_CWND), congestion avoidance past ssthresh, the window halved on
// a loss and cut to one segment on a timeout. Slow start grows by every
// byte acknowledged, as Linux's tcp_slow_start does, not by one segment per
// ACK (RFC 3465's limit): the client's ACKs cover many segments at once
// under GRO.
type reno struct {
	mss      int
	cwnd     int
	ssthresh int
	avoided  int // bytes acknowledged toward the next segment of growth in congestion avoidance
	// The window and threshold before the last reduction, for undo.
	priorCwnd, priorSsthresh int
}

// renoMaxWindow bounds the window's growth: past the largest window a
// client can offer (1 GiB with scaling), growth means nothing.
const renoMaxWindow = 1 << 30

func newReno(mss int) *reno {
	return &reno{mss: mss, cwnd: 10 * mss, ssthresh: renoMaxWindow}
}

func (c *reno) window() int { return c.cwnd }

func (c *reno) ssthreshold() int { return c.ssthresh }

func (c *reno) acked(n int, limited bool) {
	if !limited || n <= 0 {
		return
	}
	if c.cwnd < c.ssthresh {
		grow := min(n, c.ssthresh-c.cwnd)
		c.cwnd += grow
		n -= grow
		if n == 0 {
			return
		}
	}
	// Congestion avoidance: one segment per window acknowledged (RFC
	// 5681 3.1, equation 3 in bytes).
	if c.avoided += n; c.avoided >= c.cwnd {
		c.avoided -= c.cwnd
		c.cwnd = min(c.cwnd+c.mss, renoMaxWindow)
	}
}

// halve is RFC 5681 equation 4: half the flight, two segments at least.
func (c *reno) halve(flight int) int { return max(flight/2, 2*c.mss) }

func (c *reno) lost(flight int) {
	c.priorCwnd, c.priorSsthresh = c.cwnd, c.ssthresh
	c.ssthresh = c.halve(flight)
	c.cwnd, c.avoided = c.ssthresh, 0
}

func (c *reno) recovered() { c.cwnd = c.ssthresh }

func (c *reno) undo() {
	if c.priorCwnd == 0 {
		return
	}
	c.cwnd, c.ssthresh = max(c.cwnd, c.priorCwnd), max(c.ssthresh, c.priorSsthresh)
	c.priorCwnd = 0
}

func (c *reno) timedOut(flight int) {
	c.priorCwnd, c.priorSsthresh = c.cwnd, c.ssthresh
	c.ssthresh = c.halve(flight)
	c.cwnd, c.avoided = c.mss, 0 // the loss window: one segment
}

// The retransmission timeout (RFC 6298, with Linux's bounds): 1 s before
// the first measurement (RFC 6298 2.1, Linux's TCP_TIMEOUT_INIT), then
// SRTT + 4 RTTVAR, at least 200 ms (Linux's TCP_RTO_MIN; RFC 6298 2.4's
// 1 s floor is what Linux does not follow either) and at most 120 s
// (TCP_RTO_MAX), doubled per timeout up to that.
const (
	RTOInit = time.Second
	rtoMin  = 200 * time.Millisecond // the floor
	rtoMax  = 120 * time.Second
	// giveUp is how long a flow's retransmissions go unanswered before
	// it is reset: what Linux's tcp_retries2 (15) comes to with a 200 ms
	// RTO (retransmits_timed_out: 1023 x 200 ms doubling, then 6 x 120 s).
	giveUp = 924600 * time.Millisecond
	// maxProbes is how many window probes in a row may go unanswered
	// (tcp_probe_timer: tcp_retries2); a client that answers them is
	// probed for as long as its window stays shut, as Linux probes.
	maxProbes = 15
	// synAckRetries is how often a SYN-ACK is sent again
	// (tcp_synack_retries) when no handshake deadline comes first.
	synAckRetries = 5
)

// rttEstimator is RFC 6298 2's smoothed round-trip time and its variance.
type rttEstimator struct {
	srtt, rttvar time.Duration
	measured     bool
}

// sample takes one round-trip time measured on an acknowledgment of data
// never sent twice (Karn's rule, RFC 6298 3), or by its timestamp echo
// (RFC 7323 4.1).
func (e *rttEstimator) sample(r time.Duration) {
	r = max(r, 0)
	if !e.measured {
		e.srtt, e.rttvar, e.measured = r, r/2, true // RFC 6298 2.2
		return
	}
	d := e.srtt - r // RFC 6298 2.3: beta 1/4, alpha 1/8
	if d < 0 {
		d = -d
	}
	e.rttvar = e.rttvar - e.rttvar/4 + d/4
	e.srtt = e.srtt - e.srtt/8 + r/8
}

// rto is the retransmission timeout before any backoff.
func (e *rttEstimator) rto() time.Duration {
	if !e.measured {
		return RTOInit
	}
	// RFC 6298 2.3: SRTT + max(G, 4 RTTVAR), with a clock of 1 ms.
	return min(max(e.srtt+max(time.Millisecond, 4*e.rttvar), rtoMin), rtoMax)
}

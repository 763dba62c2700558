package translate

// A translated flow's congestion control and round-trip time: how much it
// may have in flight toward the client, and how long it waits before it
// sends again. The client's link may be a pod's veth with a rate limit (the
// CNI bandwidth plugin's TBF) or a lossy wire; without these the flow sent
// its whole window at once and again after every loss, into the same
// limit.

import "time"

// congestionControl decides the congestion window of a flow's sender, in
// bytes: CUBIC's (cubic.go). Its methods are called under the flow's lock.
type congestionControl interface {
	// window is the congestion window: the most the flow may have in
	// flight (RFC 5681 2, cwnd).
	window() int
	// ssthreshold is the slow start threshold: where a recovery brings
	// the window down to.
	ssthreshold() int
	// acked reports n bytes newly acknowledged outside loss recovery at
	// now, with flight bytes in flight before them, on a path whose least
	// round trip is rtt. Whether the window limited the flight is the
	// congestion control's to judge (RFC 7661: an application-limited
	// flow does not grow it).
	acked(n, flight int, now time.Time, rtt time.Duration)
	// restart reports that the flow sends new bytes after idle with
	// nothing in flight.
	restart(idle time.Duration, now time.Time)
	// lost reports a loss found by duplicate ACKs or SACK: the start of
	// fast recovery (RFC 5681 3.2, RFC 6582).
	lost()
	// recovered reports the end of fast recovery: every byte in flight
	// when it began is acknowledged (RFC 6582 3.2 step 3).
	recovered()
	// timedOut reports a retransmission timeout (RFC 5681 3.1's loss
	// window); again says it follows another with no ACK between, whose
	// reduction stands (Linux's tcp_enter_loss sets ssthresh once).
	timedOut(again bool)
	// undo reports that the last reduction's loss was none: the client
	// got the bytes sent again twice (a D-SACK, RFC 2883 5; Linux's
	// tcp_try_undo_dsack): the window goes back to what it was.
	undo()
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

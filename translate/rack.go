package translate

// RACK (RFC 8985 6), for flows with SACK: a segment is lost once a segment
// sent after it has been delivered and a round trip and a reordering window
// have passed since it was sent. Unlike counting duplicate ACKs it finds a
// retransmission lost again, and losses of any number of segments in a
// window, in one round trip, and it tells a reordering from a loss by time:
// a recovery sends again only what is lost (sentlog.go's records), not the
// whole window from the acknowledged point.

import "time"

// rackState is RFC 8985 6.1's per-connection state.
type rackState struct {
	set  bool          // a segment was delivered
	xmit time.Duration // when the most recently sent delivered segment was sent
	end  uint32        // and where it ends
	rtt  time.Duration // its round trip
	fack uint32        // the highest end delivered
	// minRTT is the least round trip seen (the flow's life: RFC 8985's
	// windowed filter serves long flows whose path changes; a proxied
	// flow's path does not).
	minRTT  time.Duration
	reoSeen bool // a segment was delivered out of order, never sent twice
	// reoDelay is how late the latest reordered segment came, in send
	// time, up to rtoMin: the least reordering window once one was seen.
	reoDelay time.Duration
	// reoMult is the reordering window's multiplier, raised by D-SACKs
	// (once per round trip, up to reoMultMax), back to 1 after
	// reoMultRecoveries recoveries without one.
	reoMult    int
	reoRound   time.Duration // no further raise before this
	recoveries int
	timer      time.Duration // the reordering timer's deadline, 0 for none
}

// The reordering window's bounds (RFC 8985 6.2 step 4).
const (
	reoMultRecoveries = 16
	reoMultMax        = 0xff
)

// since is the flow's clock as the sent log keeps it.
func (f *Flow) since() time.Duration { return f.now().Sub(f.t0) }

// rackDelivered takes one segment delivered, by the cumulative ACK or a
// SACK block (RFC 8985 6.2 steps 1-3).
func (f *Flow) rackDelivered(r *sentRec) {
	k := &f.rack
	now := f.since()
	if !r.rexmit && k.set && int32(r.end-k.fack) < 0 {
		// Delivered below one sent after it, never sent twice: a
		// reordering, as late as the most recent send delivered before
		// it is later than its own.
		k.reoSeen = true
		if late := k.xmit - r.at; late > k.reoDelay {
			k.reoDelay = min(late, rtoMin)
		}
	}
	if !k.set || int32(r.end-k.fack) > 0 {
		k.fack = r.end
	}
	rtt := now - r.at
	if r.rexmit {
		// Which copy arrived (RFC 8985 6.2 step 2): a round trip
		// shorter than any seen, or the ACK's timestamp echo older than
		// the last copy's, is the original's delivery.
		if rtt < k.minRTT || (f.ackTS && int32(f.ackEcr-(f.tsBase+uint32(r.at.Milliseconds()))) < 0) {
			return
		}
	}
	if k.minRTT == 0 || rtt < k.minRTT {
		k.minRTT = max(rtt, time.Microsecond)
	}
	if !k.set || r.at > k.xmit || (r.at == k.xmit && int32(r.end-k.end) > 0) {
		k.set, k.xmit, k.end, k.rtt = true, r.at, r.end, rtt
	}
}

// reoWnd is the reordering window (RFC 8985 6.2 step 4): none while no
// reordering was seen and a recovery runs or three segments are SACKed past
// a hole (the duplicate-ACK threshold's case); otherwise a quarter of the
// least round trip, times the multiplier D-SACKs raised, at most the
// smoothed round trip; and at least as long as the reordering seen was
// late (reoDelay). That floor is ours: RFC 8985 caps the window at the
// round trip, so that segments held back longer (a quarter of them by 5 ms
// on a 0.3 ms path, TestFaults' reordering) were all sent twice, each
// recovery cut the window and only some were undone.
func (f *Flow) reoWnd() time.Duration {
	k := &f.rack
	if !k.reoSeen && (f.inRecovery || f.score.sacked(f.sndMax) >= dupAckThresh*f.sendMSS) {
		return 0
	}
	w := time.Duration(max(k.reoMult, 1)) * k.minRTT / 4
	if f.rtt.measured {
		w = min(w, f.rtt.srtt)
	}
	return max(w, k.reoDelay)
}

// rackDSACK takes a D-SACK: the reordering window grows, once per round
// trip.
func (f *Flow) rackDSACK() {
	k := &f.rack
	if now := f.since(); now >= k.reoRound {
		k.reoMult = min(max(k.reoMult, 1)+1, reoMultMax)
		k.reoRound = now + f.rtt.srtt
		k.recoveries = 0
	}
}

// rackDetect takes for lost every segment in flight sent before the most
// recently sent delivered one, a round trip and the reordering window
// ago (RFC 8985 6.2 step 5); for the first one not yet due it sets the
// reordering timer. A loss outside a recovery starts one.
func (f *Flow) rackDetect() {
	k := &f.rack
	k.timer = 0
	if !k.set {
		return
	}
	now, reo := f.since(), f.reoWnd()
	lost := false
	for s := f.log.oldest; s >= 0; {
		r := &f.log.r[s]
		next := r.next
		if r.at > k.xmit || (r.at == k.xmit && int32(r.end-k.end) >= 0) {
			break // sent after the segment delivered: nothing to tell yet
		}
		if wait := r.at + k.rtt + reo - now; wait > 0 {
			k.timer = now + wait // the records after it are due later still
			break
		}
		f.log.markLost(s)
		lost = true
		s = next
	}
	if lost && !f.inRecovery {
		f.enterRecovery()
	}
}

// enterRecovery starts a recovery with SACK (RFC 6675 5): the window is
// cut once (cubic.go), and proportional rate reduction paces the recovery
// by what was in flight (FlightSize: sent and not cumulatively
// acknowledged, RFC 5681 3.1); the first lost segment may go at once (5
// step 4.3), the others as proportional rate reduction allows (pump).
func (f *Flow) enterRecovery() {
	flight := int(f.sndMax - f.sndUna)
	f.cc.lost()
	f.prr = prrState{recoverFS: max(flight, 1), allow: f.sendMSS}
	f.inRecovery, f.tlpProbing = true, false
	f.recover = f.sndMax
	f.dupAcks = 0
	f.timing = false // Karn's rule: nothing sent twice is timed
	f.startUndo()
	f.headSeq, f.headAt, f.headResends = f.sndUna, f.now(), 0
	k := &f.rack
	if k.recoveries++; k.recoveries >= reoMultRecoveries {
		k.reoMult, k.recoveries = 1, 0
	}
}

// sendLost sends again the segments taken for lost, lowest first, as far
// as the congestion window (budget) allows. Those past a timeout's rewind
// are left to it.
func (f *Flow) sendLost() {
	if f.log.lost == 0 {
		return
	}
	for i := 0; i < f.log.n && f.log.lost > 0 && f.state == stateEstablished; i++ {
		start := f.log.start(i)
		if int32(start-f.sndNxt) >= 0 {
			return
		}
		r := &f.log.r[f.log.slot(i)]
		if !r.lost {
			continue
		}
		if f.budget() < min(f.sendMSS, int(r.end-start)) {
			return
		}
		end := r.end
		for int32(end-start) > 0 {
			n := min(int(end-start), f.maxSegment())
			if !f.resend(start, n) {
				return
			}
			start += uint32(n)
		}
	}
}

// maxSegment is the most payload one segment of ours carries: the MSS,
// or under GSO whole segments up to segmentMax.
func (f *Flow) maxSegment() int {
	if f.gso {
		return max(f.sendMSS, (segmentMax-f.hdrLen())/f.sendMSS*f.sendMSS)
	}
	return f.sendMSS
}

// prrState is proportional rate reduction (RFC 6937) in a recovery with
// SACK: what the flow sends while the window comes down to ssthresh follows
// what the client's ACKs report delivered, a segment or two per ACK, not
// nothing until the flight has halved and then a burst (Linux's
// tcp_cwnd_reduction).
type prrState struct {
	recoverFS int // FlightSize when the recovery began
	delivered int // bytes the client reported delivered since (prr_delivered)
	out       int // bytes sent since (prr_out)
	allow     int // what the last ACK lets the flow send
}

// prrAck takes an ACK in recovery that reported delivered bytes newly
// acknowledged or SACKed (RFC 6937 3.1's DeliveredData) and sets what may
// go now: in proportion to ssthresh while the pipe is above it, else up to
// ssthresh, a segment more than delivered at most (PRR-SSRB).
func (f *Flow) prrAck(delivered int) {
	p := &f.prr
	p.delivered += delivered
	pipe, ssthresh := f.pipe(), f.cc.ssthreshold()
	var n int
	if pipe > ssthresh {
		n = (p.delivered*ssthresh+p.recoverFS-1)/p.recoverFS - p.out
	} else {
		n = min(ssthresh-pipe, max(p.delivered-p.out, delivered)+f.sendMSS)
	}
	p.allow = max(n, 0)
	if p.out == 0 {
		p.allow = max(p.allow, f.sendMSS) // the fast retransmission goes whatever the count
	}
}

// budget is how many bytes the flow may send now: within the congestion
// window, or in a recovery with SACK what proportional rate reduction
// allows.
func (f *Flow) budget() int {
	if f.sackOK && f.inRecovery {
		return f.prr.allow
	}
	return f.cc.window() - f.pipe()
}

// noteOut counts n bytes sent (or sent again) in a recovery.
func (f *Flow) noteOut(n int) {
	if f.sackOK && f.inRecovery {
		f.prr.out += n
		f.prr.allow = max(f.prr.allow-n, 0)
	}
}

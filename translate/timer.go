package translate

// The flow's timers and its owner's reports: retransmission and persist
// (RFC 6298 5, RFC 9293 3.8.6.1), the held ACK and the short window's
// look; the socket becoming readable or writable again.

import "time"

// AckDelay is how long a flow holds the ACK of a client's data for the
// endpoint's answer to carry it, as the gate holds gVisor's.
const AckDelay = time.Millisecond

// OnRTO is the owner's retransmission (or persist) timer firing.
func (f *Flow) OnRTO() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.detached {
		return true
	}
	if f.state == stateClosed || !f.rtoArmed {
		return f.state != stateClosed
	}
	now := f.now()
	if f.state == stateSynRcvd && !f.hsDeadline.IsZero() && !now.Before(f.hsDeadline) {
		if f.hsAborted != nil {
			f.hsAborted.Add(1)
		}
		f.close(true) // the client did not complete its handshake in time
		return false
	}
	if f.state == stateEstablished && f.rack.timer > 0 && f.since() >= f.rack.timer {
		f.rackDetect() // RFC 8985 6.3: the reordering timer
		f.pump()
		return f.state != stateClosed
	}
	if f.state == stateEstablished && f.headProbing() {
		f.resendLost() // if due; armed again either way
		return true
	}
	if f.state == stateEstablished && now.Sub(f.progress) < f.rtoDelay() {
		return true // armed once per flight: the flight moved since; armed again
	}
	switch {
	case f.state == stateEstablished && f.probeDue():
		f.tailLossProbe()
	case f.state == stateSynRcvd:
		if f.backoff++; f.backoff > synAckRetries && f.hsDeadline.IsZero() {
			f.close(true)
			return false
		}
		f.timing = false
		f.sendSynAck()
	case f.sndUna != f.sndMax:
		// RFC 6298 5.4-5.7: sent again from the acknowledged point, the
		// timer backed off; RFC 5681 3.1: the congestion window cut to
		// one segment; RFC 2018 8: what the client SACKed is sent again
		// too (it may have dropped it).
		again := !f.retransAt.IsZero() || f.inRecovery
		if f.retransAt.IsZero() {
			f.retransAt = now
			f.startUndo()
		} else if now.Sub(f.retransAt) >= giveUp {
			f.close(true)
			return false
		}
		f.backoff++
		f.cc.timedOut(again)
		f.inRecovery = false
		f.score.clear()
		if f.sackOK {
			f.log.allLost()
			f.rack.timer = 0
		}
		f.rewind()
	case f.sndWnd == 0 && f.pending():
		// A window probe: an old sequence number draws an ACK with the
		// client's window (as Linux's tcp_xmit_probe_skb), backed off as
		// the retransmissions are; given up once the client stops
		// answering them (tcp_probe_timer).
		if f.probes++; f.probes > maxProbes {
			f.close(true)
			return false
		}
		f.backoff++
		f.sndNxt--
		f.sendAck()
		f.sndNxt++
	default:
		f.rtoArmed = false
	}
	return f.state != stateClosed
}

// rtoDelay is how long the owner arms the timer for: the RTO, backed off.
// In the handshake it ends at the handshake's deadline at the latest.
func (f *Flow) rtoDelay() time.Duration {
	d := min(f.rtt.rto()<<min(f.backoff, 16), rtoMax)
	if f.state == stateEstablished && f.probeDue() {
		// RFC 8985 7.2: two round trips, and a delayed ACK's worth more
		// when one segment is in flight.
		pto := max(2*f.rtt.srtt, 10*time.Millisecond)
		if int(f.sndMax-f.sndUna) <= f.sendMSS {
			pto = max(pto, f.rtt.srtt*3/2+200*time.Millisecond)
		}
		d = min(d, pto)
	}
	if f.state == stateEstablished && f.headProbing() {
		d = min(d, max(f.lostWait()-f.now().Sub(f.headAt), time.Millisecond))
	}
	if f.state == stateEstablished && f.rack.timer > 0 {
		d = min(d, max(f.rack.timer-f.since(), time.Millisecond))
	}
	if f.state == stateSynRcvd && !f.hsDeadline.IsZero() {
		d = min(d, max(f.hsDeadline.Sub(f.now()), time.Millisecond))
	}
	return d
}

// headProbing reports whether, in recovery, the hole at sndUna is watched
// for its retransmission's loss (resendLost) rather than left to the RTO:
// up to maxHeadResends times a hole, so that a client that is gone still
// meets the RTO's backoff.
func (f *Flow) headProbing() bool {
	return f.inRecovery && f.headSeq == f.sndUna && f.headResends < maxHeadResends && f.sndUna != f.sndMax
}

// maxHeadResends bounds resendLost's copies of one hole.
const maxHeadResends = 3

// probeDue reports whether a tail loss probe is to go before the RTO: SACK
// agreed, data in flight, no recovery and no timeout yet, a round trip
// measured.
func (f *Flow) probeDue() bool {
	return f.tlpDue && f.sndUna != f.sndMax && !f.inRecovery && f.backoff == 0 && f.rtt.measured
}

// tailLossProbe sends the probe (RFC 8985 7.3): new data if the socket
// and the client's window have some, else the last segment's worth sent
// again, so that the client's answer SACKs it and shows a loss before it.
func (f *Flow) tailLossProbe() {
	f.tlpDue = false
	end := f.sndMax
	if f.finSeen {
		end-- // the FIN: sent again alone, below
	}
	if before := f.sndMax; f.sndNxt == f.sndMax {
		f.pump()
		if f.sndMax != before {
			f.tlpProbing, f.tlpEnd = true, f.sndMax
			return
		}
	}
	if f.sndNxt != f.sndMax {
		return
	}
	if int32(end-f.sndUna) <= 0 {
		if f.finSeen {
			f.resendFIN() // only the FIN is in flight: it is the probe (Linux's tcp_send_loss_probe sends the last skb, FIN and all)
			f.tlpProbing, f.tlpEnd = true, f.sndMax
		}
		return
	}
	n := min(int(end-f.sndUna), f.sendMSS)
	if f.resend(end-uint32(n), n) {
		f.tlpProbing, f.tlpEnd = true, end
	}
}

// ackDelay is how long the owner arms the ACK timer for: a held ACK's
// hold, or the next look at a short window (wndPolls), up to lookMax: a
// stalled endpoint costs a backed-off timer, not a 1 ms poll. The client
// probes a window too small to send into on its own as well (Linux's
// tcp_probe_timer), backed off to 120 s; the looks bound how late a stall's
// end is noticed.
func (f *Flow) ackDelay() time.Duration {
	if f.ackHeld {
		return AckDelay
	}
	return min(AckDelay<<f.wndPolls, lookMax)
}

// lookMax is the most a short window's looks back off to: lookSteps
// doublings of AckDelay.
const (
	lookMax   = time.Second
	lookSteps = 10
)

// FlushAck sends the held ACK, if the flow still holds one, or a window
// update once a short window can grow.
func (f *Flow) FlushAck() {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.state == stateClosed || f.detached:
	case f.ackHeld:
		f.ackHeld = false
		f.countHeld(heldExpired)
		f.sendAck()
	case f.wndShort && !f.sockFull && f.wndGrown():
		f.wndPolls = max(f.wndPolls-1, 0)
		f.sendAck()
	case f.wndShort:
		f.wndPolls = min(f.wndPolls+1, lookSteps)
	}
}

// Readable is the owner's report that the socket has more to read.
func (f *Flow) Readable() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.detached {
		return
	}
	f.pump()
}

// Writable is the owner's report that a full socket takes bytes again:
// the kept segments go in, then a window update, then duplicate ACKs so
// the client sends again what the full socket did not take without
// waiting for its timeout.
func (f *Flow) Writable() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sockFull || f.state == stateClosed || f.detached {
		return
	}
	f.sockFull = false
	if f.drainKept(); f.sockFull || f.state == stateClosed {
		return
	}
	for range 1 + dupAckThresh {
		f.sendAck()
	}
}

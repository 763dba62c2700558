package translate

// The sender: what the flow sends of the endpoint's bytes and when (RFC
// 9293 3.8.6.2, 3.10.7.4), the acknowledgments it takes, and loss recovery
// (RFC 5681 3.2, RFC 6582, RFC 6675); the window it sends into: cubic.go.

import (
	"errors"
	"sync"
	"time"
)

// bufPool holds the buffers segments with payload are built in.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 1<<16); return &b }}

// segmentMax is the most a segment of ours holds under host GSO: the
// largest IPv4 packet, within the TUN's gso_max_size (tunGSOMaxSize).
const segmentMax = 0xffff

// hdrLen is the length of the headers of the flow's data segments: they
// carry timestamps, if agreed, and no SACK blocks.
func (f *Flow) hdrLen() int {
	if f.ts {
		return f.w.IPLen() + tcpHeaderMin + 12
	}
	return f.w.IPLen() + tcpHeaderMin
}

// send builds and emits one segment at sndNxt without payload.
func (f *Flow) send(flags byte) {
	var b [ipv6Header + tcpHeaderMin + tcpOptionMax]byte
	f.sendAround(b[:], flags, 0)
}

// sendAround builds the headers of a segment at sndNxt in p, whose n bytes
// of payload are in place after them (hdrLen), and emits it; it carries
// the ACK of everything received so far. A segment without payload names
// what is kept past a gap in SACK blocks.
func (f *Flow) sendAround(p []byte, flags byte, n int) {
	var o [tcpOptionMax]byte
	opts := o[:0]
	blocks := sackMaxBlocks
	if f.ts {
		opts = tsOption(opts, f.tsNow(), f.tsRecent)
		blocks--
	}
	if n == 0 && f.sackOK && (f.kept.len() > 0 || f.dsackOn) {
		var b [sackMaxBlocks]seqRange
		bs := b[:0]
		if f.dsackOn {
			bs = append(bs, f.dsack) // RFC 2883 4: the D-SACK block first
			f.dsackOn = false
		}
		opts = sackOption(opts, f.kept.blocks(bs, blocks))
	}
	if f.ackHeld {
		f.countHeld(heldSuperseded) // this segment carries the held ACK
	}
	partial := f.gso && n > 0
	total := f.w.buildAround(p, f.sndNxt, f.rcvNxt, flags|tcpACK, f.window(), opts, n, partial)
	if partial {
		f.emitPartial(p[:total], f.hdrLen(), f.sendMSS)
	} else {
		f.emit(p[:total])
	}
	f.ackHeld = false
	f.unacked = 0
}

// build builds a segment in a pooled buffer and emits it.
func (f *Flow) build(seq uint32, flags byte, wnd uint16, opts, payload []byte) {
	bp := bufPool.Get().(*[]byte)
	n := f.w.Build(*bp, seq, f.rcvNxt, flags, wnd, opts, payload)
	f.emit((*bp)[:n])
	bufPool.Put(bp)
}

// sendAck sends a pure ACK now.
func (f *Flow) sendAck() { f.send(0) }

// ackInput processes the client's acknowledgment, SACK blocks and window
// (step 2). An acknowledgment up to sndMax counts, past a rewind's sndNxt
// too: the client got those bytes before the rewind.
func (f *Flow) ackInput(s Segment) {
	wnd := uint32(s.wnd) << f.sndShift
	d := int32(s.ack - f.sndUna)
	sackedBefore := 0
	if f.sackOK {
		sackedBefore = f.score.sacked(f.sndMax)
	}
	f.ackTS, f.ackEcr = f.ts && s.ts && s.tsEcr != 0, s.tsEcr
	switch {
	case d > 0:
		n := int(d)
		if f.finSeen && s.ack == f.sndMax {
			n-- // the FIN's own number
		}
		if n > 0 {
			if err := f.sock.Discard(n); err != nil {
				f.close(true)
				return
			}
			f.count(1, n)
		}
		f.sampleRTT(s)
		flight := int(f.sndMax - f.sndUna)
		f.sndUna = s.ack
		if int32(f.sndNxt-s.ack) < 0 {
			// Past a rewind's sndNxt: the peek offset, moved back by the
			// discard, stops at the queue's head, which is sndUna now.
			f.sndNxt = s.ack
			f.finSent = f.finSeen && s.ack == f.sndMax
		}
		f.score.ackedTo(s.ack)
		if f.sackOK {
			f.log.ackTo(s.ack, f.rackDelivered)
		}
		if int32(s.ack-f.tlpEnd) >= 0 {
			f.tlpProbing = false
		}
		f.tlpDue = f.sackOK // a new probe for what is still in flight
		f.progress = f.now()
		f.dupAcks, f.backoff, f.probes = 0, 0, 0
		f.retransAt = time.Time{}
		// A partial ACK's new hole was sent again in the rewind's pass, or
		// is about to be; its wait for resendLost starts now.
		f.headSeq, f.headAt, f.headResends = s.ack, f.now(), 0
		switch {
		case f.inRecovery && int32(s.ack-f.recover) >= 0:
			f.inRecovery = false // RFC 6582 3.2 step 3: a full acknowledgment
			f.cc.recovered()
			f.eifelUndo()
		case !f.inRecovery:
			f.cc.acked(int(d), flight, f.now(), f.pathRTT())
			if int32(f.sndUna-f.recover) > 0 {
				// Past the last recovery for good: recover follows, so
				// that sequence space does not wrap it ahead of sndUna
				// again after 2 GiB (as from the ISS it would, turning
				// off fast retransmit for the next 2 GiB).
				f.recover = f.sndUna - 1
			}
		}
		f.rtoArmed = f.sndUna != f.sndMax
		f.maybeDone()
	case d == 0 && len(s.payload) == 0 && s.flags&tcpFIN == 0 && wnd == f.sndWnd && f.sndMax != f.sndUna:
		f.dupAcks++ // RFC 5681 2's duplicate acknowledgment
	case d == 0 && f.sndMax == f.sndUna:
		f.probes = 0 // an answer to a window probe: the client is there (Linux's icsk_probes_out reset)
	}
	if d < 0 {
		return // an old acknowledgment: its window is old too
	}
	if int32(s.seq-f.sndWl1) > 0 || (s.seq == f.sndWl1 && int32(s.ack-f.sndWl2) >= 0) {
		f.sndWnd, f.sndWl1, f.sndWl2 = wnd, s.seq, s.ack // RFC 9293 3.10.7.4
		f.maxSndWnd = max(f.maxSndWnd, wnd)
	}
	if f.state != stateEstablished {
		return
	}
	if f.sackOK {
		end := f.sndMax
		if f.finSeen {
			end-- // the FIN is no byte to skip
		}
		for _, r := range s.sack[:s.nSack] {
			f.score.add(r, f.sndUna, end)
			f.log.sack(r, f.rackDelivered)
		}
		if s.nSack > 0 && f.isDSACK(s) {
			f.rackDSACK()
			f.dsackUndo(s.sack[0])
		}
		// A loss, with SACK: by RACK (rack.go), or by three duplicate
		// ACKs from a client that SACKs nothing (RFC 6675 5's fallback).
		if f.dupAcks >= f.dupThresh && int32(f.sndUna-f.recover) > 0 && !f.inRecovery &&
			f.score.sacked(f.sndMax) == 0 && f.log.n > 0 {
			f.log.markLost(f.log.slot(0))
			f.enterRecovery()
		}
		f.rackDetect()
		if f.inRecovery {
			// RFC 6937 3.1's DeliveredData: the cumulative ACK's
			// advance and the change in what is SACKed.
			f.prrAck(max(int(d), 0) + f.score.sacked(f.sndMax) - sackedBefore)
		}
		if f.inRecovery {
			f.resendLost()
		}
		return
	}
	// Without SACK, a loss is three duplicate ACKs (RFC 5681 3.2), not
	// before the last recovery's data is acknowledged (RFC 6582 3.2:
	// strictly past it, or the duplicates a rewind sent would start the
	// next one).
	if f.inRecovery {
		f.resendLost()
		return
	}
	if f.sndMax == f.sndUna {
		return
	}
	if f.dupAcks >= f.dupThresh && int32(f.sndUna-f.recover) > 0 {
		f.cc.lost()
		f.inRecovery, f.tlpProbing = true, false
		f.startUndo()
		f.rewind()
	}
}

// isDSACK reports whether s's first SACK block reports bytes the client
// got twice (RFC 2883 4): below its cumulative ACK, or inside its second
// block.
func (f *Flow) isDSACK(s Segment) bool {
	b := s.sack[0]
	if int32(b.end-b.start) <= 0 {
		return false
	}
	if int32(b.end-s.ack) <= 0 {
		return true
	}
	return s.nSack > 1 && int32(b.start-s.sack[1].start) >= 0 && int32(b.end-s.sack[1].end) <= 0
}

// spurious takes the proof that a reduction's retransmissions were not
// needed (dsackUndo, eifelUndo), so that the loss that caused it was a
// reordering: the window's reduction is undone and more reordering is
// allowed before the next loss is declared (RFC 2883 5, RFC 4015; Linux's
// tcp_try_undo_dsack, tcp_try_undo_recovery and tp->reordering).
func (f *Flow) spurious() {
	f.cc.undo()
	f.dupThresh = min(f.dupThresh*2, maxReordering)
	f.rack.reoSeen = true
}

// sampleRTT measures the round trip the acknowledgment s closes: by its
// timestamp echo (RFC 7323 4.1), else by the segment being timed, if s
// covers it and it was not sent twice (Karn's rule, RFC 6298 3).
func (f *Flow) sampleRTT(s Segment) {
	switch {
	case f.ts && s.ts && s.tsEcr != 0:
		if d := int32(f.tsNow() - s.tsEcr); d >= 0 {
			f.rtt.sample(time.Duration(d) * time.Millisecond)
		}
	case f.timing && int32(s.ack-f.rttSeq) >= 0:
		f.timing = false
		f.rtt.sample(f.now().Sub(f.rttAt))
	}
}

// pathRTT is the least round trip seen toward the client (RACK's, with
// SACK), else the smoothed one: what CUBIC's curve looks ahead by
// (tcp_cubic.c's delay_min).
func (f *Flow) pathRTT() time.Duration {
	if f.rack.minRTT > 0 {
		return f.rack.minRTT
	}
	return f.rtt.srtt
}

// pipe is RFC 6675 4's estimate of the bytes in flight: what was sent
// and is neither acknowledged nor SACKed nor taken for lost. What a rewind
// goes back over counts as lost until it is sent again.
func (f *Flow) pipe() int {
	if f.sackOK {
		return f.log.flight
	}
	return int(f.sndNxt-f.sndUna) - f.score.sacked(f.sndNxt)
}

// noteSent moves sndMax up to sndNxt.
func (f *Flow) noteSent() {
	if int32(f.sndNxt-f.sndMax) > 0 {
		f.sndMax = f.sndNxt
	}
	if f.finSent {
		f.finSeen = true
	}
}

// pump sends what the socket holds and the client's window and the
// congestion window take, from sndNxt: after a rewind, what the client
// has not SACKed.
func (f *Flow) pump() {
	var bp *[]byte
	defer func() {
		if bp != nil {
			bufPool.Put(bp)
		}
	}()
	if f.sackOK {
		f.sendLost() // what RACK took for lost goes before new data
	}
	for f.state == stateEstablished && !f.finSent {
		if f.sackOK && f.sndNxt == f.sndMax && f.log.full() {
			return // the sent log's bound: the client's ACKs free records
		}
		limit := 0 // how far before the next SACKed range, 0: no limit
		if int32(f.sndNxt-f.sndMax) < 0 {
			from, l := f.score.skip(f.sndNxt)
			if from != f.sndNxt {
				f.sndNxt = from
				if err := f.sock.SetPeekOffset(int(f.sndNxt - f.sndUna)); err != nil {
					f.close(true)
					return
				}
			}
			limit = l
		}
		room := int(int32(f.sndUna + f.sndWnd - f.sndNxt))
		if room <= 0 {
			if f.sndWnd == 0 && f.sndUna == f.sndNxt && f.pending() {
				f.rtoArmed = true // a persist probe (onRTO)
			}
			return
		}
		if room < f.sendMSS && 2*room < int(f.maxSndWnd) && f.sndNxt != f.sndUna {
			return // RFC 9293 3.8.6.2.1: no sliver of the client's window while ACKs are due
		}
		pipe := f.pipe()
		cwnd := f.budget()
		if cwnd < f.sendMSS {
			if pipe > 0 || (f.sackOK && f.inRecovery) {
				return // the ACKs in flight open the congestion window
			}
			cwnd = f.sendMSS
		}
		if bp == nil {
			bp = bufPool.Get().(*[]byte)
		}
		hl := f.hdrLen()
		n := min(room, cwnd, f.maxSegment(), len(*bp)-hl)
		if n >= f.sendMSS && (n == room || n == cwnd) {
			// Whole segments while a window is what stops the send (Linux's
			// tcp_mss_split_point): the rest waits for the next ACK. A runt
			// for a window's odd bytes costs a packet, and the client's
			// memory a buffer, for a fraction of a segment.
			n -= n % f.sendMSS
		}
		if limit > 0 {
			n = min(n, limit)
		}
		r, err := f.sock.Peek((*bp)[hl : hl+n]) // the payload's place in the segment

		switch {
		case errors.Is(err, ErrSocketEmpty):
			return
		case err != nil:
			f.close(true)
			return
		case r == 0: // EOF, every byte before it sent
			f.send(tcpFIN)
			f.sndNxt++
			f.finSent = true
			f.noteSent()
			f.rtoArmed = true
			f.maybeDone()
			return
		}
		now := f.now()
		if f.sndUna == f.sndMax && !f.lastSend.IsZero() {
			f.cc.restart(now.Sub(f.lastSend), now)
		}
		f.lastSend = now
		if f.sndUna == f.sndNxt {
			f.progress = now // a new flight
			f.tlpDue = f.sackOK
		}
		if f.sndNxt == f.sndMax && !f.ts && !f.timing {
			f.timing, f.rttSeq, f.rttAt = true, f.sndNxt+uint32(r), now
		}
		if f.sndNxt == f.sndUna && f.sndNxt != f.sndMax {
			f.headSeq, f.headAt, f.headResends = f.sndNxt, now, 0 // the hole at sndUna sent again
		}
		if int32(f.sndNxt-f.sndMax) < 0 {
			f.noteRetrans(r) // a rewind's pass
		}
		f.sendAround(*bp, 0x08, r) // PSH
		f.noteOut(r)
		if f.sackOK {
			f.log.sent(f.sndNxt, f.sndNxt+uint32(r), f.since(), f.sendMSS)
		}
		f.sndNxt += uint32(r)
		f.noteSent()
		f.rtoArmed = true
		// A short peek does not end the loop: the endpoint's FIN may have
		// come with the bytes, and no readiness would follow it.
	}
}

// pending reports whether the socket holds bytes past sndNxt, or its EOF,
// that wait for the client's window to open: a persist probe is due then,
// and only then. The peek offset is put back.
func (f *Flow) pending() bool {
	var b [1]byte
	n, err := f.sock.Peek(b[:])
	if err != nil {
		return false
	}
	if n > 0 {
		_ = f.sock.SetPeekOffset(int(f.sndNxt - f.sndUna))
	}
	return true
}

// resend sends n bytes from start again, one segment, out of the way of
// sndNxt and the peek offset, which it puts back; it reports whether it
// sent any.
func (f *Flow) resend(start uint32, n int) bool {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	hl := f.hdrLen()
	if err := f.sock.SetPeekOffset(int(start - f.sndUna)); err != nil {
		f.close(true)
		return false
	}
	r, err := f.sock.Peek((*bp)[hl : hl+n])
	if err == nil && r > 0 {
		next := f.sndNxt
		f.sndNxt = start
		f.sendAround(*bp, tcpPSH, r)
		f.sndNxt = next
		f.noteOut(r)
		f.noteRetrans(r)
		if f.sackOK {
			f.log.sent(start, start+uint32(r), f.since(), f.sendMSS)
		}
	}
	if err := f.sock.SetPeekOffset(int(f.sndNxt - f.sndUna)); err != nil {
		f.close(true)
		return false
	}
	return err == nil && r > 0
}

// resendLost sends the segment at sndUna again when, in recovery, it is
// still missing a while after it was last sent while the client's ACKs
// keep coming: its retransmission was lost too. Without it, every lost
// retransmission cost an RTO; RACK (RFC 8985 6.2) detects it by send
// times, which the flow does not keep, so the wait is two round trips from
// the last send of that segment, at least 2 ms. When all that is missing
// is our FIN, the FIN goes again (a client drops one that comes after a
// later copy of the data before it, as RFC 7323 5's PAWS check does). A
// hole it cannot send (the client SACKed sndUna itself, the socket failed
// the peek) is left to the RTO: the timer never fires for nothing.
func (f *Flow) resendLost() {
	now := f.now()
	if !f.headProbing() || now.Sub(f.headAt) < f.lostWait() {
		return
	}
	f.headAt = now
	f.headResends++
	if f.finSeen && f.sndUna == f.sndMax-1 {
		f.resendFIN()
		return
	}
	end := f.sndMax
	if f.finSeen {
		end--
	}
	from, limit := f.score.skip(f.sndUna)
	if from != f.sndUna || int32(end-f.sndUna) <= 0 {
		f.headResends = maxHeadResends
		return
	}
	n := min(int(end-f.sndUna), f.sendMSS)
	if limit > 0 {
		n = min(n, limit)
	}
	if !f.resend(f.sndUna, n) {
		f.headResends = maxHeadResends
	}
}

// resendFIN sends our FIN again, at its own sequence number, out of the
// way of sndNxt.
func (f *Flow) resendFIN() {
	next := f.sndNxt
	f.sndNxt = f.sndMax - 1
	f.send(tcpFIN)
	f.sndNxt = next
}

// lostWait is how long a hole sent again may stay open before resendLost
// takes its copy for lost: two round trips, 2 ms at least.
func (f *Flow) lostWait() time.Duration { return max(2*f.rtt.srtt, 2*time.Millisecond) }

// startUndo starts the count of what the reduction beginning now sends
// again (a recovery or a timeout).
func (f *Flow) startUndo() {
	f.undoOn, f.undoMarker, f.undoRetrans, f.undoSent = true, f.sndUna, 0, false
}

// noteRetrans counts n bytes sent again in a recovery or after a timeout,
// toward the undo.
func (f *Flow) noteRetrans(n int) {
	if !f.undoOn || (!f.inRecovery && f.backoff == 0) {
		return
	}
	f.undoRetrans += (n + f.sendMSS - 1) / f.sendMSS
	if !f.undoSent {
		f.undoTS, f.undoSent = f.tsNow(), true
	}
}

// dsackUndo takes a D-SACK block b: once every segment the reduction sent
// again was reported twice, none was lost (Linux's tcp_try_undo_dsack:
// undo_retrans reaching 0).
func (f *Flow) dsackUndo(b seqRange) {
	if !f.undoOn || !f.undoSent || int32(b.start-f.undoMarker) < 0 {
		return
	}
	f.undoRetrans -= max(int(b.end-b.start)/f.sendMSS, 1)
	if f.undoRetrans <= 0 {
		f.undoOn = false
		f.spurious()
	}
}

// eifelUndo is the end of a recovery: the ACK's timestamp echo older than
// the first segment sent again means the originals arrived (RFC 3522;
// Linux's tcp_packet_delayed).
func (f *Flow) eifelUndo() {
	if f.undoOn && f.undoSent && f.ackTS && int32(f.ackEcr-f.undoTS) < 0 {
		f.undoOn = false
		f.spurious()
	}
}

// rewind goes back to the acknowledged point and sends again from there
// what the client has not SACKed.
func (f *Flow) rewind() {
	if err := f.sock.SetPeekOffset(0); err != nil {
		f.close(true)
		return
	}
	f.sndNxt = f.sndUna
	f.finSent = false
	f.recover = f.sndMax
	f.dupAcks = 0
	f.timing = false // Karn's rule: nothing sent twice is timed
	f.pump()
}

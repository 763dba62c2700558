package translate

// The receiver: what the flow takes of the client's bytes, and the window
// it offers (RFC 9293 3.8.6, 3.10.7.4). Segments past a gap: sack.go.

// window is the window field of our next segment.
//
// The window follows the socket's free space, so that the client sends no
// more than the socket takes (pasta's way): what is left of the last offer
// while that is at least half of rcvWnd, else the socket's space, asked
// for then. An offer is never taken back (RFC 9293 3.8.6.2.2): the right
// edge only moves right.
func (f *Flow) window() uint16 {
	if f.sockFull {
		return 0
	}
	left := int(int32(f.rcvAdv - f.rcvNxt))
	if left < int(f.maxWnd)/2 {
		if sp, err := f.sock.Space(); err == nil {
			left = max(left, min(sp, int(f.maxWnd)))
		}
	}
	w := min(left>>f.rcvShift, 0xffff)
	if edge := f.rcvNxt + uint32(w<<f.rcvShift); int32(edge-f.rcvAdv) > 0 {
		f.rcvAdv = edge
	}
	f.wndShort = int32(f.rcvAdv-f.rcvNxt) < int32(min(f.maxWnd/2, uint32(2*f.mss)))
	return uint16(w)
}

// wndGrown reports whether the socket's free space now moves the window's
// right edge far enough to be worth an update: by a quarter of rcvWnd, or
// two full segments if that is less (RFC 9293 3.8.6.2.2's receiver-side
// silly window avoidance asks for one, or half the buffer).
func (f *Flow) wndGrown() bool {
	sp, err := f.sock.Space()
	if err != nil {
		return false
	}
	edge := f.rcvNxt + uint32(min(sp, int(f.maxWnd)))
	return int32(edge-f.rcvAdv) >= int32(min(f.maxWnd/4, uint32(2*f.mss)))
}

// acceptable is RFC 9293 3.10.7.4's first check, made loose at the left
// edge (a segment sent again, whose ACK may be news, is taken up to a
// window back), and RFC 7323 5.3's PAWS: a timestamp older than the last
// one taken is a segment of a past flight.
func (f *Flow) acceptable(s Segment) bool {
	if f.ts && s.ts && int32(s.tsVal-f.tsRecent) < 0 {
		return false
	}
	end := s.seq + uint32(len(s.payload))
	return int32(end-(f.rcvNxt-f.maxWnd)) >= 0 && int32(s.seq-f.rcvAdv) <= 0
}

// dataInput writes the client's payload to the socket and takes its FIN
// (steps 1 and 3).
func (f *Flow) dataInput(s Segment) {
	if f.sockFull && f.sock.Writable() {
		f.sockFull = false // the client's probe or retransmission found it drained
	}
	fin := s.flags&tcpFIN != 0
	if len(s.payload) == 0 && !fin {
		if int32(s.seq-f.rcvNxt) < 0 {
			f.sendAck() // RFC 9293 3.10.7.4: a keep-alive is answered
		}
		return
	}
	if f.finIn {
		f.sendAck() // sent again: a duplicate ACK
		return
	}
	if d := int(int32(f.rcvNxt - s.seq)); d > 0 { // sent again, at least in part
		// RFC 2883: the bytes we had already are reported in a D-SACK
		// block, so that the client can tell a needless retransmission.
		f.dsack, f.dsackOn = seqRange{s.seq, s.seq + uint32(min(d, len(s.payload)))}, f.sackOK && len(s.payload) > 0
		if d > len(s.payload) || (d == len(s.payload) && !fin) {
			f.sendAck()
			return
		}
		s.payload, s.seq = s.payload[d:], f.rcvNxt
	}
	if s.seq != f.rcvNxt {
		if !f.sockFull && f.kept.keep(s.seq, s.payload, f.rcvAdv) && f.sackOK {
			// RFC 2883 4.1.2: a duplicate past the cumulative ACK is named
			// in a D-SACK block, the SACK block holding it next, so that
			// the client can tell its retransmission was needless and
			// undo (Linux's tcp_data_queue_ofo, tcp_dsack_set).
			f.dsack, f.dsackOn = seqRange{s.seq, s.seq + uint32(len(s.payload))}, true
		}
		f.sendAck() // past a gap: a duplicate ACK at once (RFC 5681 4.2), with SACK blocks
		return
	}
	if len(s.payload) > 0 {
		if f.sockFull {
			f.sendAck() // the window was 0: nothing taken
			return
		}
		if !f.deliver(s.payload) {
			return
		}
		filled := f.drainKept()
		if f.state == stateClosed || f.sockFull {
			return
		}
		// A segment that fills a gap is acknowledged at once, and at least
		// every second full-sized one (RFC 5681 4.2); the rest waits for an
		// answer to carry it.
		if f.unacked += len(s.payload); filled || f.unacked >= 2*f.mss {
			f.sendAck()
		} else {
			f.ackHeld = true
		}
	}
	if fin {
		f.finIn = true
		f.rcvNxt++
		_ = f.sock.ShutdownWrite()
		if f.finSent {
			f.sendAck()
		} else {
			// The FIN's ACK waits, as the gate holds gVisor's (netstack's ackhold.go),
			// for our FIN to carry it: the endpoint answers the half-close
			// with its own, mostly at once.
			f.ackHeld = true
		}
		f.maybeDone()
	}
}

// deliver writes in-order payload p to the socket; it reports false when
// the socket did not take all of it (now full, acknowledged with a zero
// window) or failed (the flow is reset). The segments kept past a gap
// stay: the client was told it has them (SACK), and takes that back only
// after a timeout (RFC 2018 8).
func (f *Flow) deliver(p []byte) bool {
	n, err := f.sock.Write(p)
	f.rcvNxt += uint32(n)
	f.count(0, n)
	if err != nil {
		f.close(true)
		return false
	}
	if n < len(p) {
		f.sockFull = true
		f.sendAck() // the window is 0 now
		return false
	}
	return true
}

// drainKept writes the kept segments the gap's filling made in order; it
// reports whether it wrote any.
func (f *Flow) drainKept() bool {
	wrote := false
	for f.state != stateClosed && !f.sockFull {
		k, ok := f.kept.next(f.rcvNxt)
		if !ok {
			break
		}
		if d := int(int32(f.rcvNxt - k.seq)); d < len(k.b) {
			wrote = true
			f.deliver(k.b[d:])
		}
	}
	return wrote
}

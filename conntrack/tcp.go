package conntrack

// TCP connection tracking, after Linux net/netfilter/nf_conntrack_proto_tcp.c
// (the 6.1 logic: nf_conntrack_tcp_packet, tcp_new, tcp_in_window,
// nf_tcp_handle_invalid), with nf_conntrack_tcp_loose=0, no NAT sequence
// adjustment, no window-check bypass, and tcp_ignore_invalid_rst=0.
//
// 1. Classify the segment by its flags (get_conntrack_index).
// 2. Look up the next state in the transition table for the direction.
// 3. Handle the table's special outcomes: ignored segments, invalid ones,
//    reopened connections, simultaneous open, challenge ACKs, RST checks.
// 4. Check the segment against the window (tcp_in_window's four bounds).
// 5. Commit the state, pick the timeout, set ASSURED.

// Flags of one direction's window tracking (ip_ct_tcp_state.flags, the
// kernel's IP_CT_TCP_FLAG_* values).
const (
	peerWindowScale = 0x01 // sent the window scale option
	peerSackPerm    = 0x02 // sent SACK permitted
	peerCloseInit   = 0x04 // sent the first FIN
	peerBeLiberal   = 0x08 // window tracking off for this side (never set: loose=0)
	peerDataUnack   = 0x10 // has data the other side has not acknowledged
	peerMaxAckSet   = 0x20 // maxAck holds a value
)

// Flags of the connection (ip_ct_tcp.last_flags): the kernel keeps them next
// to the annotated options of an ignored SYN.
const (
	connChallengeACK = 0x40 // IP_CT_EXP_CHALLENGE_ACK
	connSimOpen      = 0x80 // IP_CT_TCP_SIMULTANEOUS_OPEN
)

// tcpPeer is one direction's window tracking (struct ip_ct_tcp_state).
type tcpPeer struct {
	end    uint32 // highest seq+len sent (td_end)
	maxEnd uint32 // highest ack+window the other side allowed (td_maxend)
	maxWin uint32 // largest window seen from this side (td_maxwin)
	maxAck uint32 // highest ack this side sent (td_maxack)
	scale  uint8  // window scale (td_scale)
	flags  uint8  // peer* bits
}

// tcpConn is the TCP part of an entry (struct ip_ct_tcp).
type tcpConn struct {
	seen       [2]tcpPeer // indexed by Direction
	lastSeq    uint32
	lastAck    uint32
	lastEnd    uint32
	lastWin    uint16
	state      TCPState
	lastDir    Direction
	lastIndex  uint8
	retrans    uint8
	lastWscale uint8
	lastFlags  uint8 // annotated peer* options of an ignored SYN, plus conn* bits
}

// Segment classes (enum tcp_bit_set), the middle index of tcpTransitions.
const (
	idxSYN = iota
	idxSYNACK
	idxFIN
	idxACK
	idxRST
	idxNone
	numIdx
)

// tcpIndex is get_conntrack_index: RST wins, then SYN (with or without ACK),
// then FIN, then ACK.
func tcpIndex(flags uint8) uint8 {
	switch {
	case flags&flagRST != 0:
		return idxRST
	case flags&flagSYN != 0:
		if flags&flagACK != 0 {
			return idxSYNACK
		}
		return idxSYN
	case flags&flagFIN != 0:
		return idxFIN
	case flags&flagACK != 0:
		return idxACK
	}
	return idxNone
}

// Pseudo-states of the transition table: sIV and sIG in the kernel.
const (
	tIV = TCPState(numTCPStates)     // invalid segment
	tIG = TCPState(numTCPStates + 1) // ignore: may be valid, state unchanged
)

// tcpTransitions is the kernel's tcp_conntracks table: the next state for a
// segment of class idx, in direction dir, arriving in state s, as
// tcpTransitions[dir][idx][s]. Columns are NONE, SYN_SENT, SYN_RECV,
// ESTABLISHED, FIN_WAIT, CLOSE_WAIT, LAST_ACK, TIME_WAIT, CLOSE, SYN_SENT2.
var tcpTransitions = func() (t [2][numIdx][numTCPStates]TCPState) {
	const (
		no, ss, sr, es = TCPNone, TCPSynSent, TCPSynRecv, TCPEstablished
		fw, cw, la, tw = TCPFinWait, TCPCloseWait, TCPLastAck, TCPTimeWait
		cl, s2, iv, ig = TCPClose, TCPSynSent2, tIV, tIG
	)
	_ = no
	t[Original] = [numIdx][numTCPStates]TCPState{
		idxSYN:    {ss, ss, ig, ig, ig, ig, ig, ss, ss, s2},
		idxSYNACK: {iv, iv, sr, iv, iv, iv, iv, iv, iv, sr},
		idxFIN:    {iv, iv, fw, fw, la, la, la, tw, cl, iv},
		idxACK:    {es, iv, es, es, cw, cw, tw, tw, cl, iv},
		idxRST:    {iv, cl, cl, cl, cl, cl, cl, cl, cl, cl},
		idxNone:   {iv, iv, iv, iv, iv, iv, iv, iv, iv, iv},
	}
	t[Reply] = [numIdx][numTCPStates]TCPState{
		idxSYN:    {iv, s2, iv, iv, iv, iv, iv, ss, iv, s2},
		idxSYNACK: {iv, sr, ig, ig, ig, ig, ig, ig, ig, sr},
		idxFIN:    {iv, iv, fw, fw, la, la, la, tw, cl, iv},
		idxACK:    {iv, ig, sr, es, cw, cw, tw, tw, cl, ig},
		idxRST:    {iv, cl, cl, cl, cl, cl, cl, cl, cl, cl},
		idxNone:   {iv, iv, iv, iv, iv, iv, iv, iv, iv, iv},
	}
	return t
}()

// tcpMaxRetrans is nf_conntrack_tcp_max_retrans.
const tcpMaxRetrans = 3

// maxAckWinConst is the kernel's MAXACKWINCONST: the least slack allowed
// below the receiver's end for an acknowledgement (bound IV).
const maxAckWinConst = 66000

// outcome is what processing a packet on an existing entry decided.
type outcome uint8

const (
	// accepted: counted, timeout refreshed.
	outAccept outcome = iota
	// accepted without refreshing or counting (the kernel returns NF_ACCEPT
	// before nf_ct_refresh_acct: ignored segments, a retransmitted SYN).
	outPass
	// invalid; the reason goes with it.
	outInvalid
	// accepted and counted, then the entry is removed (RST before any reply).
	outKill
	// the entry is removed and the packet classified again as if none had
	// existed (a SYN reopening a closed connection: the kernel's NF_REPEAT).
	outRepeat
)

// tcpNew initialises a connection from its first segment, a SYN, as the
// kernel's tcp_new does. With loose=0 nothing else can start a connection;
// Classify never offers anything else to Confirm.
func tcpNew(c *tcpConn, s *segment) {
	*c = tcpConn{}
	p := &c.seen[Original]
	p.end = segEnd(s)
	p.maxWin = max(uint32(s.win), 1)
	p.maxEnd = p.end
	applyOptions(p, s)
	c.lastIndex = idxNone
}

// segEnd is segment_seq_plus_len: the sequence number after the segment,
// counting SYN and FIN.
func segEnd(s *segment) uint32 {
	end := s.seq + s.payload
	if s.flags&flagSYN != 0 {
		end++
	}
	if s.flags&flagFIN != 0 {
		end++
	}
	return end
}

// applyOptions is the kernel's tcp_options on one side: a header without
// options leaves the side untouched; otherwise scale and option flags are
// replaced by what this header carries (liberal mode kept).
func applyOptions(p *tcpPeer, s *segment) {
	if s.opts&optPresent == 0 {
		return
	}
	p.scale = 0
	p.flags &= peerBeLiberal
	if s.opts&optSackPerm != 0 {
		p.flags |= peerSackPerm
	}
	if s.opts&optWScale != 0 {
		p.scale = min(s.wscale, 14) // RFC 7323 section 2.3
		p.flags |= peerWindowScale
	}
}

// tcpPacket runs one segment through the connection state of e, the way
// nf_conntrack_tcp_packet does for a confirmed connection. On outAccept and
// outKill it has already refreshed e; the caller sets SEEN_REPLY.
func (t *Table) tcpPacket(sh *shard, e *entry, dir Direction, s *segment, now int64) (outcome, Reason) {
	c := &e.tcp
	old := c.state
	idx := tcpIndex(s.flags)
	next := tcpTransitions[dir][idx][old]
	other := 1 - dir
	skipWindow := false

	switch next {
	case TCPSynSent:
		if old < TCPTimeWait {
			break
		}
		// A SYN in TIME_WAIT or CLOSE: RFC 1122 lets it reopen the
		// connection; the kernel then deletes the entry and looks the
		// packet up again, when the close was orderly (a FIN was seen) or
		// this side sent the RST.
		if (c.seen[dir].flags|c.seen[other].flags)&peerCloseInit != 0 ||
			(c.lastDir == dir && c.lastIndex == idxRST) {
			return outRepeat, ReasonNone
		}
		if !tcpIgnore(c, old, idx, dir, s) {
			return outPass, ReasonNone
		}
		old, next = TCPSynSent, TCPSynRecv
	case tIG:
		if !tcpIgnore(c, old, idx, dir, s) {
			return outPass, ReasonNone
		}
		old, next = TCPSynSent, TCPSynRecv
	case tIV:
		return outInvalid, ReasonStateMachine
	case TCPTimeWait:
		// An RFC 5961 challenge ACK answering a SYN that hit LAST_ACK does
		// not acknowledge the last FIN.
		if old == TCPLastAck && idx == idxACK && c.lastDir != dir &&
			c.lastIndex == idxSYN && c.lastFlags&connChallengeACK != 0 {
			c.lastFlags &^= connChallengeACK
			return outPass, ReasonNone
		}
	case TCPSynSent2:
		// The table cannot tell a simultaneous open from a normal one later.
		c.lastFlags |= connSimOpen
	case TCPSynRecv:
		if dir == Reply && idx == idxACK && c.lastFlags&connSimOpen != 0 {
			next = TCPEstablished
		}
	case TCPClose:
		if idx != idxRST {
			break
		}
		if tcpCanEarlyDrop(old) {
			// Closing anyway, and the tuple may already be reused: accept
			// without validation.
			skipWindow = true
			break
		}
		// Each break below leaves the switch for the window check, as the
		// kernel's does.
		if c.seen[other].flags&peerMaxAckSet != 0 && c.lastIndex != idxSYN {
			established := old == TCPEstablished && e.status&StatusAssured != 0
			if s.seq == 0 && !established {
				break // most likely the answer to a SYN we let through
			}
			if seqBefore(s.seq, c.seen[other].maxAck) {
				return outInvalid, ReasonOutOfWindow // "invalid rst"
			}
			if !established || s.seq == c.seen[other].maxAck {
				break
			}
			if c.lastIndex == idxACK && c.lastDir == dir && s.seq == c.lastEnd {
				break // the RST right after this side's last data segment
			}
			// Not the exact sequence number: keep the state so the peer
			// can answer with a challenge ACK.
			next = old
		}
		if ((e.status&StatusSeenReply != 0 && c.lastIndex == idxSYN) ||
			(e.status&StatusAssured == 0 && c.lastIndex == idxACK)) &&
			s.ack == c.lastEnd {
			// The RST answers a SYN or ACK we let through while out of
			// sync: it may acknowledge what we never tracked.
			skipWindow = true
			break
		}
		if old == TCPSynSent && c.lastIndex == idxACK && c.lastDir == Reply && s.seq == c.lastAck {
			// The RST answers a challenge ACK we let through.
			skipWindow = true
		}
	}

	if !skipWindow {
		switch t.tcpInWindow(c, dir, idx, s) {
		case winIgnore:
			return outPass, ReasonNone
		case winInvalid:
			t.tcpHandleInvalid(e, dir, idx, now, sh)
			return outInvalid, ReasonOutOfWindow
		}
	}

	// In window from here on.
	c.lastIndex = idx
	c.lastDir = dir
	c.state = next
	if old != next && next == TCPFinWait {
		c.seen[dir].flags |= peerCloseInit
	}
	timeout := t.tcpTimeout(c, next, idx)

	if e.status&StatusSeenReply == 0 {
		if s.flags&flagRST != 0 {
			// Only a RST came back, or the client gave up: no connection
			// worth keeping (nf_ct_kill_acct).
			t.refresh(sh, e, dir, s, now, timeout)
			return outKill, ReasonNone
		}
		if idx == idxSYN && old == TCPSynSent {
			// A retransmitted SYN does not extend the entry's life, or a
			// client reusing its port could keep it forever.
			return outPass, ReasonNone
		}
		if next == TCPEstablished && timeout > t.tcpTO[toUnack] {
			timeout = t.tcpTO[toUnack]
		}
	} else if e.status&StatusAssured == 0 && (old == TCPSynRecv || old == TCPEstablished) && next == TCPEstablished {
		t.setAssured(sh, e)
	}
	t.refresh(sh, e, dir, s, now, timeout)
	return outAccept, ReasonNone
}

// tcpIgnore handles the table's "ignore" outcome (the kernel's
// TCP_CONNTRACK_IGNORE case): the segment passes without changing the state,
// but is remembered, so that a SYN/ACK answering an ignored SYN can
// resynchronise the entry with what client and server actually agreed.
//
// It returns resync when the segment is that SYN/ACK: the caller then goes on
// as for a SYN_SENT -> SYN_RECV transition.
func tcpIgnore(c *tcpConn, old TCPState, idx uint8, dir Direction, s *segment) (resync bool) {
	if idx == idxSYNACK && c.lastIndex == idxSYN && c.lastDir != dir && s.ack == c.lastEnd {
		// Both ends are in sync on a new connection; we are not. Take the
		// ignored SYN's annotations as the originator's state and continue
		// as a SYN_SENT -> SYN_RECV transition.
		p := &c.seen[c.lastDir]
		p.end = c.lastEnd
		p.maxEnd = c.lastEnd
		p.maxWin = max(uint32(c.lastWin), 1)
		p.scale = c.lastWscale
		c.lastFlags &^= connChallengeACK
		p.flags = c.lastFlags &^ (connChallengeACK | connSimOpen)
		q := &c.seen[dir]
		*q = tcpPeer{flags: q.flags & peerBeLiberal}
		return true
	}
	c.lastIndex = idx
	c.lastDir = dir
	c.lastSeq = s.seq
	c.lastEnd = segEnd(s)
	c.lastWin = s.win
	if idx == idxSYN && dir == Original {
		// Annotate the SYN's options for a possible resync.
		var p tcpPeer
		applyOptions(&p, s)
		c.lastFlags = 0
		c.lastWscale = 0
		if p.flags&peerWindowScale != 0 {
			c.lastFlags |= peerWindowScale
			c.lastWscale = p.scale
		}
		if p.flags&peerSackPerm != 0 {
			c.lastFlags |= peerSackPerm
		}
		if old == TCPLastAck {
			// The server may answer with a challenge ACK, which must not
			// be taken for the ACK of the last FIN.
			c.lastFlags |= connChallengeACK
		}
	}
	if old == TCPSynSent && idx == idxACK && dir == Reply {
		// Possibly a challenge ACK answering the SYN.
		c.lastAck = s.ack
	}
	return false
}

// windowResult is tcp_in_window's verdict (enum nf_ct_tcp_action).
type windowResult uint8

const (
	winAccept windowResult = iota
	winIgnore
	winInvalid
)

// tcpInWindow is the kernel's tcp_in_window: it checks the segment against
// the four bounds of "Real Stateful TCP Packet Filtering in IP Filter"
// (van Rooij), as refined in Linux 6.1, and on success updates both sides'
// tracking:
//
//	I.   seq <= sender.maxEnd                  (upper bound for data)
//	II.  seq+len >= sender.end - receiver.maxWin (lower bound for data)
//	III. sack <= receiver.end                  (upper bound for the ack)
//	IV.  sack >= receiver.end - MAXACKWINDOW   (lower bound for the ack)
//
// where sack is the highest SACK right edge when the receiver allowed SACK,
// else the ack. Failing I (beyond a small overshoot) or III is INVALID;
// failing II or IV only stops the update (the kernel's NFCT_TCP_IGNORE), as
// does a small overshoot of I. In liberal mode every failure is accepted
// without the update.
func (t *Table) tcpInWindow(c *tcpConn, dir Direction, idx uint8, s *segment) windowResult {
	sender, receiver := &c.seen[dir], &c.seen[1-dir]
	seq, ack := s.seq, s.ack
	sack := ack
	if receiver.flags&peerSackPerm != 0 {
		sack = s.sack
	}
	win := uint32(s.win)
	end := segEnd(s)
	syn, hasAck := s.flags&flagSYN != 0, s.flags&flagACK != 0

	if sender.maxWin == 0 {
		if syn {
			// SYN/ACK answering the SYN, or the reply side's SYN in a
			// simultaneous open.
			tcpInitSender(sender, receiver, s, end, win, dir)
			if !hasAck {
				return winAccept
			}
		} else {
			// Mid-stream: learn what we can from this segment.
			sender.end = end
			sender.maxWin = max(win<<sender.scale, 1)
			sender.maxEnd = end + sender.maxWin
			if receiver.maxWin == 0 {
				// Nothing seen the other way yet: make III and IV pass.
				receiver.end = sack
				receiver.maxEnd = sack
			} else if sack == receiver.end+1 {
				// Likely the answer to a keepalive.
				receiver.end++
			}
		}
	} else if syn && seqAfter(end, sender.end) && (c.state == TCPSynSent || c.state == TCPSynRecv) {
		// RFC 793: a reinitialised TCP may start over with higher
		// sequence numbers. Re-learn this side from the new SYN(/ACK).
		tcpInitSender(sender, receiver, s, end, win, dir)
		if dir == Reply && !hasAck {
			return winAccept
		}
	}

	if !hasAck {
		// No ACK: pretend it acknowledged everything.
		ack = receiver.end
		sack = ack
	} else if s.flags&flagRST != 0 && ack == 0 {
		// Stacks that set ACK on a RST with a zero ack number.
		ack = receiver.end
		sack = ack
	}
	if s.flags&flagRST != 0 && seq == 0 && c.state == TCPSynSent {
		// A RST answering the SYN.
		seq = sender.end
		end = sender.end
	}

	maxAckWin := max(sender.maxWin, maxAckWinConst)
	if !seqBefore(seq, sender.maxEnd+1) { // bound I
		overshot := end - sender.maxEnd + 1
		ackOK := seqAfter(sack, receiver.end-maxAckWin-1)
		inRecv := receiver.maxWin != 0 && seqAfter(end, sender.end-receiver.maxWin-1)
		if inRecv && ackOK && overshot <= receiver.maxWin && seqBefore(sack, receiver.end+1) {
			// A sender exceeding the window by a little: remember the
			// data so its ACK does not look like one for data never sent.
			sender.end = end
			sender.flags |= peerDataUnack
			return t.windowFail(sender, winIgnore)
		}
		return t.windowFail(sender, winInvalid)
	}
	if !seqBefore(sack, receiver.end+1) { // bound III
		return t.windowFail(sender, winInvalid)
	}
	if receiver.maxWin != 0 && !seqAfter(end, sender.end-receiver.maxWin-1) { // bound II
		return t.windowFail(sender, winIgnore)
	}
	if !seqAfter(sack, receiver.end-maxAckWin-1) { // bound IV
		return t.windowFail(sender, winIgnore)
	}

	// Not the kernel's: what Result.LoneSegment reports, read before the
	// update below.
	s.lone = !syn && s.flags&flagRST == 0 && end != seq && seq == sender.end && sender.flags&peerDataUnack == 0
	if !syn {
		win <<= sender.scale // RFC 7323: windows in SYNs are never scaled
	}
	if swin := win + (sack - ack); sender.maxWin < swin {
		sender.maxWin = swin
	}
	if seqAfter(end, sender.end) {
		sender.end = end
		sender.flags |= peerDataUnack
	}
	if hasAck {
		if sender.flags&peerMaxAckSet == 0 {
			sender.maxAck = ack
			sender.flags |= peerMaxAckSet
		} else if seqAfter(ack, sender.maxAck) {
			sender.maxAck = ack
		}
	}
	if receiver.maxWin != 0 && seqAfter(end, sender.maxEnd) {
		receiver.maxWin += end - sender.maxEnd
	}
	if seqAfter(sack+win, receiver.maxEnd-1) {
		receiver.maxEnd = sack + win
		if win == 0 {
			receiver.maxEnd++
		}
	}
	if ack == receiver.end {
		receiver.flags &^= peerDataUnack
	}
	if idx == idxACK {
		if c.lastDir == dir && c.lastSeq == seq && c.lastAck == ack && c.lastEnd == end && c.lastWin == s.win {
			if c.retrans < 255 {
				c.retrans++
			}
		} else {
			c.lastDir = dir
			c.lastSeq = seq
			c.lastAck = ack
			c.lastEnd = end
			c.lastWin = s.win
			c.retrans = 0
		}
	}
	return winAccept
}

// windowFail is nf_tcp_log_invalid without the log: liberal mode accepts.
func (t *Table) windowFail(sender *tcpPeer, r windowResult) windowResult {
	if t.liberal || sender.flags&peerBeLiberal != 0 {
		return winAccept
	}
	return r
}

// tcpInitSender is tcp_init_sender: a side's tracking starts from its SYN.
func tcpInitSender(sender, receiver *tcpPeer, s *segment, end, win uint32, dir Direction) {
	sender.end = end
	sender.maxEnd = end
	sender.maxWin = max(win, 1)
	applyOptions(sender, s)
	// RFC 7323: scaling applies only if both sides offered it.
	if dir == Reply && (sender.flags&peerWindowScale == 0 || receiver.flags&peerWindowScale == 0) {
		sender.scale = 0
		receiver.scale = 0
	}
}

// tcpHandleInvalid is nf_tcp_handle_invalid: an ASSURED connection whose FIN
// or RST went out of window after the other side's FIN or RST is likely dead;
// shorten its timeout to the unacknowledged one, as for unacked data.
func (t *Table) tcpHandleInvalid(e *entry, dir Direction, idx uint8, now int64, sh *shard) {
	c := &e.tcp
	if e.status&StatusAssured == 0 || (idx != idxRST && idx != idxFIN) {
		return
	}
	if c.lastDir != dir && (c.lastIndex == idxFIN || c.lastIndex == idxRST) {
		left := e.expires - now
		if left < int64(120e9) {
			return
		}
		if to := t.tcpTO[toUnack]; left > to {
			sh.setExpiry(e, now+to)
		}
		return
	}
	c.lastIndex = idx
	c.lastDir = dir
}

// tcpCanEarlyDrop is tcp_can_early_drop: the closing states.
func tcpCanEarlyDrop(s TCPState) bool {
	switch s {
	case TCPFinWait, TCPLastAck, TCPTimeWait, TCPClose, TCPCloseWait:
		return true
	}
	return false
}

// Indexes of Table.tcpTO beyond the states.
const (
	toRetrans = int(numTCPStates) + iota
	toUnack
	numTCPTimeouts
)

// tcpTimeout picks the timeout after a segment, as the tail of
// nf_conntrack_tcp_packet does.
func (t *Table) tcpTimeout(c *tcpConn, next TCPState, idx uint8) int64 {
	to := &t.tcpTO
	switch {
	case c.retrans >= tcpMaxRetrans && to[next] > to[toRetrans]:
		return to[toRetrans]
	case idx == idxRST:
		return to[TCPClose]
	case (c.seen[0].flags|c.seen[1].flags)&peerDataUnack != 0 && to[next] > to[toUnack]:
		return to[toUnack]
	case c.lastWin == 0 && to[next] > to[toRetrans]:
		return to[toRetrans]
	}
	return to[next]
}

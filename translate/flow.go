package translate

// A flow: the service's side of one connection toward the client, read
// top-down in the order a segment takes (Input: RST, SYN, ACK checks, then
// the acknowledgment in snd.go and the data in rcv.go, then pump):
//
//  1. Receive: the client's in-order payload is written to the endpoint
//     socket, and only what the socket took is acknowledged; the ACK of a
//     lone segment, or of a FIN, waits (AckDelay) for our next segment to
//     carry it. The window offered follows the socket's free space, and
//     grows again by a window update when the socket drains (wndShort); a
//     short write all the same closes it, and when the socket drains a
//     window update and three duplicate ACKs ask the client to send the
//     rest again at once. Segments past a gap are kept (sack.go) until it
//     fills, and answered with a duplicate ACK naming them in SACK blocks.
//  2. Send: unacknowledged bytes stay in the socket's receive queue. They
//     are peeked from the peek offset (sndNxt-sndUna past the queue's head)
//     as far as the client's window and the congestion window (cubic.go)
//     go, straight into the segment's buffer, and discarded when the client
//     acknowledges them. Over a link that offloads, a segment holds up to
//     64 KiB for the kernel to cut at the MSS, its checksum left partial.
//     With SACK, a record per segment in flight (sentlog.go) lets RACK
//     find what is lost by send times and send only that again (rack.go);
//     without SACK a loss (three duplicate ACKs), and with or without it a
//     retransmission timeout, rewinds the peek offset to the acknowledged
//     point, and what the client SACKed is skipped on the way up again.
//  3. End: the client's FIN half-closes the socket; the socket's EOF, once
//     every byte before it is sent, becomes our FIN. A RST either way ends
//     the flow, as does a handshake not completed by its deadline, or
//     retransmissions unanswered for tcp_retries2's time.
//
// Timers belong to the flow's owner: the flow says what it wants armed
// (State: rtoArmed for rtoDelay; ackHeld or wndShort for ackDelay) and the
// owner calls OnRTO and FlushAck (timer.go).

import (
	"sync"
	"sync/atomic"
	"time"
)

type flowState int

const (
	stateSynRcvd flowState = iota
	stateEstablished
	stateClosed
)

const (
	dupAckThresh  = 3   // RFC 5681 3.2; RFC 6675 2's DupThresh
	maxReordering = 300 // Linux's net.ipv4.tcp_max_reordering
)

type Flow struct {
	mu   sync.Mutex
	sock EndpointSocket
	w    Writer
	emit func(p []byte) // writes a segment the flow built to the link
	// emitPartial, when the link offloads (gso), writes a segment with
	// payload whose checksum is partial, cut at mss payload bytes.
	emitPartial func(p []byte, hdrLen, mss int)
	gso         bool
	// held counts held ACKs by how their hold ended: Config's.
	held *HeldCounts
	// bytes counts the bytes moved, [to the endpoint, to the client]; nil
	// in tests.
	bytes *[2]atomic.Uint64
	// hsDeadline and hsAborted: Config's.
	hsDeadline time.Time
	hsAborted  *atomic.Uint64
	now        func() time.Time

	state   flowState
	orderly bool // closed by both FINs, not by a reset
	// detached: the flow was handed to the next process (Detach): every
	// entry point does nothing, until Reattach if the handover failed.
	// abortDue: Abort was called meanwhile; Reattach does it then.
	detached, abortDue bool

	// Receive (client -> endpoint).
	irs      uint32
	rcvNxt   uint32
	rcvWnd   uint32 // offered while the socket takes everything, in bytes
	maxWnd   uint32 // the most an offer can say: rcvWnd within 0xffff<<rcvShift
	rcvShift uint8
	rcvAdv   uint32 // the right edge of the last window offered
	sockFull bool   // a write was short: the window offered is 0
	finIn    bool
	ackHeld  bool // data acknowledged by the next segment out, or by flushAck
	// wndShort: the last window offered was cut short by the socket's
	// free space to less than the client sends a segment into, so no
	// segment of the client's may come to carry a larger one (it may wait
	// for it); FlushAck looks again, each time twice as late while the
	// socket stays full, and a step sooner after a look that found room
	// (wndPolls: the look's delay adapts to how fast the endpoint drains).
	wndShort bool
	wndPolls int
	kept     keptQueue // past a gap (sack.go)

	// Send (endpoint -> client).
	iss       uint32
	sndUna    uint32
	sndNxt    uint32 // the next to send: below sndMax after a rewind
	sndWnd    uint32 // bytes the client takes past sndUna
	maxSndWnd uint32 // the largest window the client offered (RFC 5961 5.2)
	sndMax    uint32 // the highest sequence number sent, plus one
	recover   uint32 // sndMax at the last loss: no new recovery until past it (RFC 6582)
	sndWl1    uint32 // the sequence and acknowledgment numbers of the segment
	sndWl2    uint32 // that last set sndWnd (RFC 9293 3.10.7.4)
	sndShift  uint8
	peerWS    int // the SYN's window scale option, -1 for none
	advMSS    int // the MSS our SYN-ACK announces: what the link carries to us
	mss       int // the client's limit (sendMSS), what it sends us at most too
	sendMSS   int // the payload of a full segment of ours, options taken off
	unacked   int // bytes received since our last ACK
	dupAcks   int
	// dupThresh is how many segments' worth of duplicate ACKs or SACKed
	// bytes past a hole make a loss: dupAckThresh, raised when the client
	// reports that a retransmission was not needed (reordering, as Linux
	// raises tp->reordering), up to maxReordering.
	dupThresh int
	// dsack is a range the client sent again that we already had, to be
	// reported first in our next ACK's SACK blocks (RFC 2883).
	dsack   seqRange
	dsackOn bool
	// The last reduction's undo (Linux's undo_marker, undo_retrans and
	// retrans_stamp): while undoOn, undoRetrans counts the segments sent
	// again since it began at undoMarker, less those the client reported
	// twice (D-SACK); undoTS is the timestamp of the first (undoSent).
	undoOn      bool
	undoMarker  uint32
	undoRetrans int
	undoTS      uint32
	undoSent    bool
	// Tail loss probes (RFC 8985 7), with SACK: tlpDue while a probe may
	// go for the data in flight, before the RTO; tlpProbing once it went,
	// up to tlpEnd, until its answer.
	tlpDue, tlpProbing bool
	tlpEnd             uint32
	// headSeq and headAt: when the segment at sndUna was last sent again
	// in a recovery, for resendLost.
	headSeq     uint32
	headAt      time.Time
	headResends int
	finSent     bool // our FIN is sndNxt-1
	finSeen     bool // our FIN was sent: it is sndMax-1

	// Loss recovery and congestion control (cc.go, cubic.go, sack.go, rack.go).
	sackOK     bool // both ends take SACK
	score      scoreboard
	log        sentLog   // with SACK: what is in flight, for RACK (sentlog.go)
	rack       rackState // rack.go
	prr        prrState  // rack.go
	ackTS      bool      // the ACK being taken echoes a timestamp: ackEcr
	ackEcr     uint32
	cc         congestionControl
	lastSend   time.Time // when pump last sent, for cc.restart
	inRecovery bool
	rtt        rttEstimator
	timing     bool // a segment's round trip is being timed (no timestamps): rttSeq at rttAt
	rttSeq     uint32
	rttAt      time.Time
	rtoArmed   bool
	backoff    int       // timeouts in a row: the timer's exponent
	probes     int       // window probes in a row the client left unanswered
	retransAt  time.Time // the first timeout of the data in flight, zero when none
	progress   time.Time // the last ACK that moved sndUna, or the first send after an idle spell

	// Timestamps (RFC 7323), when the client offered them.
	ts       bool
	tsRecent uint32
	tsBase   uint32
	t0       time.Time
}

// Config is what a flow starts from.
type Config struct {
	// Sock is the endpoint socket: the flow's bytes both ways.
	Sock EndpointSocket
	// Writer writes the flow's segments, from the service to the client.
	Writer Writer
	// Emit writes a segment the flow built, a whole IP packet, to the
	// link; the flow does not keep p.
	Emit func(p []byte)
	// EmitPartial is set when the link offloads TCP checksums and
	// segmentation: the flow's data segments go that way, up to
	// segmentMax bytes each, their checksum partial (the pseudo-header's
	// sum), to be cut at mss payload bytes after hdrLen bytes of headers.
	EmitPartial func(p []byte, hdrLen, mss int)
	// Now is the flow's clock.
	Now func() time.Time
	// ISS is the initial send sequence number; TSBase the first timestamp
	// value (both random, RFC 9293 3.4.1, RFC 7323 5.4).
	ISS, TSBase uint32
	// RcvWnd is the window to offer, in bytes (the socket's send buffer);
	// RcvShift our window scale, used when the client offered one.
	RcvWnd   uint32
	RcvShift uint8
	// LinkMSS is the most a segment may carry on the link, either way.
	LinkMSS uint16
	// Held counts the flow's held ACKs by how their hold ended (optional).
	Held *HeldCounts
	// Bytes counts the bytes moved, [to the endpoint, to the client]
	// (optional).
	Bytes *[2]atomic.Uint64
	// KeptBudget is the bytes the flows of a stack may still keep past
	// gaps, shared by them; start it at KeptTotal (optional: without it,
	// only a flow's own bounds).
	KeptBudget *atomic.Int64
	// HSDeadline is when a client that has not completed its handshake is
	// reset (zero: only after synAckRetries); HSAborted counts those.
	HSDeadline time.Time
	HSAborted  *atomic.Uint64
}

// HeldCounts count held ACKs by how their hold ended: the next segment
// out carried the acknowledgment, the hold's time ran out, or the flow
// ended first.
type HeldCounts struct {
	Superseded, Expired, Dropped *atomic.Uint64
}

// The send MSS's bounds. A SYN without the option means 536 bytes over
// IPv4 and 1220 over IPv6 (RFC 9293 3.7.1, RFC 8200 8.3's 1280-byte
// minimum MTU less the headers). An announced MSS below minMSS is taken
// as minMSS, as Linux takes it as net.ipv4.tcp_min_snd_mss (48 by
// default, since CVE-2019-11479): a smaller one would leave no room for the
// payload once the options are taken off (a zero or negative segment
// length), or cut each 64 KiB of GSO into tens of thousands of segments.
const (
	minMSS      = 48
	defaultMSS4 = 536
	defaultMSS6 = 1220
)

// sendMSS is the MSS the flow sends with: the client's announced one
// (announced 0: its default), within the link's and at least minMSS.
func sendMSS(announced uint16, linkMSS int, v6 bool) int {
	mss := int(announced)
	if mss == 0 {
		mss = defaultMSS4
		if v6 {
			mss = defaultMSS6
		}
	}
	return max(min(mss, linkMSS), minMSS)
}

// New makes the flow of the client's SYN.
func New(cfg Config, syn Segment) *Flow {
	f := &Flow{
		sock: cfg.Sock, w: cfg.Writer, emit: cfg.Emit, emitPartial: cfg.EmitPartial, gso: cfg.EmitPartial != nil, held: cfg.Held, bytes: cfg.Bytes, hsDeadline: cfg.HSDeadline, hsAborted: cfg.HSAborted, now: cfg.Now,
		irs: syn.seq, rcvNxt: syn.seq + 1, rcvWnd: cfg.RcvWnd,
		iss: cfg.ISS, sndUna: cfg.ISS, sndNxt: cfg.ISS + 1, sndWnd: uint32(syn.wnd), maxSndWnd: uint32(syn.wnd),
		ts: syn.ts, tsRecent: syn.tsVal, tsBase: cfg.TSBase, t0: cfg.Now(), peerWS: syn.ws, sackOK: syn.sackOK,
	}
	f.kept.budget = cfg.KeptBudget
	f.log = newSentLog(cfg.ISS + 1)
	f.advMSS = int(cfg.LinkMSS)
	f.mss = sendMSS(syn.mss, int(cfg.LinkMSS), cfg.Writer.v6)
	f.sendMSS = f.mss
	if syn.ts {
		f.sendMSS -= 12 // the MSS counts no options (RFC 6691): ours carry timestamps
	}
	if syn.ws >= 0 {
		f.sndShift, f.rcvShift = uint8(syn.ws), cfg.RcvShift
	}
	// The most a window offer can say: rcvWnd, or 64 KiB when the client
	// takes no scale.
	f.maxWnd = min(f.rcvWnd, 0xffff<<f.rcvShift)
	f.sndMax = f.sndNxt
	f.recover = f.iss // RFC 6582 3.2: the initial send sequence number
	f.sndWl1, f.sndWl2 = syn.seq, f.iss
	f.cc = newCubic(f.sendMSS)
	f.dupThresh = dupAckThresh
	return f
}

// Start sends the SYN-ACK; the owner calls it once the flow is where the
// client's answer finds it.
func (f *Flow) Start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendSynAck()
}

func (f *Flow) sendSynAck() {
	wnd := uint32(0xffff) // a SYN's window is never scaled (RFC 7323 2.2)
	if sp, err := f.sock.Space(); err == nil {
		wnd = min(wnd, uint32(sp))
	}
	f.rcvAdv = f.rcvNxt + wnd
	opts := synAckOptions(nil, Segment{ws: f.peerWS, ts: f.ts, tsVal: f.tsRecent, sackOK: f.sackOK}, uint16(f.advMSS), f.rcvShift, f.tsNow())
	f.build(f.iss, tcpSYN|tcpACK, uint16(wnd), opts, nil)
	f.rtoArmed = true
	if !f.ts && !f.timing {
		f.timing, f.rttSeq, f.rttAt = true, f.iss+1, f.now()
	}
}

func (f *Flow) tsNow() uint32 {
	return f.tsBase + uint32(f.now().Sub(f.t0).Milliseconds())
}

// Input handles one segment from the client; it reports false once the
// flow has ended. The checks follow RFC 9293 3.10.7.4's order: RST, SYN,
// ACK, then the timestamps (RFC 7323 5's PAWS) and the sequence number,
// the acknowledgment (ackInput), then the data (dataInput).
func (f *Flow) Input(s Segment) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.detached {
		return true
	}
	if f.state == stateClosed {
		// RFC 9293 3.10.7.4, TIME-WAIT: a retransmission of the client's
		// FIN, whose ACK was lost, is acknowledged again.
		if f.orderly && s.flags&(tcpFIN|tcpRST) == tcpFIN && s.seq+uint32(len(s.payload))+1 == f.rcvNxt {
			f.sendAck()
		}
		return false
	}
	if s.flags&tcpRST != 0 {
		// RFC 5961 3.2: only the exact next sequence number resets; one
		// elsewhere in the window draws a challenge ACK.
		if s.seq == f.rcvNxt || (f.state == stateSynRcvd && s.seq == f.irs+1) {
			f.close(false)
			return false
		}
		f.sendAck()
		return true
	}
	if s.flags&tcpSYN != 0 {
		if f.state == stateSynRcvd && s.seq == f.irs {
			f.sendSynAck() // the client did not get ours
		} else {
			f.sendAck() // RFC 5961 4.2: a challenge ACK
		}
		return true
	}
	if s.flags&tcpACK == 0 {
		return true // RFC 9293 3.10.7.4: dropped
	}
	if f.state == stateEstablished && !f.acceptable(s) {
		f.sendAck() // RFC 9293 3.10.7.4, RFC 7323 5.3 R1: an ACK, and the segment dropped
		return true
	}
	if f.ts && s.ts && int32(s.tsVal-f.tsRecent) >= 0 && int32(s.seq-f.rcvNxt) <= 0 {
		f.tsRecent = s.tsVal // RFC 7323 4.3
	}
	if f.state == stateSynRcvd {
		if s.ack != f.iss+1 {
			f.sendAck()
			return true
		}
		f.state = stateEstablished
		f.backoff = 0
		f.sampleRTT(s) // the SYN-ACK's round trip
		f.sndUna = s.ack
		f.rtoArmed = false
	}
	// RFC 9293 3.10.7.4: an ACK of what was never sent draws an ACK and
	// the segment is dropped; RFC 5961 5.2: so does one older than the
	// largest window the client offered, as a challenge.
	if int32(s.ack-f.sndMax) > 0 || int32(s.ack-(f.sndUna-f.maxSndWnd)) < 0 {
		f.sendAck()
		return true
	}
	f.ackInput(s)
	if f.state == stateClosed {
		return false
	}
	f.dataInput(s)
	if f.state == stateClosed {
		return false
	}
	f.pump()
	return f.state != stateClosed
}

// count counts n bytes moved in direction dir.
func (f *Flow) count(dir, n int) {
	if f.bytes != nil && n > 0 {
		f.bytes[dir].Add(uint64(n))
	}
}

// endHeld counts an ACK still held when the flow ends as dropped.
func (f *Flow) endHeld() {
	if f.ackHeld {
		f.ackHeld = false
		f.countHeld(heldDropped)
	}
}

// How a held ACK's hold ended (HeldCounts).
const (
	heldSuperseded = iota
	heldExpired
	heldDropped
)

// countHeld counts a held ACK's end.
func (f *Flow) countHeld(end int) {
	if f.held == nil {
		return
	}
	switch end {
	case heldSuperseded:
		f.held.Superseded.Add(1)
	case heldExpired:
		f.held.Expired.Add(1)
	case heldDropped:
		f.held.Dropped.Add(1)
	}
}

// maybeDone ends the flow once both FINs are through and ours is
// acknowledged.
func (f *Flow) maybeDone() {
	if f.finIn && f.finSent && f.sndUna == f.sndNxt {
		f.state = stateClosed
		f.orderly = true
		f.rtoArmed = false
		f.kept.drop()
		f.endHeld()
	}
}

// Abort ends the flow with a RST to the client and an aborted socket.
func (f *Flow) Abort() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.detached {
		f.abortDue = true // the next process's, unless the handover fails
		return
	}
	f.close(true)
}

// Ended reports whether the flow is over.
func (f *Flow) Ended() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state == stateClosed
}

// State is what a flow's owner reads of it after each call, in one
// snapshot: whether it ended, whether its handshake is complete, whether
// its socket is full (the owner waits for it to drain, then calls
// Writable), and which timers to arm for how long (calling OnRTO and
// FlushAck when they fire).
type State struct {
	Closed, SynRcvd, SockFull bool
	// Detached: handed to the next process; nothing to arm or wait for.
	Detached bool
	RTO      bool
	RTODelay time.Duration
	Ack      bool
	AckDelay time.Duration
}

// State returns the flow's state.
func (f *Flow) State() State {
	f.mu.Lock()
	defer f.mu.Unlock()
	closed := f.state == stateClosed
	if f.detached {
		return State{Detached: true}
	}
	return State{
		Closed: closed, SynRcvd: f.state == stateSynRcvd, SockFull: f.sockFull && !closed,
		RTO: f.rtoArmed, RTODelay: f.rtoDelay(),
		Ack: !closed && (f.ackHeld || (f.wndShort && !f.sockFull)), AckDelay: f.ackDelay(),
	}
}

// close ends the flow; reset sends the client a RST and aborts the socket.
// The RST carries sndMax, the highest sequence number sent (Linux's
// snd_nxt): below it, after a rewind, the client's RFC 5961 check would
// only answer it with a challenge ACK.
func (f *Flow) close(reset bool) {
	if f.state == stateClosed {
		return
	}
	if reset {
		f.build(f.sndMax, tcpRST|tcpACK, 0, nil, nil)
	}
	f.sock.Abort()
	f.kept.drop()
	f.endHeld()
	f.state = stateClosed
	f.rtoArmed = false
}

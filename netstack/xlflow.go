package netstack

// A translated flow's TCP toward the client: the service's side of one
// connection, whose sequence space follows the endpoint socket's queues,
// pasta's design (BENCHMARKS.md, "What building it takes"). The flow keeps
// no bytes of its own but the segments a loss or a reordering left past a
// gap:
//
//  1. Receive: the client's in-order payload is written to the endpoint
//     socket, and only what the socket took is acknowledged; the ACK of a
//     lone segment, or of a FIN, waits (xlAckDelay) for our next segment to
//     carry it. The window offered follows the socket's free space, and
//     grows again by a window update when the socket drains (wndShort); a
//     short write all the same closes it, and when the socket drains a
//     window update and three duplicate ACKs ask the client to send the
//     rest again at once. Segments past a gap are kept (xlsack.go) until it
//     fills, and answered with a duplicate ACK naming them in SACK blocks.
//  2. Send: unacknowledged bytes stay in the socket's receive queue. They
//     are peeked from the peek offset (sndNxt-sndUna past the queue's head)
//     as far as the client's window and the congestion window (xlcc.go)
//     go, straight into the segment's buffer, and discarded when the client
//     acknowledges them. Over a link that offloads, a segment holds up to
//     64 KiB for the kernel to cut at the MSS, its checksum left partial.
//     A loss (three duplicate ACKs, or SACK blocks past a hole) or a
//     retransmission timeout rewinds the peek offset to the acknowledged
//     point, and what the client SACKed is skipped on the way up again.
//  3. End: the client's FIN half-closes the socket; the socket's EOF, once
//     every byte before it is sent, becomes our FIN. A RST either way ends
//     the flow, as does a handshake not completed by its deadline, or
//     retransmissions unanswered for tcp_retries2's time.
//
// Timers belong to the flow's owner: the flow says what it wants armed
// (rtoArmed for rtoDelay; ackHeld or wndShort for ackDelay) and the owner
// calls onRTO and flushAck.

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// EndpointSocket is what a flow does with its endpoint socket: a host TCP
// socket with SO_PEEK_OFF enabled (the proxy's); a fake in tests.
type EndpointSocket interface {
	// Write writes b without blocking: a short count when the socket is full.
	Write(b []byte) (int, error)
	// Peek reads from the peek offset without consuming, advancing the
	// offset: 0, nil at EOF; ErrSocketEmpty when nothing is queued there.
	Peek(b []byte) (int, error)
	// Discard drops n bytes from the queue's head; the peek offset moves
	// back by n.
	Discard(n int) error
	// SetPeekOffset sets the peek offset, counted from the queue's head.
	SetPeekOffset(n int) error
	ShutdownWrite() error
	// Abort closes the socket with a RST.
	Abort()
	// Space is how many more bytes the socket takes now.
	Space() (int, error)
	// Writable reports whether the socket takes bytes again after a short
	// write: what the kernel's poll says (POLLOUT).
	Writable() bool
}

// ErrSocketEmpty is EndpointSocket.Peek's EAGAIN.
var ErrSocketEmpty = errors.New("netstack: endpoint socket has nothing queued")

type xlState int

const (
	xlSynRcvd xlState = iota
	xlEstablished
	xlClosed
)

const dupAckThresh = 3 // RFC 5681 3.2; RFC 6675 2's DupThresh

type xlFlow struct {
	mu   sync.Mutex
	sock EndpointSocket
	w    segWriter
	emit func(p []byte) // writes a segment the flow built to the link
	// emitPartial, when the link offloads (gso), writes a segment with
	// payload whose checksum is partial, cut at mss payload bytes.
	emitPartial func(p []byte, hdrLen, mss int)
	gso         bool
	// held counts held ACKs by how their hold ended, with the gate's
	// (ackhold.go): the same metric; nil in tests.
	held *ackHolder
	// bytes counts the bytes moved, [to the endpoint, to the client]; nil
	// in tests.
	bytes *[2]atomic.Uint64
	// hsDeadline and hsAborted: xlConfig's.
	hsDeadline time.Time
	hsAborted  *atomic.Uint64
	now        func() time.Time

	state   xlState
	orderly bool // closed by both FINs, not by a reset

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
	// free space, and no segment of the client's may come to carry a
	// larger one (it may wait for it); flushAck looks again, each time
	// twice as late (wndPolls) while the socket stays full.
	wndShort bool
	wndPolls int
	kept     keptQueue // past a gap (xlsack.go)

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
	finSent   bool // our FIN is sndNxt-1
	finSeen   bool // our FIN was sent: it is sndMax-1

	// Loss recovery and congestion control (xlcc.go, xlsack.go).
	sackOK     bool // both ends take SACK
	score      scoreboard
	cc         congestionControl
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

// xlConfig is what a flow starts from.
type xlConfig struct {
	sock EndpointSocket
	w    segWriter
	emit func([]byte)
	// emitPartial is set when the link offloads TCP checksums and
	// segmentation: the flow's data segments go that way, up to
	// xlSegmentMax bytes each.
	emitPartial func(p []byte, hdrLen, mss int)
	now         func() time.Time
	iss         uint32
	tsBase      uint32
	rcvWnd      uint32            // the window to offer, in bytes (the socket's send buffer)
	rcvShift    uint8             // our window scale, used when the client offered one
	linkMSS     uint16            // the most a segment from us may carry on this link
	held        *ackHolder        // counts held ACKs (optional)
	bytes       *[2]atomic.Uint64 // counts the bytes moved (optional)
	// keptBudget is the bytes the stack's flows may still keep past gaps
	// (optional: without it, only a flow's own bounds).
	keptBudget *atomic.Int64
	// hsDeadline is when a client that has not completed its handshake
	// is reset (the stack's HandshakeTimeout from its SYN; zero: never
	// but by xlSynAckRetries); hsAborted counts those.
	hsDeadline time.Time
	hsAborted  *atomic.Uint64
}

// The send MSS's bounds. A SYN without the option means 536 bytes over
// IPv4 and 1220 over IPv6 (RFC 9293 3.7.1, RFC 8200 8.3's 1280-byte
// minimum MTU less the headers). An announced MSS below xlMinMSS is taken
// as xlMinMSS, as Linux takes it as net.ipv4.tcp_min_snd_mss (48 by
// default, since CVE-2019-11479): a smaller one would leave no room for the
// payload once the options are taken off (a zero or negative segment
// length), or cut each 64 KiB of GSO into tens of thousands of segments.
const (
	xlMinMSS      = 48
	xlDefaultMSS4 = 536
	xlDefaultMSS6 = 1220
)

// sendMSS is the MSS the flow sends with: the client's announced one
// (announced 0: its default), within the link's and at least xlMinMSS.
func sendMSS(announced uint16, linkMSS int, v6 bool) int {
	mss := int(announced)
	if mss == 0 {
		mss = xlDefaultMSS4
		if v6 {
			mss = xlDefaultMSS6
		}
	}
	return max(min(mss, linkMSS), xlMinMSS)
}

// newXLFlow makes the flow of the client's SYN.
func newXLFlow(cfg xlConfig, syn clientSeg) *xlFlow {
	f := &xlFlow{
		sock: cfg.sock, w: cfg.w, emit: cfg.emit, emitPartial: cfg.emitPartial, gso: cfg.emitPartial != nil, held: cfg.held, bytes: cfg.bytes, hsDeadline: cfg.hsDeadline, hsAborted: cfg.hsAborted, now: cfg.now,
		irs: syn.seq, rcvNxt: syn.seq + 1, rcvWnd: cfg.rcvWnd,
		iss: cfg.iss, sndUna: cfg.iss, sndNxt: cfg.iss + 1, sndWnd: uint32(syn.wnd), maxSndWnd: uint32(syn.wnd),
		ts: syn.ts, tsRecent: syn.tsVal, tsBase: cfg.tsBase, t0: cfg.now(), peerWS: syn.ws, sackOK: syn.sackOK,
	}
	f.kept.budget = cfg.keptBudget
	f.advMSS = int(cfg.linkMSS)
	f.mss = sendMSS(syn.mss, int(cfg.linkMSS), cfg.w.v6)
	f.sendMSS = f.mss
	if syn.ts {
		f.sendMSS -= 12 // the MSS counts no options (RFC 6691): ours carry timestamps
	}
	if syn.ws >= 0 {
		f.sndShift, f.rcvShift = uint8(syn.ws), cfg.rcvShift
	}
	// The most a window offer can say: rcvWnd, or 64 KiB when the client
	// takes no scale.
	f.maxWnd = min(f.rcvWnd, 0xffff<<f.rcvShift)
	f.sndMax = f.sndNxt
	f.recover = f.iss // RFC 6582 3.2: the initial send sequence number
	f.sndWl1, f.sndWl2 = syn.seq, f.iss
	f.cc = newReno(f.sendMSS)
	return f
}

// start sends the SYN-ACK; the owner calls it once the flow is where the
// client's answer finds it.
func (f *xlFlow) start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sendSynAck()
}

func (f *xlFlow) sendSynAck() {
	wnd := uint32(0xffff) // a SYN's window is never scaled (RFC 7323 2.2)
	if sp, err := f.sock.Space(); err == nil {
		wnd = min(wnd, uint32(sp))
	}
	f.rcvAdv = f.rcvNxt + wnd
	opts := synAckOptions(nil, clientSeg{ws: f.peerWS, ts: f.ts, tsVal: f.tsRecent, sackOK: f.sackOK}, uint16(f.advMSS), f.rcvShift, f.tsNow())
	f.build(f.iss, tcpSYN|tcpACK, uint16(wnd), opts, nil)
	f.rtoArmed = true
	if !f.ts && !f.timing {
		f.timing, f.rttSeq, f.rttAt = true, f.iss+1, f.now()
	}
}

func (f *xlFlow) tsNow() uint32 {
	return f.tsBase + uint32(f.now().Sub(f.t0).Milliseconds())
}

// window is the window field of our next segment.
//
// The window follows the socket's free space, so that the client sends no
// more than the socket takes (pasta's way): what is left of the last offer
// while that is at least half of rcvWnd, else the socket's space, asked
// for then. An offer is never taken back (RFC 9293 3.8.6.2.2): the right
// edge only moves right.
func (f *xlFlow) window() uint16 {
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
	f.wndShort = int32(f.rcvAdv-f.rcvNxt) < int32(f.maxWnd/2)
	return uint16(w)
}

// wndGrown reports whether the socket's free space now moves the window's
// right edge far enough to be worth an update: by a quarter of rcvWnd, or
// two full segments if that is less (RFC 9293 3.8.6.2.2's receiver-side
// silly window avoidance asks for one, or half the buffer).
func (f *xlFlow) wndGrown() bool {
	sp, err := f.sock.Space()
	if err != nil {
		return false
	}
	edge := f.rcvNxt + uint32(min(sp, int(f.maxWnd)))
	return int32(edge-f.rcvAdv) >= int32(min(f.maxWnd/4, uint32(2*f.mss)))
}

// xlSegmentMax is the most a segment of ours holds under host GSO: the
// largest IPv4 packet, within the TUN's gso_max_size (tunGSOMaxSize).
const xlSegmentMax = 0xffff

// hdrLen is the length of the headers of the flow's data segments: they
// carry timestamps, if agreed, and no SACK blocks.
func (f *xlFlow) hdrLen() int {
	if f.ts {
		return f.w.ipLen() + header.TCPMinimumSize + 12
	}
	return f.w.ipLen() + header.TCPMinimumSize
}

// send builds and emits one segment at sndNxt without payload.
func (f *xlFlow) send(flags byte) {
	var b [header.IPv6MinimumSize + header.TCPMinimumSize + header.TCPOptionsMaximumSize]byte
	f.sendAround(b[:], flags, 0)
}

// sendAround builds the headers of a segment at sndNxt in p, whose n bytes
// of payload are in place after them (hdrLen), and emits it; it carries
// the ACK of everything received so far. A segment without payload names
// what is kept past a gap in SACK blocks.
func (f *xlFlow) sendAround(p []byte, flags byte, n int) {
	var o [header.TCPOptionsMaximumSize]byte
	opts := o[:0]
	blocks := xlSackMaxBlocks
	if f.ts {
		opts = tsOption(opts, f.tsNow(), f.tsRecent)
		blocks--
	}
	if n == 0 && f.sackOK && f.kept.len() > 0 {
		var b [xlSackMaxBlocks]seqRange
		opts = sackOption(opts, f.kept.blocks(b[:0], blocks))
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
func (f *xlFlow) build(seq uint32, flags byte, wnd uint16, opts, payload []byte) {
	bp := packetPool.Get().(*[]byte)
	n := f.w.build(*bp, seq, f.rcvNxt, flags, wnd, opts, payload)
	f.emit((*bp)[:n])
	packetPool.Put(bp)
}

// sendAck sends a pure ACK now.
func (f *xlFlow) sendAck() { f.send(0) }

// input handles one segment from the client; it reports false once the
// flow has ended. The checks follow RFC 9293 3.10.7.4's order: RST, SYN,
// ACK, then the timestamps (RFC 7323 5's PAWS) and the sequence number,
// the acknowledgment (ackInput), then the data (dataInput).
func (f *xlFlow) input(s clientSeg) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == xlClosed {
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
		if s.seq == f.rcvNxt || (f.state == xlSynRcvd && s.seq == f.irs+1) {
			f.close(false)
			return false
		}
		f.sendAck()
		return true
	}
	if s.flags&tcpSYN != 0 {
		if f.state == xlSynRcvd && s.seq == f.irs {
			f.sendSynAck() // the client did not get ours
		} else {
			f.sendAck() // RFC 5961 4.2: a challenge ACK
		}
		return true
	}
	if s.flags&tcpACK == 0 {
		return true // RFC 9293 3.10.7.4: dropped
	}
	if f.state == xlEstablished && !f.acceptable(s) {
		f.sendAck() // RFC 9293 3.10.7.4, RFC 7323 5.3 R1: an ACK, and the segment dropped
		return true
	}
	if f.ts && s.ts && int32(s.tsVal-f.tsRecent) >= 0 && int32(s.seq-f.rcvNxt) <= 0 {
		f.tsRecent = s.tsVal // RFC 7323 4.3
	}
	if f.state == xlSynRcvd {
		if s.ack != f.iss+1 {
			f.sendAck()
			return true
		}
		f.state = xlEstablished
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
	if f.state == xlClosed {
		return false
	}
	f.dataInput(s)
	if f.state == xlClosed {
		return false
	}
	f.pump()
	return f.state != xlClosed
}

// acceptable is RFC 9293 3.10.7.4's first check, made loose at the left
// edge (a segment sent again, whose ACK may be news, is taken up to a
// window back), and RFC 7323 5.3's PAWS: a timestamp older than the last
// one taken is a segment of a past flight.
func (f *xlFlow) acceptable(s clientSeg) bool {
	if f.ts && s.ts && int32(s.tsVal-f.tsRecent) < 0 {
		return false
	}
	end := s.seq + uint32(len(s.payload))
	return int32(end-(f.rcvNxt-f.maxWnd)) >= 0 && int32(s.seq-f.rcvAdv) <= 0
}

// ackInput processes the client's acknowledgment, SACK blocks and window
// (step 2). An acknowledgment up to sndMax counts, past a rewind's sndNxt
// too: the client got those bytes before the rewind.
func (f *xlFlow) ackInput(s clientSeg) {
	wnd := uint32(s.wnd) << f.sndShift
	d := int32(s.ack - f.sndUna)
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
		f.progress = f.now()
		f.dupAcks, f.backoff, f.probes = 0, 0, 0
		f.retransAt = time.Time{}
		switch {
		case f.inRecovery && int32(s.ack-f.recover) >= 0:
			f.inRecovery = false // RFC 6582 3.2 step 3: a full acknowledgment
			f.cc.recovered()
		case !f.inRecovery:
			f.cc.acked(int(d), 2*flight >= f.cc.window())
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
	if f.state != xlEstablished {
		return
	}
	if f.sackOK {
		end := f.sndMax
		if f.finSeen {
			end-- // the FIN is no byte to skip
		}
		for _, r := range s.sack[:s.nSack] {
			f.score.add(r, f.sndUna, end)
		}
	}
	// A loss: three duplicate ACKs (RFC 5681 3.2), or three segments'
	// worth SACKed past the first hole (RFC 6675 4, IsLost); not again
	// before the last recovery's data is acknowledged (RFC 6582 3.2:
	// strictly past it, or the duplicates a rewind sent would start the
	// next one).
	if !f.inRecovery && f.sndMax != f.sndUna && int32(f.sndUna-f.recover) > 0 &&
		(f.dupAcks >= dupAckThresh || f.score.sacked(f.sndMax) >= dupAckThresh*f.sendMSS) {
		f.cc.lost(f.pipe())
		f.inRecovery = true
		f.rewind()
	}
}

// sampleRTT measures the round trip the acknowledgment s closes: by its
// timestamp echo (RFC 7323 4.1), else by the segment being timed, if s
// covers it and it was not sent twice (Karn's rule, RFC 6298 3).
func (f *xlFlow) sampleRTT(s clientSeg) {
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

// pipe is RFC 6675 4's estimate of the bytes in flight: what was sent
// since the last rewind and is neither acknowledged nor SACKed. What a
// rewind goes back over counts as lost until it is sent again.
func (f *xlFlow) pipe() int {
	return int(f.sndNxt-f.sndUna) - f.score.sacked(f.sndNxt)
}

// noteSent moves sndMax up to sndNxt.
func (f *xlFlow) noteSent() {
	if int32(f.sndNxt-f.sndMax) > 0 {
		f.sndMax = f.sndNxt
	}
	if f.finSent {
		f.finSeen = true
	}
}

// dataInput writes the client's payload to the socket and takes its FIN
// (steps 1 and 3).
func (f *xlFlow) dataInput(s clientSeg) {
	if f.sockFull && f.sock.Writable() {
		f.sockFull = false // the client's probe or retransmission found it drained
	}
	f.wndPolls = 0
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
		if d > len(s.payload) || (d == len(s.payload) && !fin) {
			f.sendAck()
			return
		}
		s.payload, s.seq = s.payload[d:], f.rcvNxt
	}
	if s.seq != f.rcvNxt {
		if !f.sockFull {
			f.kept.keep(s.seq, s.payload, f.rcvAdv)
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
		if f.state == xlClosed || f.sockFull {
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
			// The FIN's ACK waits, as the gate holds gVisor's (ackhold.go),
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
func (f *xlFlow) deliver(p []byte) bool {
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
func (f *xlFlow) drainKept() bool {
	wrote := false
	for f.state != xlClosed && !f.sockFull {
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

// pump sends what the socket holds and the client's window and the
// congestion window take, from sndNxt: after a rewind, what the client
// has not SACKed.
func (f *xlFlow) pump() {
	var bp *[]byte
	defer func() {
		if bp != nil {
			packetPool.Put(bp)
		}
	}()
	for f.state == xlEstablished && !f.finSent {
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
		pipe := f.pipe()
		cwnd := f.cc.window() - pipe
		if cwnd < f.sendMSS {
			if pipe > 0 {
				return // the ACKs in flight open the congestion window
			}
			cwnd = f.sendMSS
		}
		if bp == nil {
			bp = packetPool.Get().(*[]byte)
		}
		hl := f.hdrLen()
		maxSeg := f.sendMSS
		if f.gso {
			maxSeg = max(f.sendMSS, (xlSegmentMax-hl)/f.sendMSS*f.sendMSS) // full segments after the cut
		}
		n := min(room, cwnd, maxSeg, len(*bp)-hl)
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
		if f.sndUna == f.sndNxt {
			f.progress = f.now() // a new flight
		}
		if f.sndNxt == f.sndMax && !f.ts && !f.timing {
			f.timing, f.rttSeq, f.rttAt = true, f.sndNxt+uint32(r), f.now()
		}
		f.sendAround(*bp, 0x08, r) // PSH
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
func (f *xlFlow) pending() bool {
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

// rewind goes back to the acknowledged point and sends again from there
// what the client has not SACKed.
func (f *xlFlow) rewind() {
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

// onRTO is the owner's retransmission (or persist) timer firing.
func (f *xlFlow) onRTO() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == xlClosed || !f.rtoArmed {
		return f.state != xlClosed
	}
	now := f.now()
	if f.state == xlSynRcvd && !f.hsDeadline.IsZero() && !now.Before(f.hsDeadline) {
		if f.hsAborted != nil {
			f.hsAborted.Add(1)
		}
		f.close(true) // the client did not complete its handshake in time
		return false
	}
	if f.state == xlEstablished && now.Sub(f.progress) < f.rtoDelay() {
		return true // armed once per flight: the flight moved since; armed again
	}
	switch {
	case f.state == xlSynRcvd:
		if f.backoff++; f.backoff > xlSynAckRetries && f.hsDeadline.IsZero() {
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
		if f.retransAt.IsZero() {
			f.retransAt = now
		} else if now.Sub(f.retransAt) >= xlGiveUp {
			f.close(true)
			return false
		}
		f.backoff++
		f.cc.timedOut(f.pipe())
		f.inRecovery = false
		f.score.clear()
		f.rewind()
	case f.sndWnd == 0 && f.pending():
		// A window probe: an old sequence number draws an ACK with the
		// client's window (as Linux's tcp_xmit_probe_skb), backed off as
		// the retransmissions are; given up once the client stops
		// answering them (tcp_probe_timer).
		if f.probes++; f.probes > xlMaxProbes {
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
	return f.state != xlClosed
}

// rtoDelay is how long the owner arms the timer for: the RTO, backed off.
// In the handshake it ends at the handshake's deadline at the latest.
func (f *xlFlow) rtoDelay() time.Duration {
	d := min(f.rtt.rto()<<min(f.backoff, 16), xlRTOMax)
	if f.state == xlSynRcvd && !f.hsDeadline.IsZero() {
		d = min(d, max(f.hsDeadline.Sub(f.now()), time.Millisecond))
	}
	return d
}

// ackDelay is how long the owner arms the ACK timer for: a held ACK's
// hold, or the next look at a short window, twice as late each time the
// socket had not drained, up to the RTO's floor: a stalled endpoint costs
// a backed-off timer, not a 1 ms poll.
func (f *xlFlow) ackDelay() time.Duration {
	if f.ackHeld {
		return xlAckDelay
	}
	return min(xlAckDelay<<min(f.wndPolls, 16), xlRTO)
}

// flushAck sends the held ACK, if the flow still holds one, or a window
// update once a short window can grow.
func (f *xlFlow) flushAck() {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.state == xlClosed:
	case f.ackHeld:
		f.ackHeld = false
		f.countHeld(heldExpired)
		f.sendAck()
	case f.wndShort && !f.sockFull && f.wndGrown():
		f.wndPolls = 0
		f.sendAck()
	case f.wndShort:
		f.wndPolls++
	}
}

// readable is the owner's report that the socket has more to read.
func (f *xlFlow) readable() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pump()
}

// writable is the owner's report that a full socket takes bytes again:
// the kept segments go in, then a window update, then duplicate ACKs so
// the client sends again what the full socket did not take without
// waiting for its timeout.
func (f *xlFlow) writable() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sockFull || f.state == xlClosed {
		return
	}
	f.sockFull = false
	if f.drainKept(); f.sockFull || f.state == xlClosed {
		return
	}
	for range 1 + dupAckThresh {
		f.sendAck()
	}
}

// count counts n bytes moved in direction dir.
func (f *xlFlow) count(dir, n int) {
	if f.bytes != nil && n > 0 {
		f.bytes[dir].Add(uint64(n))
	}
}

// endHeld counts an ACK still held when the flow ends as dropped.
func (f *xlFlow) endHeld() {
	if f.ackHeld {
		f.ackHeld = false
		f.countHeld(heldDropped)
	}
}

// How a held ACK's hold ended, as the gate's ACK holder counts them.
const (
	heldSuperseded = iota
	heldExpired
	heldDropped
)

// countHeld counts a held ACK's end.
func (f *xlFlow) countHeld(end int) {
	if f.held == nil {
		return
	}
	switch end {
	case heldSuperseded:
		f.held.superseded.Add(1)
	case heldExpired:
		f.held.expired.Add(1)
	case heldDropped:
		f.held.dropped.Add(1)
	}
}

// maybeDone ends the flow once both FINs are through and ours is
// acknowledged.
func (f *xlFlow) maybeDone() {
	if f.finIn && f.finSent && f.sndUna == f.sndNxt {
		f.state = xlClosed
		f.orderly = true
		f.rtoArmed = false
		f.kept.drop()
		f.endHeld()
	}
}

// close ends the flow; reset sends the client a RST and aborts the socket.
// The RST carries sndMax, the highest sequence number sent (Linux's
// snd_nxt): below it, after a rewind, the client's RFC 5961 check would
// only answer it with a challenge ACK.
func (f *xlFlow) close(reset bool) {
	if f.state == xlClosed {
		return
	}
	if reset {
		f.build(f.sndMax, tcpRST|tcpACK, 0, nil, nil)
	}
	f.sock.Abort()
	f.kept.drop()
	f.endHeld()
	f.state = xlClosed
	f.rtoArmed = false
}

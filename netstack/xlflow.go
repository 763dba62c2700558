package netstack

// A translated flow's TCP toward the client: the service's side of one
// connection, whose sequence space follows the endpoint socket's queues,
// pasta's design (BENCHMARKS.md, "What building it takes"). The flow keeps
// no bytes of its own but the few segments a reordering left past a gap:
//
//  1. Receive: the client's in-order payload is written to the endpoint
//     socket, and only what the socket took is acknowledged; the ACK of a
//     lone segment, or of a FIN, waits (xlAckDelay) for our next segment to
//     carry it. The window offered follows the socket's free space, and
//     grows again by a window update when the socket drains (wndShort); a
//     short write all the same closes it, and when the socket drains a
//     window update and three duplicate ACKs ask the client to send the
//     rest again at once. Segments past a gap are kept (xlKeptSegs) until
//     it fills, and answered with a duplicate ACK.
//  2. Send: unacknowledged bytes stay in the socket's receive queue. They
//     are peeked from the peek offset (sndNxt-sndUna past the queue's head)
//     as far as the client's window goes, straight into the segment's
//     buffer, and discarded when the client acknowledges them. Over a link
//     that offloads, a segment holds up to 64 KiB for the kernel to cut at
//     the MSS, its checksum left partial. A retransmission timeout, or
//     three duplicate ACKs, rewind the peek offset to the acknowledged
//     point.
//  3. End: the client's FIN half-closes the socket; the socket's EOF, once
//     every byte before it is sent, becomes our FIN. A RST either way ends
//     the flow, as does a handshake not completed by its deadline.
//
// Timers belong to the flow's owner: the flow says what it wants armed
// (rtoArmed; ackHeld or wndShort) and the owner calls onRTO and flushAck.

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

// Retransmission: the initial timeout (RFC 6298 2.1 allows 1 s; Linux's
// TCP_TIMEOUT_INIT is 1 s, its floor TCP_RTO_MIN 200 ms, which a path inside
// one machine always meets), doubled per timeout up to xlMaxBackoff times,
// after which the flow is reset, as tcp_retries2 ends a kernel connection.
const (
	xlRTO        = 200 * time.Millisecond
	xlMaxBackoff = 8
	dupAckThresh = 3 // RFC 5681 3.2
)

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

	state xlState

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
	// larger one (it may wait for it); flushAck looks again.
	wndShort bool
	kept     []keptSeg // past a gap, by sequence number

	// Send (endpoint -> client).
	iss      uint32
	sndUna   uint32
	sndNxt   uint32
	sndWnd   uint32 // bytes the client takes past sndUna
	sndMax   uint32 // the highest sequence number sent, plus one
	recover  uint32 // sndMax at the last rewind: no fast retransmit before it is acknowledged (RFC 6582)
	sndWl1   uint32 // the sequence and acknowledgment numbers of the segment
	sndWl2   uint32 // that last set sndWnd (RFC 9293 3.10.7.4)
	sndShift uint8
	peerWS   int // the SYN's window scale option, -1 for none
	advMSS   int // the MSS our SYN-ACK announces: what the link carries to us
	mss      int // the client's limit (sendMSS), what it sends us at most too
	sendMSS  int // the payload of a full segment of ours, options taken off
	unacked  int // bytes received since our last ACK
	dupAcks  int
	finSent  bool // our FIN is sndNxt-1
	finSeen  bool // our FIN was sent: it is sndMax-1
	rtoArmed bool
	backoff  int
	progress time.Time // the last ACK that moved sndUna, or the first send after an idle spell

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
	// hsDeadline is when a client that has not completed its handshake
	// is reset (the stack's HandshakeTimeout from its SYN; zero: never
	// but by xlMaxBackoff); hsAborted counts those.
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

// newXLFlow makes the flow of the client's SYN and sends the SYN-ACK.
func newXLFlow(cfg xlConfig, syn clientSeg) *xlFlow {
	f := &xlFlow{
		sock: cfg.sock, w: cfg.w, emit: cfg.emit, emitPartial: cfg.emitPartial, gso: cfg.emitPartial != nil, held: cfg.held, bytes: cfg.bytes, hsDeadline: cfg.hsDeadline, hsAborted: cfg.hsAborted, now: cfg.now,
		irs: syn.seq, rcvNxt: syn.seq + 1, rcvWnd: cfg.rcvWnd,
		iss: cfg.iss, sndUna: cfg.iss, sndNxt: cfg.iss + 1, sndWnd: uint32(syn.wnd),
		ts: syn.ts, tsRecent: syn.tsVal, tsBase: cfg.tsBase, t0: cfg.now(), peerWS: syn.ws,
	}
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
	f.sndMax, f.recover = f.sndNxt, f.sndNxt
	f.sndWl1, f.sndWl2 = syn.seq, f.iss
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
	opts := synAckOptions(nil, clientSeg{ws: f.peerWS, ts: f.ts, tsVal: f.tsRecent}, uint16(f.advMSS), f.rcvShift, f.tsNow())
	f.build(f.iss, tcpSYN|tcpACK, uint16(wnd), opts, nil)
	f.rtoArmed = true
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

// hdrLen is the length of the headers of the flow's segments.
func (f *xlFlow) hdrLen() int {
	if f.ts {
		return f.w.ipLen() + header.TCPMinimumSize + 12
	}
	return f.w.ipLen() + header.TCPMinimumSize
}

// send builds and emits one segment at sndNxt without payload.
func (f *xlFlow) send(flags byte) {
	var b [header.IPv6MinimumSize + header.TCPMinimumSize + 12]byte
	f.sendAround(b[:], flags, 0)
}

// sendAround builds the headers of a segment at sndNxt in p, whose n bytes
// of payload are in place after them (hdrLen), and emits it; it carries
// the ACK of everything received so far.
func (f *xlFlow) sendAround(p []byte, flags byte, n int) {
	var o [12]byte
	opts := o[:0]
	if f.ts {
		opts = tsOption(opts, f.tsNow(), f.tsRecent)
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
// flow has ended.
func (f *xlFlow) input(s clientSeg) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == xlClosed {
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
	if f.ts && s.ts && int32(s.tsVal-f.tsRecent) >= 0 && int32(s.seq-f.rcvNxt) <= 0 {
		f.tsRecent = s.tsVal // RFC 7323 4.3
	}
	if f.state == xlSynRcvd {
		if s.ack != f.iss+1 {
			f.sendAck()
			return true
		}
		f.state = xlEstablished
		f.sndUna = s.ack
		f.rtoArmed = false
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

// ackInput processes the client's acknowledgment and window (step 2).
// An acknowledgment up to sndMax counts, past a rewind's sndNxt too: the
// client got those bytes before the rewind.
func (f *xlFlow) ackInput(s clientSeg) {
	wnd := uint32(s.wnd) << f.sndShift
	d := int32(s.ack - f.sndUna)
	switch {
	case d > 0 && int32(f.sndMax-s.ack) >= 0:
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
		f.sndUna = s.ack
		if int32(f.sndNxt-s.ack) < 0 {
			// Past a rewind's sndNxt: the peek offset, moved back by the
			// discard, stops at the queue's head, which is sndUna now.
			f.sndNxt = s.ack
			f.finSent = f.finSeen && s.ack == f.sndMax
		}
		f.progress = f.now()
		f.dupAcks, f.backoff = 0, 0
		f.rtoArmed = f.sndUna != f.sndNxt
		f.maybeDone()
	case d == 0 && len(s.payload) == 0 && s.flags&tcpFIN == 0 && wnd == f.sndWnd && f.sndNxt != f.sndUna:
		// RFC 5681 3.2: fast retransmit, not again before the last
		// rewind's sends are acknowledged (RFC 6582's recovery point).
		if f.dupAcks++; f.dupAcks == dupAckThresh && int32(f.sndUna-f.recover) >= 0 {
			f.rewind()
		}
	case d == 0 && f.sndNxt == f.sndUna:
		f.backoff = 0 // an answer to a window probe: the client is there (Linux's icsk_probes_out reset)
	}
	if d < 0 {
		return // an old acknowledgment: its window is old too
	}
	if int32(s.seq-f.sndWl1) > 0 || (s.seq == f.sndWl1 && int32(s.ack-f.sndWl2) >= 0) {
		f.sndWnd, f.sndWl1, f.sndWl2 = wnd, s.seq, s.ack // RFC 9293 3.10.7.4
	}
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
	fin := s.flags&tcpFIN != 0
	if len(s.payload) == 0 && !fin {
		if s.seq != f.rcvNxt {
			f.sendAck() // RFC 9293 3.10.7.4: a window probe or keep-alive is answered
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
		f.keep(s)
		f.sendAck() // past a gap: a duplicate ACK at once (RFC 5681 4.2)
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
// window) or failed (the flow is reset).
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
		f.dropKept() // the client sends it all again after the update
		f.sendAck()  // the window is 0 now
		return false
	}
	return true
}

// Out-of-order data: the client's segments past a gap are kept, a copy
// each, up to xlKeptSegs of them, so that a reordered burst (veths deliver
// a migrating sender's packets from two CPUs' backlogs out of order) costs
// no retransmission once the gap fills. Only payload within the window
// offered is kept; a FIN past a gap is not (the client sends it again).
const xlKeptSegs = 8

type keptSeg struct {
	seq uint32
	b   []byte
}

// keep keeps s, past a gap, if it fits.
func (f *xlFlow) keep(s clientSeg) {
	end := s.seq + uint32(len(s.payload))
	if len(s.payload) == 0 || len(f.kept) == xlKeptSegs || int32(end-f.rcvAdv) > 0 || f.sockFull {
		return
	}
	i := 0
	for i < len(f.kept) && int32(f.kept[i].seq-s.seq) < 0 {
		i++
	}
	if i < len(f.kept) && f.kept[i].seq == s.seq && len(f.kept[i].b) >= len(s.payload) {
		return // a copy of one kept
	}
	b := append([]byte(nil), s.payload...) // its own size: a kept byte costs a byte
	f.kept = append(f.kept, keptSeg{})
	copy(f.kept[i+1:], f.kept[i:])
	f.kept[i] = keptSeg{seq: s.seq, b: b}
}

// drainKept writes the kept segments the gap's filling made in order; it
// reports whether it wrote any.
func (f *xlFlow) drainKept() bool {
	wrote := false
	for len(f.kept) > 0 && f.state != xlClosed && !f.sockFull {
		k := f.kept[0]
		d := int(int32(f.rcvNxt - k.seq))
		if d < 0 {
			break // still a gap
		}
		f.kept = f.kept[:copy(f.kept, f.kept[1:])]
		if d < len(k.b) {
			wrote = true
			f.deliver(k.b[d:])
		}
	}
	return wrote
}

// dropKept forgets the kept segments.
func (f *xlFlow) dropKept() { f.kept = nil }

// pump sends what the socket holds and the client's window takes.
func (f *xlFlow) pump() {
	var bp *[]byte
	defer func() {
		if bp != nil {
			packetPool.Put(bp)
		}
	}()
	for f.state == xlEstablished && !f.finSent {
		room := int(int32(f.sndUna + f.sndWnd - f.sndNxt))
		if room <= 0 {
			if f.sndWnd == 0 && f.sndUna == f.sndNxt {
				f.rtoArmed = true // a persist probe (onRTO)
			}
			return
		}
		if bp == nil {
			bp = packetPool.Get().(*[]byte)
		}
		hl := f.hdrLen()
		maxSeg := f.sendMSS
		if f.gso {
			maxSeg = max(f.sendMSS, (xlSegmentMax-hl)/f.sendMSS*f.sendMSS) // full segments after the cut
		}
		n := min(room, maxSeg, len(*bp)-hl)
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
		f.sendAround(*bp, 0x08, r) // PSH
		f.sndNxt += uint32(r)
		f.noteSent()
		f.rtoArmed = true
		// A short peek does not end the loop: the endpoint's FIN may have
		// come with the bytes, and no readiness would follow it.
	}
}

// rewind goes back to the acknowledged point and sends again from there.
func (f *xlFlow) rewind() {
	if err := f.sock.SetPeekOffset(0); err != nil {
		f.close(true)
		return
	}
	f.sndNxt = f.sndUna
	f.finSent = false
	f.recover = f.sndMax
	f.pump()
}

// onRTO is the owner's retransmission (or persist) timer firing.
func (f *xlFlow) onRTO() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state == xlClosed || !f.rtoArmed {
		return f.state != xlClosed
	}
	if f.state == xlSynRcvd && !f.hsDeadline.IsZero() && !f.now().Before(f.hsDeadline) {
		if f.hsAborted != nil {
			f.hsAborted.Add(1)
		}
		f.close(true) // the client did not complete its handshake in time
		return false
	}
	if f.state == xlEstablished && f.now().Sub(f.progress) < f.rtoDelay() {
		return true // armed once per flight: the flight moved since; armed again
	}
	if f.backoff++; f.backoff > xlMaxBackoff {
		f.close(true)
		return false
	}
	switch {
	case f.state == xlSynRcvd:
		f.sendSynAck()
	case f.sndUna != f.sndNxt:
		f.rewind()
	case f.sndWnd == 0:
		// A window probe: an old sequence number draws an ACK with the
		// client's window (as Linux's tcp_xmit_probe_skb).
		f.sndNxt--
		f.sendAck()
		f.sndNxt++
	default:
		f.rtoArmed = false
	}
	return f.state != xlClosed
}

// rtoDelay is how long the owner arms the timer for.
// In the handshake it ends at the handshake's deadline at the latest.
func (f *xlFlow) rtoDelay() time.Duration {
	d := xlRTO << min(f.backoff, xlMaxBackoff)
	if f.state == xlSynRcvd && !f.hsDeadline.IsZero() {
		d = min(d, max(f.hsDeadline.Sub(f.now()), time.Millisecond))
	}
	return d
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
		f.sendAck()
	}
}

// readable is the owner's report that the socket has more to read.
func (f *xlFlow) readable() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pump()
}

// writable is the owner's report that a full socket takes bytes again:
// a window update, then duplicate ACKs so the client sends again what the
// full socket did not take without waiting for its timeout.
func (f *xlFlow) writable() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.sockFull || f.state == xlClosed {
		return
	}
	f.sockFull = false
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
		f.rtoArmed = false
		f.dropKept()
		f.endHeld()
	}
}

// close ends the flow; reset sends the client a RST and aborts the socket.
func (f *xlFlow) close(reset bool) {
	if f.state == xlClosed {
		return
	}
	if reset {
		f.build(f.sndNxt, tcpRST|tcpACK, 0, nil, nil)
	}
	f.sock.Abort()
	f.dropKept()
	f.endHeld()
	f.state = xlClosed
	f.rtoArmed = false
}

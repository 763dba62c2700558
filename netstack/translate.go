package netstack

// The translator: TCP flows carried without gVisor, their sequence space
// following the endpoint socket's queues. Their TCP is package translate's;
// this file hands it SYNs and segments, and owns each flow's timers.
//
//  1. The gate hands an admitted SYN to the translator instead of gVisor,
//     when the stack translates and the segment is one it reads
//     (translate.Parse). Bounded as gVisor's handshakes are: MaxInFlight in
//     all, MaxInFlightPerClient per client address; past that the SYN is
//     dropped, its conntrack entry with it, and the client's retransmission
//     comes back here. A handshake holds its slot until the client
//     completes it; when every slot is taken, the oldest handshake whose
//     SYN-ACK has gone unanswered for xlHalfOpenAge is reset to make room
//     (as Linux prunes its SYN queue's old requests under pressure,
//     reqsk_timer_handler), so that a flood of spoofed SYNs keeps a real
//     client out for a second, not for the whole handshake timeout.
//  2. The handler (TranslatedHandler) routes and dials, then Accept answers
//     the SYN (SYN-ACK) with the endpoint socket attached; Refuse answers a
//     RST; Fallback gives the SYN to gVisor after all (an endpoint that is
//     not a host socket), whose forwarder then hands it to HandleTCP.
//  3. The client's later segments go to the flow on the gate's goroutine;
//     its segments go out through the gate's classification.
//  4. The flow stays registered, ended or not, until Forget (its handler's
//     end), so that late segments of an ending flow are dropped here rather
//     than answered by gVisor with a RST; after that, gVisor answers them
//     as a closed port does.

import (
	"container/list"
	"context"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/translate"
)

// TranslatedHandler receives the TCP flows the translator carries. It
// must call exactly one of Accept, Refuse or Fallback.
type TranslatedHandler interface {
	HandleTranslated(r *TranslateRequest)
}

type translator struct {
	st      *Stack
	n       atomic.Int64 // registered flows and requests: the gate looks only when > 0
	flows   sync.Map     // conntrack.Tuple -> *xlEntry
	mu      sync.Mutex
	pending int
	perAddr map[netip.Addr]int
	// kept is the bytes the flows may still keep past gaps, all
	// together (xlsack.go).
	kept atomic.Int64
	// halfOpen holds the accepted requests whose handshake is not
	// complete, oldest first (*TranslateRequest; under mu).
	halfOpen list.List
}

// xlHalfOpenAge is how long a SYN-ACK goes unanswered before its
// handshake may be reset to make room: the SYN-ACK's first timeout.
const xlHalfOpenAge = translate.RTOInit

// xlEntry is a tuple's registration: a request until Accept, then a flow.
type xlEntry struct {
	flow atomic.Pointer[TranslatedFlow] // nil while the request waits
	req  *TranslateRequest              // the request, set before the entry is stored
}

// TranslateRequest is a SYN the translator holds for the handler.
type TranslateRequest struct {
	x      *translator
	g      *gate
	tuple  conntrack.Tuple
	syn    translate.Segment
	raw    []byte // the SYN, for Fallback
	proto  tcpip.NetworkProtocolNumber
	client netip.AddrPort
	svc    netip.AddrPort
	e      *xlEntry
	at     time.Time // the SYN's arrival
	// released: the request's in-flight slot was given back (release).
	released atomic.Bool
	// halfOpen is r's place in the translator's halfOpen list from Accept
	// until release (under the translator's mu); acceptedAt is when.
	halfOpen   *list.Element
	acceptedAt time.Time
	once       sync.Once
}

// Tuple returns the flow's Original-direction tuple.
func (r *TranslateRequest) Tuple() conntrack.Tuple { return r.tuple }

// Client returns the client's address and port.
func (r *TranslateRequest) Client() netip.AddrPort { return r.client }

// Service returns the address and port the client connected to.
func (r *TranslateRequest) Service() netip.AddrPort { return r.svc }

// Context is done when the stack closes.
func (r *TranslateRequest) Context() context.Context { return r.x.st.ctx }

// syn takes an admitted SYN b (step 1); it reports false when the
// translator does not take it, and gVisor is to.
func (x *translator) syn(g *gate, t conntrack.Tuple, proto tcpip.NetworkProtocolNumber, b []byte) bool {
	h, ok := x.st.flowHandler().(TranslatedHandler)
	if !ok {
		return false
	}
	s, ok := parseTCP(b)
	if !ok || !s.IsSYN() {
		return false
	}
	client, svc := t.Src(), t.Dst()
	now := x.st.now()
	x.mu.Lock()
	var evicted *TranslateRequest
	if x.pending >= x.st.maxInFlight && x.perAddr[client.Addr()] < x.st.perClient {
		evicted = x.evictLocked(now)
	}
	if x.st.ctx.Err() != nil || x.pending >= x.st.maxInFlight || x.perAddr[client.Addr()] >= x.st.perClient {
		x.mu.Unlock()
		x.st.counters.inFlightLimited.Add(1)
		// Dropped: the client retransmits. The entry the SYN made goes too,
		// so that the retransmission is NEW again and comes back here, not
		// to gVisor's TCP as a SYN of a known flow.
		g.ct.DeleteFlow(t, nil)
		return true
	}
	e := &xlEntry{}
	r := &TranslateRequest{x: x, g: g, tuple: t, syn: s, proto: proto, client: client, svc: svc, e: e, at: now}
	e.req = r
	if _, loaded := x.flows.LoadOrStore(t, e); loaded {
		x.mu.Unlock()
		return true // a retransmitted SYN of a request or flow we hold
	}
	x.n.Add(1)
	x.pending++
	x.perAddr[client.Addr()]++
	x.mu.Unlock()
	if evicted != nil {
		evicted.abortEvicted()
	}
	r.raw = append([]byte(nil), b...)
	x.st.handlers.Add(1)
	go x.handle(h, r)
	return true
}

func (x *translator) handle(h TranslatedHandler, r *TranslateRequest) {
	defer x.st.handlers.Done()
	growStack(0) // as handleTCP's (forward.go)
	defer func() {
		if p := recover(); p != nil {
			x.st.counters.handlerPanics.Add(1)
			x.st.logger.Error("translated TCP flow handler panicked", zap.Any("panic", p),
				zap.Stringer("client", r.client), zap.Stringer("service", r.svc), zap.ByteString("stack", debug.Stack()))
		}
		r.Refuse() // a no-op once answered
	}()
	h.HandleTranslated(r)
}

// release ends r's share of the in-flight bound, once.
func (r *TranslateRequest) release() {
	x := r.x
	x.mu.Lock()
	defer x.mu.Unlock()
	r.releaseLocked()
}

func (r *TranslateRequest) releaseLocked() {
	if r.released.Swap(true) {
		return
	}
	x := r.x
	x.pending--
	if x.perAddr[r.client.Addr()]--; x.perAddr[r.client.Addr()] <= 0 {
		delete(x.perAddr, r.client.Addr())
	}
	if r.halfOpen != nil {
		x.halfOpen.Remove(r.halfOpen)
		r.halfOpen = nil
	}
}

// evictLocked releases the slot of the oldest half-open handshake, if its
// SYN-ACK has waited xlHalfOpenAge, and returns its request, for the
// caller to reset once x.mu is unlocked.
func (x *translator) evictLocked(now time.Time) *TranslateRequest {
	front := x.halfOpen.Front()
	if front == nil {
		return nil
	}
	r := front.Value.(*TranslateRequest)
	if now.Sub(r.acceptedAt) < xlHalfOpenAge {
		return nil
	}
	r.releaseLocked()
	return r
}

// abortEvicted resets the flow of an evicted handshake: the client, if
// there is one, gets a RST; its endpoint socket is aborted; its owner
// ends it.
func (r *TranslateRequest) abortEvicted() {
	r.x.st.counters.handshakesAborted.Add(1)
	if t := r.e.flow.Load(); t != nil {
		t.Abort()
	}
}

// unregister forgets r's entry, if it is still r's.
func (r *TranslateRequest) unregister() {
	if r.x.flows.CompareAndDelete(r.tuple, r.e) {
		r.x.n.Add(-1)
	}
}

// Refuse answers the SYN with a RST, as a closed port does.
func (r *TranslateRequest) Refuse() {
	r.once.Do(func() {
		r.release()
		r.unregister()
		w := r.writer()
		buf := make([]byte, w.IPLen()+header.TCPMinimumSize)
		n := w.Build(buf, 0, r.syn.Seq()+1, tcpRST|tcpACK, 0, nil, nil)
		r.g.writeOwnSegment(buf[:n], r.proto)
	})
}

// Ignore drops the SYN without an answer (the client will retry).
func (r *TranslateRequest) Ignore() {
	r.once.Do(func() {
		r.release()
		r.unregister()
	})
}

// Fallback gives the SYN to gVisor: its forwarder hands the flow to
// HandleTCP, as if the translator were off.
func (r *TranslateRequest) Fallback() {
	r.once.Do(func() {
		r.release()
		r.unregister()
		r.g.toStack(r.proto, nil, r.raw, false)
	})
}

func (r *TranslateRequest) writer() translate.Writer { return translate.NewWriter(r.svc, r.client) }

// parseTCP reads the TCP segment of b, a whole IP packet whose lengths
// conntrack has checked (tcpOffset's packets), as far as its IP header's
// length says: link padding is not payload.
func parseTCP(b []byte) (translate.Segment, bool) {
	off, ok := tcpOffset(b)
	if !ok {
		return translate.Segment{}, false
	}
	end := len(b)
	if b[0]>>4 == 4 {
		end = min(end, int(binary.BigEndian.Uint16(b[2:])))
	} else {
		end = min(end, header.IPv6MinimumSize+int(binary.BigEndian.Uint16(b[4:])))
	}
	if end < off {
		return translate.Segment{}, false
	}
	return translate.Parse(b[off:end])
}

// EndpointSocket is what a translated flow does with its endpoint socket
// (translate's; proxy implements it).
type EndpointSocket = translate.EndpointSocket

// ErrSocketEmpty is EndpointSocket.Peek's EAGAIN.
var ErrSocketEmpty = translate.ErrSocketEmpty

// MovedTCP is a translated flow's state on its way to the next process
// (handover_linux.go).
type MovedTCP = translate.Moved

// TranslatedFlow is an accepted translated connection; its owner runs it.
type TranslatedFlow struct {
	f     *translate.Flow
	r     *TranslateRequest
	tm    sync.Mutex  // guards the timers' state
	timer *time.Timer // the flow's retransmission timer (armed: rtoOn)
	rtoOn bool
	ack   *time.Timer // the held ACK's
	ackOn bool
	wake  func() // ends the owner's wait for the socket's reads
	// waitWritable, the owner's, calls its argument once the full socket
	// takes bytes again; waiting says one wait is on.
	waitWritable func(then func())
	waiting      atomic.Bool
	// attached holds, while the flow is detached (handed over, Detach),
	// the channel Reattach closes; nil otherwise.
	attached atomic.Pointer[chan struct{}]
}

// Accept answers the SYN with a SYN-ACK, with sock carrying the flow's
// bytes (step 2). It returns nil when the SYN was handed to the next
// process meanwhile (HandOffHandshakes): the caller then closes sock. rcvWnd is the window to offer: the socket's send buffer.
// wake ends the owner's wait for reads; waitWritable waits for the socket
// to take bytes again, then calls its argument. bytes, if not nil, counts
// the bytes moved: [client->endpoint (written to the socket),
// endpoint->client (acknowledged by the client)].
func (r *TranslateRequest) Accept(sock EndpointSocket, rcvWnd uint32, wake func(), waitWritable func(then func()), bytes *[2]atomic.Uint64) *TranslatedFlow {
	var t *TranslatedFlow
	r.once.Do(func() {
		// The in-flight slot is kept until the client completes its
		// handshake (input) or the flow ends (Forget), as gVisor's
		// handshakes keep theirs.
		w := r.writer()
		mtu := int(r.g.MTU())
		mss := mtu - w.IPLen() - header.TCPMinimumSize
		t = &TranslatedFlow{r: r, wake: wake, waitWritable: waitWritable}
		var partial func([]byte, int, int)
		if r.g.segmentOut != nil {
			v6 := r.proto == header.IPv6ProtocolNumber
			partial = func(p []byte, hdrLen, mss int) { r.g.writeOwnPartial(p, v6, w.IPLen(), hdrLen, mss) }
		}
		acks := &r.x.st.acks
		t.f = translate.New(translate.Config{
			Sock: sock, Writer: w, Emit: func(p []byte) { r.g.writeOwnSegment(p, r.proto) }, EmitPartial: partial,
			Held:  &translate.HeldCounts{Superseded: &acks.superseded, Expired: &acks.expired, Dropped: &acks.dropped},
			Bytes: bytes, Now: time.Now,
			HSDeadline: r.at.Add(r.x.st.hsTimeout), HSAborted: &r.x.st.counters.handshakesAborted,
			ISS: rand.Uint32(), TSBase: rand.Uint32(), RcvWnd: rcvWnd, RcvShift: xlWindowShift, KeptBudget: &r.x.kept,
			LinkMSS: uint16(min(mss, 0xffff)),
		}, r.syn)
		t.timer = time.AfterFunc(time.Hour, t.onRTO)
		t.timer.Stop()
		t.ack = time.AfterFunc(time.Hour, t.flushAck)
		t.ack.Stop()
		r.x.mu.Lock()
		if !r.released.Load() {
			r.acceptedAt = r.x.st.now()
			r.halfOpen = r.x.halfOpen.PushBack(r)
		}
		r.x.mu.Unlock()
		r.e.flow.Store(t) // before the SYN-ACK: the client's answer finds the flow
		t.f.Start()
		t.syncTimers()
	})
	return t
}

// input is the gate's: a client segment b of the flow (step 3).
func (t *TranslatedFlow) input(b []byte) {
	defer t.contain()
	s, ok := parseTCP(b)
	if !ok {
		return
	}
	t.f.Input(s)
	st := t.syncTimers() // the flow's state, read once per segment
	if st.Closed {
		t.wake()
	}
	if !st.SynRcvd && !t.r.released.Load() {
		t.r.release() // the handshake is complete, or the flow ended
	}
	if st.SockFull && t.waiting.CompareAndSwap(false, true) {
		go t.waitWritable(func() {
			t.waiting.Store(false)
			t.Writable()
		})
	}
}

// Readable is the owner's report that the endpoint socket has bytes or its
// EOF; it reports whether the flow has ended.
func (t *TranslatedFlow) Readable() (ended bool) {
	defer t.containEnded(&ended)
	t.f.Readable()
	return t.syncTimers().Closed
}

// Writable is the owner's report that the endpoint socket, full before,
// takes bytes again.
func (t *TranslatedFlow) Writable() {
	defer t.contain()
	t.f.Writable()
	t.syncTimers()
}

// contain, deferred by every entry into the flow's TCP, ends a flow whose
// code panicked: reset both ways, counted and logged with its stack. A
// fault in one flow's TCP ends that flow, never the process (the gate calls
// input on the TUN's reader, which every flow shares). This is defence in
// depth: a panic it catches is a bug to fix. The flow's own lock is free
// again by then: every method that takes it releases it in a defer.
func (t *TranslatedFlow) contain() {
	if p := recover(); p != nil {
		t.contained(p)
	}
}

// containEnded is contain for an entry that reports whether the flow
// ended: it has, once a panic ended it.
func (t *TranslatedFlow) containEnded(ended *bool) {
	if p := recover(); p != nil {
		t.contained(p)
		*ended = true
	}
}

func (t *TranslatedFlow) contained(p any) {
	st := t.r.x.st
	st.counters.flowPanics.Add(1)
	st.logger.Error("translated TCP flow panicked: reset", zap.Any("panic", p),
		zap.Stringer("client", t.r.client), zap.Stringer("service", t.r.svc), zap.ByteString("stack", debug.Stack()))
	func() {
		defer func() { _ = recover() }() // a close that panics too leaves the flow to its owner's end
		t.Abort()
	}()
}

// Ended reports whether the flow is over.
func (t *TranslatedFlow) Ended() bool { return t.f.Ended() }

// Abort ends the flow with a RST to the client and an aborted socket.
func (t *TranslatedFlow) Abort() {
	t.r.x.st.resets.mark(t.r.tuple) // its entry may be gone: the RST still leaves (reset.go)
	t.f.Abort()
	t.syncTimers()
	t.wake()
}

// Forget unregisters the flow (step 4) and stops its timers.
func (t *TranslatedFlow) Forget() {
	t.r.release()
	t.r.unregister()
	t.tm.Lock()
	t.timer.Stop()
	t.ack.Stop()
	t.rtoOn, t.ackOn = false, false
	t.tm.Unlock()
}

// xlWindowShift is our window scale: 2^7 x 64 KiB = 8 MiB, the most a
// socket's send buffer grows to here.
const xlWindowShift = 7

// syncTimers arms or stops the flow's timers as its state asks. The
// retransmission timer is armed once per flight, not per segment.
func (t *TranslatedFlow) syncTimers() translate.State {
	// tm first, then the flow's state: a decision read earlier and applied
	// later could stop a timer another goroutine's newer one armed.
	t.tm.Lock()
	defer t.tm.Unlock()
	st := t.f.State()
	setTimer(t.timer, &t.rtoOn, st.RTO, st.RTODelay)
	setTimer(t.ack, &t.ackOn, st.Ack, st.AckDelay)
	return st
}

// setTimer arms tm for d when want and it is not on, or stops it when on
// and not wanted; on says which it is.
func setTimer(tm *time.Timer, on *bool, want bool, d time.Duration) {
	switch {
	case want && !*on:
		*on = true
		tm.Reset(d)
	case !want && *on:
		*on = false
		tm.Stop()
	}
}

func (t *TranslatedFlow) onRTO() {
	defer t.contain()
	t.tm.Lock()
	t.rtoOn = false
	t.tm.Unlock()
	t.r.x.st.counters.xlRTOFires.Add(1)
	if !t.f.OnRTO() {
		t.wake()
	}
	t.syncTimers()
}

func (t *TranslatedFlow) flushAck() {
	defer t.contain()
	t.tm.Lock()
	t.ackOn = false
	t.tm.Unlock()
	t.r.x.st.counters.xlAckFires.Add(1)
	t.f.FlushAck()
	t.syncTimers()
}

// lookup returns the registered flow of t, if any, and whether t
// is registered at all (a request or a flow): the gate's question.
func (x *translator) lookup(t conntrack.Tuple) (*TranslatedFlow, bool) {
	if x.n.Load() == 0 {
		return nil, false
	}
	v, ok := x.flows.Load(t)
	if !ok {
		return nil, false
	}
	return v.(*xlEntry).flow.Load(), true
}

package netstack

// The held ACK: gVisor's TCP acknowledges what it takes at once (every
// round of tcp.Endpoint.handleSegmentsLocked ends with sendAck); it has no
// delayed ACK. On kube-proxy's path the client talks to the endpoint's own
// kernel, which holds back the ACK of a lone segment for the answer to carry
// (net/ipv4/tcp_input.c, __tcp_ack_snd_check: at once only when more than one
// full segment is unacknowledged, else tcp_send_delayed_ack; a FIN's ACK
// waits too, tcp_fin entering pingpong mode). Here that extra pure ACK is
// also a TUN write on the request's path: at one P, gVisor's processor
// writes it before the copier it woke passes the request to the endpoint
// (BENCHMARKS.md). So the link's gate holds it, per flow:
//
//  1. conntrack says when a client's segment with data or a FIN is lone: it
//     starts where the client's data ended, all of which the flow's replies
//     had acknowledged (Result.LoneSegment). Unless an ACK of that flow is
//     held already, the holder notes the segment.
//  2. A pure ACK of the flow (the ACK flag alone, no payload), written alone,
//     that acknowledges exactly the noted segment is held, for at most
//     ackHold.
//  3. The flow's next outbound segment carries the same acknowledgment or a
//     later one and a fresher window: the held ACK is dropped (superseded).
//     After ackHold it is written as it was (expired). A RST from the client
//     that gVisor takes (at the sequence number it expects) drops it; one
//     that gVisor ignores lets it out (flushed), as does an outbound segment
//     with an older acknowledgment.
//
// A second segment from the client while the first one's ACK is held (or
// before it is written) is not noted, and the ACK gVisor then writes,
// covering both, supersedes the held one and goes out at once: the kernel's
// ACK of every second segment. A note or a hold lasts ackHold at most, so
// the holder keeps no state for a flow that went quiet; an entry is made
// only for a lone segment, and there are at most maxAckFlows.

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// ackHold bounds how long an ACK is held: far below any retransmission
// timeout (200 ms at least, RFC 6298 as Linux applies it) and below the
// kernel's least delayed-ACK timeout (TCP_DELACK_MIN, 40 ms), so that a
// client pairing Nagle's algorithm with small writes waits no longer than it
// would for the endpoint's kernel.
const ackHold = time.Millisecond

// maxAckFlows bounds the flows with a note or a held ACK at once; past it a
// lone segment is not noted, and its ACK goes out at once.
const maxAckFlows = 4096

// ackFlow is one flow's note or held ACK (steps 1-3).
type ackFlow struct {
	noted              bool // a lone client segment [notedSeq, notedEnd) awaits its ACK
	notedSeq, notedEnd uint32
	held               *stack.PacketBuffer
	heldAck            uint32    // held's ACK number
	at                 time.Time // when noted, or held: the entry goes at at+limit
}

// ackDue is an entry's place in the expiry queue: every entry lives for
// the same limit, so the queue is in the order of at. A record whose entry
// was since made again (its at differs) is stale and passed over.
type ackDue struct {
	flow conntrack.Tuple
	at   time.Time
}

// ackHolder is the link gate's held-ACK state (steps 1-3).
type ackHolder struct {
	limit time.Duration                // ackHold
	write func(stack.PacketBufferList) // the link's write, for a held ACK that goes out
	now   func() time.Time

	// n is len(flows), set under mu: out passes over every segment without
	// taking mu while there are none.
	n atomic.Int32

	mu     sync.Mutex
	flows  map[conntrack.Tuple]ackFlow
	due    []ackDue // from due[head]: the expiry queue
	head   int
	armed  bool // timer is set for due[head]
	timer  *time.Timer
	closed bool

	// superseded, expired and flushed count held ACKs by how their hold
	// ended; dropped counts those a client's RST or the stack's close took.
	superseded, expired, flushed, dropped atomic.Uint64
}

// init readies h; the zero ackHolder holds nothing and closes.
func (h *ackHolder) init(write func(stack.PacketBufferList), limit time.Duration, now func() time.Time) {
	h.limit, h.write, h.now = limit, write, now
	h.flows = make(map[conntrack.Tuple]ackFlow)
	h.timer = time.AfterFunc(time.Hour, h.expire)
	h.timer.Stop()
}

// tcpSeg is what the holder reads of a TCP segment.
type tcpSeg struct {
	seq, ack uint32
	flags    byte
	payload  int
}

// readTCPSeg reads b, a TCP segment's IP and TCP headers at least
// (tcpOffset), taking the payload's length from the IP header.
func readTCPSeg(b []byte) (tcpSeg, bool) {
	off, ok := tcpOffset(b)
	if !ok {
		return tcpSeg{}, false
	}
	var ipPayload int
	if b[0]>>4 == 4 {
		ipPayload = int(binary.BigEndian.Uint16(b[2:])) - off
	} else {
		ipPayload = int(binary.BigEndian.Uint16(b[4:]))
	}
	t := b[off:]
	s := tcpSeg{
		seq:     binary.BigEndian.Uint32(t[4:]),
		ack:     binary.BigEndian.Uint32(t[8:]),
		flags:   t[13],
		payload: ipPayload - int(t[12]>>4)*4,
	}
	return s, s.payload >= 0
}

// in sees an ESTABLISHED segment from the client of flow t, b the whole
// packet, lone what conntrack said of it (steps 1 and 3).
func (h *ackHolder) in(t conntrack.Tuple, b []byte, lone bool) {
	if !lone && h.n.Load() == 0 {
		return // nothing to note, nothing held
	}
	s, ok := readTCPSeg(b)
	if !ok {
		return
	}
	rst := s.flags&tcpRST != 0
	if !rst && s.payload == 0 && s.flags&tcpFIN == 0 || s.flags&tcpSYN != 0 {
		return // a pure ACK, or a SYN conntrack let through: nothing to acknowledge
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.flows[t]
	switch {
	case rst:
		if !ok {
			return
		}
		if f.held != nil && s.seq != f.heldAck {
			// gVisor takes only a RST at the sequence number it expects
			// next; it ignores this one (a challenge ACK at most, rate
			// limited), and the client still needs the ACK.
			h.flushed.Add(1)
			h.writeLocked(&f)
		} else if f.held != nil {
			h.dropLocked(&f)
			h.dropped.Add(1)
		}
		h.deleteLocked(t)
	case ok && f.held != nil:
		// A second segment: not noted, and the ACK of both goes out at
		// once, superseding the held one.
	case !lone || h.closed || h.flows == nil || !ok && len(h.flows) >= maxAckFlows:
		if ok {
			h.deleteLocked(t) // a segment that is not the only one unacknowledged
		}
	default:
		end := s.seq + uint32(s.payload)
		if s.flags&tcpFIN != 0 {
			end++
		}
		f.noted, f.notedSeq, f.notedEnd, f.at = true, s.seq, end, h.now()
		h.putLocked(t, f, true)
	}
}

// out sees a valid outbound segment of flow t on its way to the link, b its
// IP and TCP headers at least; holdable says it is the only packet of its
// write and of an ESTABLISHED flow. It reports whether it holds pkt (step
// 2), which the caller then leaves out of the write.
func (h *ackHolder) out(t conntrack.Tuple, b []byte, pkt *stack.PacketBuffer, holdable bool) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.flows[t]
	if !ok || h.closed {
		return false
	}
	s, ok := readTCPSeg(b)
	if !ok {
		return false
	}
	if f.held != nil {
		if int32(s.ack-f.heldAck) >= 0 || s.flags&tcpACK == 0 {
			// Step 3: this segment goes out after it and says as much (or
			// is a RST, after which nothing is acknowledged).
			h.dropLocked(&f)
			h.superseded.Add(1)
		} else {
			// An older acknowledgment: gVisor sends none, but it would not
			// carry the held one.
			h.flushed.Add(1)
			h.writeLocked(&f)
		}
	}
	switch {
	case holdable && f.noted && s.flags == tcpACK && s.payload == 0 && s.ack == f.notedEnd:
		pkt.IncRef()
		f.noted, f.held, f.heldAck, f.at = false, pkt, s.ack, h.now()
		h.putLocked(t, f, true)
		return true
	case f.noted && s.flags&tcpACK != 0 && s.ack == f.notedSeq:
		h.flows[t] = f // nothing of the noted segment acknowledged yet
	default:
		h.deleteLocked(t) // acknowledged, by this segment or by the written ACK
	}
	return false
}

// resetOut sees a RST of flow t that the gate lets out after the flow's
// entry went (reset.go): a held ACK of the flow is dropped, as it would be
// behind any later segment.
func (h *ackHolder) resetOut(t conntrack.Tuple) {
	if h.n.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	f, ok := h.flows[t]
	if !ok {
		return
	}
	if f.held != nil {
		h.dropLocked(&f)
		h.dropped.Add(1)
	}
	h.deleteLocked(t)
}

// putLocked stores f for t; queued says f.at is new, and the entry goes
// at f.at+limit.
func (h *ackHolder) putLocked(t conntrack.Tuple, f ackFlow, queued bool) {
	h.flows[t] = f
	h.n.Store(int32(len(h.flows)))
	if !queued {
		return
	}
	h.due = append(h.due, ackDue{t, f.at})
	if !h.armed {
		h.armed = true
		h.timer.Reset(h.limit)
	}
}

// deleteLocked ends t's entry; the last one leaves the holder idle, so that
// a flow whose ACKs are superseded one exchange after another (a
// request/response client) never has the timer fire.
func (h *ackHolder) deleteLocked(t conntrack.Tuple) {
	delete(h.flows, t)
	h.n.Store(int32(len(h.flows)))
	if len(h.flows) == 0 {
		h.idleLocked()
	}
}

// idleLocked empties the expiry queue, whose records are all stale, and
// stops the timer.
func (h *ackHolder) idleLocked() {
	clear(h.due[h.head:])
	h.due, h.head = h.due[:0], 0
	if h.armed {
		h.armed = false
		h.timer.Stop()
	}
}

// expire ends the entries whose time is up, writing their held ACKs (step
// 3); it runs on the timer's goroutine.
func (h *ackHolder) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	for h.head < len(h.due) {
		d := h.due[h.head]
		f, ok := h.flows[d.flow]
		if ok && f.at.Equal(d.at) {
			if left := h.limit - now.Sub(d.at); left > 0 {
				// The first live entry sets the next firing; a stale
				// record before it must not, or the timer fires once
				// per record instead of once per limit.
				h.timer.Reset(left)
				h.compactLocked()
				return
			}
		}
		h.due[h.head] = ackDue{}
		h.head++
		if !ok || !f.at.Equal(d.at) {
			continue // stale
		}
		if f.held != nil {
			h.expired.Add(1) // before the write, which a reader may be waiting for
			h.writeLocked(&f)
		}
		h.deleteLocked(d.flow)
	}
	h.idleLocked()
}

// compactLocked moves the queue to the front of its array once most of it
// is spent, so that it does not grow while the timer keeps firing.
func (h *ackHolder) compactLocked() {
	if h.head > len(h.due)/2 {
		n := copy(h.due, h.due[h.head:])
		clear(h.due[n:])
		h.due, h.head = h.due[:n], 0
	}
}

// writeLocked writes f's held ACK, under mu, so that no later segment of
// its flow overtakes it.
func (h *ackHolder) writeLocked(f *ackFlow) {
	pkt := f.held
	f.held = nil
	var pl stack.PacketBufferList
	pl.PushBack(pkt)
	h.write(pl)
	pl.DecRef()
}

func (h *ackHolder) dropLocked(f *ackFlow) {
	f.held.DecRef()
	f.held = nil
}

// close drops the held ACKs and holds no more: the link is closing.
func (h *ackHolder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.timer != nil {
		h.timer.Stop()
	}
	for t, f := range h.flows {
		if f.held != nil {
			h.dropLocked(&f)
			h.dropped.Add(1)
		}
		delete(h.flows, t)
	}
	h.n.Store(0)
	h.due, h.head = nil, 0
}

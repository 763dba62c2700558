package netstack

// The held ACK: gVisor's TCP acknowledges what it takes at once (every
// round of tcp.Endpoint.handleSegmentsLocked ends with sendAck); it has no
// delayed ACK. On kube-proxy's path the client talks to the endpoint's own
// kernel, which holds back the ACK of a lone segment for the answer to carry
// (net/ipv4/tcp_input.c, __tcp_ack_snd_check: at once only when more than one
// full segment is unacknowledged, else tcp_send_delayed_ack). Here that extra
// pure ACK is also a TUN write on the request's path: at one P, gVisor's
// processor writes it before the copier it woke passes the request to the
// endpoint (BENCHMARKS.md). So the link's gate holds it:
//
//  1. The gate follows one flow at a time, the last one whose client sent
//     data: it learns from the flow's outbound segments the ACK number last
//     written to that client, and notes a data segment from the client that
//     starts there (then it is the only data the client has not had
//     acknowledged: one segment).
//  2. A pure ACK of that flow (the ACK flag alone, no payload), written alone,
//     that acknowledges exactly the noted segment is held, for at most
//     ackHold.
//  3. The flow's next outbound segment carries the same acknowledgment or a
//     later one and a fresher window: the held ACK is dropped (superseded).
//     After ackHold, or when a client sends data on another flow, it is
//     written as it was (expired, flushed). A RST from the client that
//     gVisor takes (at the sequence number it expects) drops it; one that
//     gVisor ignores lets it out.
//
// A second segment from the client before the ACK is written is not noted
// (step 1: it does not start at the last ACK written), and the ACK gVisor
// then writes, covering both, supersedes the held one and goes out at once:
// the kernel's ACK of every second segment.

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

// ackHolder is the link gate's held-ACK state (steps 1-3).
type ackHolder struct {
	limit time.Duration                // ackHold
	write func(stack.PacketBufferList) // the link's write, for a held ACK that goes out
	now   func() time.Time

	// port is the followed flow's client port + 1 (0: none), set under mu:
	// out passes over the segments of other flows without taking mu.
	port atomic.Uint32

	mu       sync.Mutex
	flow     conntrack.Tuple // the flow followed
	ackKnown bool            // lastAck holds a value
	lastAck  uint32          // the ACK number last written to the flow's client
	noted    bool            // a client segment [lastAck, notedEnd) came in
	notedEnd uint32
	held     *stack.PacketBuffer
	heldAck  uint32 // its ACK number
	heldAt   time.Time
	timer    *time.Timer
	closed   bool

	// superseded, expired and flushed count held ACKs by how their hold
	// ended; dropped counts those a client's RST or the stack's close took.
	superseded, expired, flushed, dropped atomic.Uint64
}

// init readies h; the zero ackHolder holds nothing and closes.
func (h *ackHolder) init(write func(stack.PacketBufferList), limit time.Duration, now func() time.Time) {
	h.limit, h.write, h.now = limit, write, now
	h.timer = time.AfterFunc(time.Hour, h.expire)
	h.timer.Stop()
}

// follow makes t the followed flow (the zero Tuple: none); under mu.
func (h *ackHolder) follow(t conntrack.Tuple) {
	h.flow, h.ackKnown, h.noted = t, false, false
	if t.IsValid() {
		h.port.Store(uint32(t.SrcPort()) + 1)
	} else {
		h.port.Store(0)
	}
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
// packet (steps 1 and 3).
func (h *ackHolder) in(t conntrack.Tuple, b []byte) {
	s, ok := readTCPSeg(b)
	if !ok {
		return
	}
	rst := s.flags&tcpRST != 0
	data := s.payload > 0 && s.flags&(tcpSYN|tcpFIN|tcpRST) == 0
	if !rst && !data {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t != h.flow {
		if data {
			h.flushLocked()
			h.follow(t)
		}
		return
	}
	if rst {
		if h.held != nil && s.seq != h.heldAck {
			// gVisor takes only a RST at the sequence number it expects
			// next; it ignores this one (a challenge ACK at most, rate
			// limited), and the client still needs the ACK.
			h.flushLocked()
			return
		}
		if h.held != nil {
			h.dropLocked()
			h.dropped.Add(1)
		}
		h.follow(conntrack.Tuple{})
		return
	}
	h.noted = h.ackKnown && s.seq == h.lastAck
	h.notedEnd = s.seq + uint32(s.payload)
}

// out sees a valid outbound segment of flow t on its way to the link, b its
// IP and TCP headers at least; holdable says it is the only packet of its
// write and of an ESTABLISHED flow. It reports whether it holds pkt (step
// 2), which the caller then leaves out of the write.
func (h *ackHolder) out(t conntrack.Tuple, b []byte, pkt *stack.PacketBuffer, holdable bool) bool {
	if h.port.Load() != uint32(t.SrcPort())+1 {
		return false // not the followed flow
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t != h.flow || h.closed {
		return false
	}
	s, ok := readTCPSeg(b)
	if !ok {
		return false
	}
	if h.held != nil {
		if int32(s.ack-h.heldAck) >= 0 || s.flags&tcpACK == 0 {
			// Step 3: this segment goes out after it and says as much (or
			// is a RST, after which nothing is acknowledged).
			h.dropLocked()
			h.superseded.Add(1)
		} else {
			h.flushLocked() // an older acknowledgment: gVisor sends none, but it would not carry the held one
		}
	}
	if s.flags&tcpACK == 0 {
		h.ackKnown, h.noted = false, false
		return false
	}
	if holdable && h.noted && s.flags == tcpACK && s.payload == 0 && s.ack == h.notedEnd {
		h.noted = false
		pkt.IncRef()
		h.held, h.heldAck, h.heldAt = pkt, s.ack, h.now()
		h.timer.Reset(h.limit)
		return true
	}
	if !h.ackKnown || s.ack != h.lastAck {
		h.noted = false // the noted segment is acknowledged, or no longer alone
	}
	h.lastAck, h.ackKnown = s.ack, true
	return false
}

// resetOut sees a RST of flow t that the gate lets out after the flow's
// entry went (reset.go): a held ACK of the flow is dropped, as it would be
// behind any later segment.
func (h *ackHolder) resetOut(t conntrack.Tuple) {
	if h.port.Load() != uint32(t.SrcPort())+1 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if t == h.flow && h.held != nil {
		h.dropLocked()
		h.dropped.Add(1)
	}
}

// expire writes a held ACK whose time is up (step 3); it runs on the
// timer's goroutine.
func (h *ackHolder) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		return // superseded meanwhile
	}
	if left := h.limit - h.now().Sub(h.heldAt); left > 0 {
		h.timer.Reset(left) // a firing armed for an earlier hold
		return
	}
	h.expired.Add(1) // before the write, which a reader may be waiting for
	h.writeLocked()
}

// flushLocked writes a held ACK now: its flow is no longer followed.
func (h *ackHolder) flushLocked() {
	if h.held != nil {
		h.flushed.Add(1)
		h.writeLocked()
	}
}

// writeLocked writes the held ACK, under mu, so that no later segment of
// its flow overtakes it; the flow's client then has lastAck.
func (h *ackHolder) writeLocked() {
	pkt := h.held
	h.held = nil
	h.timer.Stop()
	h.lastAck, h.ackKnown = h.heldAck, true
	var pl stack.PacketBufferList
	pl.PushBack(pkt)
	h.write(pl)
	pl.DecRef()
}

func (h *ackHolder) dropLocked() {
	h.held.DecRef()
	h.held = nil
	h.timer.Stop()
}

// close drops a held ACK and holds no more: the link is closing.
func (h *ackHolder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.held != nil {
		h.dropLocked()
		h.dropped.Add(1)
	}
}

package netstack

// The SYN-ACK window: gVisor writes a forwarded connection's SYN-ACK while
// it holds the new endpoint's lock (tcp.listenContext.startHandshake), and
// the write into a TUN runs the client's side of the handshake inside the
// same system call: the client's ACK, often with its first data, is in the
// TUN before the write returns. Delivered then, it wakes gVisor's TCP
// processor, which cannot take the endpoint's lock and queues the endpoint
// again and again until the writer lets go (processor.start): a spin on a
// CPU that the client, just woken, needs. So:
//
//  1. The gate registers a flow while it writes the flow's SYN-ACK to the
//     link, and ends the registration when the write returns.
//  2. The gate's reader, given a TCP segment of a registered flow, waits
//     for that write to end (at most synAckWait, in case a link's write
//     blocks) before it delivers the segment: in order, after the writer
//     let go of the lock or is about to.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/userproxy/userproxy/conntrack"
)

// synAckWait bounds the reader's wait for one SYN-ACK write.
const synAckWait = time.Millisecond

// synAckWrites is the set of flows whose SYN-ACK is being written, shared
// by a Stack's gates.
type synAckWrites struct {
	limit time.Duration // the longest wait: synAckWait
	n     atomic.Int64  // registered flows: the readers look only when > 0
	flows sync.Map      // conntrack.Tuple -> chan struct{}, closed when the write ends
	// written counts the segments a reader held back until the write
	// returned, timedOut those it delivered at the limit.
	written, timedOut atomic.Uint64
}

// begin registers t (step 1); end ends the registration.
func (s *synAckWrites) begin(t conntrack.Tuple) (end func()) {
	ch := make(chan struct{})
	if _, loaded := s.flows.LoadOrStore(t, ch); loaded {
		return func() {} // a retransmission racing the first: one registration is enough
	}
	s.n.Add(1)
	return func() {
		s.flows.Delete(t)
		s.n.Add(-1)
		close(ch)
	}
}

// wait returns when t has no SYN-ACK being written, or after s.limit
// (step 2).
func (s *synAckWrites) wait(t conntrack.Tuple) {
	if s.n.Load() == 0 {
		return
	}
	v, ok := s.flows.Load(t)
	if !ok {
		return
	}
	timer := time.NewTimer(s.limit)
	select {
	case <-v.(chan struct{}):
		s.written.Add(1)
	case <-timer.C:
		s.timedOut.Add(1)
	}
	timer.Stop()
}

// isSynAck reports whether b, a valid IPv4 or IPv6 TCP packet, is a
// SYN-ACK: it reads the flags alone, for every TCP packet the stack writes.
func isSynAck(b []byte) bool {
	off, ok := tcpOffset(b)
	return ok && b[off+13]&(tcpSYN|tcpACK) == tcpSYN|tcpACK
}

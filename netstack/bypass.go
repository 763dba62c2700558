package netstack

// The UDP bypass: once a UDP flow has its endpoint socket, the gate hands
// the flow's later client datagrams straight to the flow handler's function
// instead of delivering them through gVisor to the flow's socket, where a
// relay goroutine would have to be woken for each one.
//
//  1. The handler registers the flow (UDPRequest.Forward) after it bound it.
//  2. The gate classifies every datagram as before (conntrack accounting,
//     INVALID drops); an ESTABLISHED Original-direction datagram of a
//     registered flow goes to the function, with its UDP payload, on the
//     gate's goroutine.
//  3. Replies go out from the service address, written by the gate
//     (Reply, udpreply.go), also without gVisor's UDP endpoint.
//
//  4. Datagrams that reach the flow's socket anyway — queued before the
//     registration, or classified by a gate just before it — are drained
//     from the socket to the same function when it becomes readable, on
//     the goroutine that delivered them, so that no relay goroutine and no
//     read buffer waits on the socket of an idle flow.
//
// The first few datagrams may overtake each other; UDP promises no order.

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/userproxy/userproxy/conntrack"
)

// udpBypass is the registry shared by a Stack's gates.
type udpBypass struct {
	n     atomic.Int64 // registered flows: the gate looks only when > 0
	flows sync.Map     // conntrack.Tuple -> *bypassFlow
}

type bypassFlow struct{ fn func(payload []byte) }

// take hands b's UDP payload to the flow's function when the flow is
// registered; it reports whether it did. b is the whole IP packet, already
// validated by conntrack.
func (u *udpBypass) take(t conntrack.Tuple, b []byte) bool {
	if u.n.Load() == 0 {
		return false
	}
	v, ok := u.flows.Load(t)
	if !ok {
		return false
	}
	p, ok := udpPayload(b)
	if !ok {
		return false
	}
	v.(*bypassFlow).fn(p)
	return true
}

// udpPayload returns the payload of a UDP datagram in IPv4 (any header
// length) or IPv6 without extension headers; other packets stay on the
// ordinary path.
func udpPayload(b []byte) ([]byte, bool) {
	var off int
	switch {
	case len(b) >= 20 && b[0]>>4 == 4 && b[9] == 17:
		off = int(b[0]&0x0f) * 4
	case len(b) >= 40 && b[0]>>4 == 6 && b[6] == 17:
		off = 40
	default:
		return nil, false
	}
	if len(b) < off+8 {
		return nil, false
	}
	ulen := int(binary.BigEndian.Uint16(b[off+4:]))
	if ulen < 8 || off+ulen > len(b) {
		return nil, false
	}
	return b[off+8 : off+ulen], true
}

// Forward registers fn to receive the payload of every later datagram of
// this flow from the client: on the gate's goroutine instead of delivering
// the datagram to Conn, and, for datagrams already queued on Conn or that
// reach it meanwhile, on the goroutine that queued them (step 4). Do not
// read from Conn until stop. fn must not block and must not keep the slice
// past its return (the buffer is reused); it may be called concurrently.
// The returned function unregisters it; call it before closing what fn
// writes to. A flow registers at most once.
func (r *UDPRequest) Forward(fn func(payload []byte)) (stop func()) {
	t := r.Tuple()
	f := &bypassFlow{fn: fn}
	if _, loaded := r.bypass.flows.LoadOrStore(t, f); loaded {
		return func() {}
	}
	r.bypass.n.Add(1)
	var entry waiter.Entry
	if r.ep != nil {
		entry = waiter.NewFunctionEntry(waiter.ReadableEvents, func(waiter.EventMask) { r.drain(fn) })
		r.wq.EventRegister(&entry)
		r.drain(fn) // what was queued before the registration
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if r.ep != nil {
				r.wq.EventUnregister(&entry)
			}
			if r.bypass.flows.CompareAndDelete(t, f) {
				r.bypass.n.Add(-1)
			}
		})
	}
}

// drain hands the datagrams queued on the flow's socket to fn, without
// waiting for more. gVisor reports a pending error (an ICMP error from the
// client) before the queue; drain goes on past it, since gVisor notifies
// readers only when the queue turns non-empty.
func (r *UDPRequest) drain(fn func(payload []byte)) {
	var bp *[]byte
	defer func() {
		if bp != nil {
			packetPool.Put(bp)
		}
	}()
	for errs := 0; errs < 4; {
		if bp == nil {
			bp = packetPool.Get().(*[]byte)
		}
		w := tcpip.SliceWriter(*bp)
		res, err := r.ep.Read(&w, tcpip.ReadOptions{})
		switch err.(type) {
		case nil:
			errs = 0
			fn((*bp)[:res.Count])
		case *tcpip.ErrWouldBlock, *tcpip.ErrClosedForReceive:
			return
		default:
			errs++
		}
	}
}

// ErrReplyDropped is returned by Reply when the flow's send buffer is full:
// the datagram is dropped, as a full queue drops it, and the flow goes on.
var ErrReplyDropped = errors.New("netstack: UDP reply dropped (send buffer full)")

// Reply sends b to the client from the service address without ever
// waiting: the gate writes it (udpreply.go), or, past the link's MTU, the
// flow's gVisor endpoint, whose fragments the gate drops (docs/conformance.md,
// differences). A datagram the link or a full send buffer cannot take is
// dropped (ErrReplyDropped), and so is one the endpoint refuses for an ICMP
// error the client sent; any other error means the flow or the stack is
// closed. Not safe for concurrent use; b is not kept. A flow adopted from
// another process (AdoptUDP) has no endpoint: a datagram past the MTU is
// dropped.
func (r *UDPRequest) Reply(b []byte) error {
	if r.out != nil {
		if done, err := r.replyDirect(b); done {
			return err
		}
	}
	if r.ep == nil {
		if r.closed.Load() {
			return errReplyClosed
		}
		return ErrReplyDropped
	}
	return r.replyThroughEndpoint(b)
}

// replyThroughEndpoint is Reply through the flow's gVisor endpoint.
func (r *UDPRequest) replyThroughEndpoint(b []byte) error {
	r.reply.Reset(b)
	_, err := r.ep.Write(&r.reply, tcpip.WriteOptions{})
	switch err.(type) {
	case nil:
		return nil
	case *tcpip.ErrWouldBlock, *tcpip.ErrNoBufferSpace, *tcpip.ErrConnectionRefused, *tcpip.ErrNetworkUnreachable, *tcpip.ErrHostUnreachable:
		return ErrReplyDropped
	}
	return errors.New("netstack: UDP reply: " + err.String())
}

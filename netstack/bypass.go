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
//  3. Replies still go through gVisor (the flow's socket), so that the
//     client sees them from the service address.
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
// waiting for more.
func (r *UDPRequest) drain(fn func(payload []byte)) {
	var bp *[]byte
	defer func() {
		if bp != nil {
			packetPool.Put(bp)
		}
	}()
	for {
		if bp == nil {
			bp = packetPool.Get().(*[]byte)
		}
		w := tcpip.SliceWriter(*bp)
		res, err := r.ep.Read(&w, tcpip.ReadOptions{})
		if err != nil {
			return // empty (ErrWouldBlock) or closed
		}
		fn((*bp)[:res.Count])
	}
}

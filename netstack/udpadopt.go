package netstack

// UDP flows handed over by the process that ran them before (a handover):
// gVisor's forwarder never saw their first datagram, so no endpoint of
// gVisor's stands behind them. AdoptUDP gives the flow handler what
// HandleUDP gets from the forwarder, minus the socket:
//
//  1. Forward registers the bypass: the client's datagrams go to the
//     handler's function from the gate, as for any flow (bypass.go).
//  2. Reply writes to the client from the service address through the
//     link's gate (udpreply.go). A reply past the link's MTU is dropped:
//     gVisor would have fragmented it, and the gate drops fragments anyway.
//  3. Close ends the request: Reply fails from then on.
//  4. Context is done when the stack closes.

import (
	"errors"
	"fmt"

	"github.com/userproxy/userproxy/conntrack"
)

// AdoptUDP returns the request of a UDP flow another process carried, for
// tuple (client -> service). Its Conn is nil: the flow has no socket in
// this stack, only Forward, Reply and Close. The flow's conntrack entry
// must be restored first, or the gate drops its datagrams.
func (st *Stack) AdoptUDP(tuple conntrack.Tuple) (*UDPRequest, error) {
	if tuple.Proto() != conntrack.UDP {
		return nil, fmt.Errorf("netstack: adopting %v: not a UDP flow", tuple)
	}
	g := st.gates[linkNIC]
	st.mu.Lock()
	closed := st.closed
	st.mu.Unlock()
	if closed || g == nil {
		return nil, errors.New("netstack: adopting a UDP flow: the stack is closed")
	}
	return &UDPRequest{client: tuple.Src(), svc: tuple.Dst(), ctx: st.ctx, bypass: &st.bypass, out: g}, nil
}

// Close closes the request's Conn, if it has one, and makes Reply fail
// from then on. A handler may call it instead of Conn.Close; it is
// idempotent.
func (r *UDPRequest) Close() error {
	if r.Conn == nil {
		r.closed.Store(true)
		return nil
	}
	return r.Conn.Close()
}

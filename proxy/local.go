package proxy

// Local servers: a flow to an address of the proxy's own, served in-process
// (cluster DNS at the DNS service IP):
//
//  1. SetLocal registers a handler for ip:port.
//  2. Admit accepts a new flow to that address only while no service of
//     the table has a port at ip:port in either protocol: a real Service
//     there (a cluster's kube-dns, reached through us) wins and the local
//     server steps aside.
//  3. HandleTCP completes the handshake and hands the connection to the
//     handler; HandleUDP hands it the flow's connected socket. The flow is
//     tracked like a proxied one (with no endpoint on its entry): when its
//     conntrack entry leaves the table, or on Shutdown, its connection is
//     reset or closed, and the handler's next read fails.
//  4. When the handler returns, the connection is closed; a UDP flow's
//     conntrack entry goes too, so a later datagram is a new flow.

import (
	"net"
	"net/netip"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// LocalHandler serves flows to a local address (see SetLocal). Its methods
// run on the flow's own goroutine and may block for the life of the flow.
// They must return once conn fails (it is closed under them when the flow's
// conntrack entry ends, or on Shutdown); the proxy closes conn after they
// return, so they need not. Called concurrently for different flows.
type LocalHandler interface {
	// ServeTCP serves one accepted TCP connection.
	ServeTCP(conn net.Conn)
	// ServeUDP serves one UDP flow: conn reads the client's datagrams and
	// writes replies from the local address.
	ServeUDP(conn net.Conn)
}

// SetLocal makes h serve flows to addr (TCP and UDP) while no service port
// claims addr (step 2); a nil h removes the address. Safe for concurrent
// use with the datapath.
func (p *Proxy) SetLocal(addr netip.AddrPort, h LocalHandler) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	next := map[netip.AddrPort]LocalHandler{}
	if cur := p.locals.Load(); cur != nil {
		for k, v := range *cur {
			next[k] = v
		}
	}
	if h == nil {
		delete(next, addr)
	} else {
		next[addr] = h
	}
	p.locals.Store(&next)
}

// localFor returns the handler that serves flows to dst under table t, or
// nil: none is registered, or a service has a port there (step 2).
func (p *Proxy) localFor(t *service.Table, dst netip.AddrPort) LocalHandler {
	m := p.locals.Load()
	if m == nil || t == nil {
		return nil
	}
	h := (*m)[dst]
	if h == nil {
		return nil
	}
	if _, owned := t.PortOwner(dst.Addr(), dst.Port()); owned {
		return nil
	}
	return h
}

// serveLocalTCP completes the handshake and runs the handler (steps 3, 4).
func (p *Proxy) serveLocalTCP(r *netstack.TCPRequest, h LocalHandler) {
	tuple := r.Tuple()
	conn, err := r.Accept()
	if err != nil {
		return
	}
	defer conn.Close()
	p.stats.count(conntrack.TCP, ResultLocal)
	if ce := p.logger.Check(zap.DebugLevel, "local TCP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("local", r.Service()))
	}
	f := newFlow(tuple, true, conntrack.Binding{}, func(bool) { _ = conn.Abort() })
	defer p.untrack(f)
	if !p.track(f) {
		_ = conn.Abort()
		return
	}
	h.ServeTCP(conn)
}

// serveLocalUDP runs the handler on the flow's socket (steps 3, 4); the
// caller closes it and holds the flow's UDP session slot.
func (p *Proxy) serveLocalUDP(r *netstack.UDPRequest, h LocalHandler) {
	tuple := r.Tuple()
	p.stats.count(conntrack.UDP, ResultLocal)
	if ce := p.logger.Check(zap.DebugLevel, "local UDP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("local", r.Service()))
	}
	var removed atomic.Bool
	f := newFlow(tuple, false, conntrack.Binding{}, func(reaped bool) { removed.Store(reaped); _ = r.Conn.Close() })
	defer p.untrack(f)
	if p.track(f) {
		h.ServeUDP(r.Conn)
	}
	if !removed.Load() {
		// The handler ended the flow (idle): forget it, so a later
		// datagram is admitted afresh.
		p.ct.DeleteFlow(tuple, f)
	}
}

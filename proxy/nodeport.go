package proxy

// NodePorts, served on host sockets (DESIGN.md section 4, "Front ends"):
//
//  1. Sync opens a listener (TCP) or socket (UDP) on every NodePort address
//     (--nodeport-addresses, loopback by default) for every NodePort of the
//     table, of the address's family, and closes those no Service has any
//     more. A port taken on the host is logged once, counted and listed
//     (Failed, Notes); it never stops the proxy or its other ports.
//  2. A new flow — an accepted connection, or a datagram from a new client
//     address — is resolved as external traffic to that NodePort
//     (resolveNodePort: externalTrafficPolicy, the short-circuit for this
//     host's own sources; source ranges do not apply), tracked in conntrack
//     (Track: the table sees none of its packets), picked, dialled and
//     spliced or relayed like a TUN flow, with its binding and counts on
//     the entry.
//  3. A refused flow is reset (TCP) or dropped (UDP): the kernel completed
//     the handshake before the proxy could decide, so REJECT and DROP are
//     not exact here (docs/conformance.md).
//  4. The entry is touched while the flow is active and deleted when the
//     flow ends on its own; its removal otherwise (timeout, flush, endpoint
//     gone) ends the flow through the reaper, as for every flow.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

// NodePorts is the NodePort front end of a Proxy. Its methods are safe for
// concurrent use.
type NodePorts struct {
	p     *Proxy
	addrs []netip.Addr
	log   *zap.Logger
	// ctx bounds the endpoint dials; Close cancels it. inFlight holds a
	// token per TCP connection between its accept and its splice.
	ctx      context.Context
	cancel   context.CancelFunc
	inFlight chan struct{}

	mu     sync.Mutex
	open   map[npKey]npSocket
	failed map[npKey]error
	closed bool
	wg     sync.WaitGroup
	// A handover (nodeport_handover.go): lending parks the accept loops
	// (lendCond, under mu); inherited holds the listeners a previous
	// process lent, by name.
	lending   atomic.Bool
	lendCond  *sync.Cond
	parked    int // accept loops waiting while lent
	inherited map[string]*os.File
}

// npKey names one host socket: protocol, address and port.
type npKey struct {
	proto service.Protocol
	addr  netip.AddrPort
}

func (k npKey) String() string { return k.proto.String() + " " + k.addr.String() }

type npSocket interface{ Close() error }

// NewNodePorts returns the NodePort front end serving on addrs (concrete
// host addresses: 127.0.0.1, ::1, a node IP). Sync it with every table;
// Close it to stop.
func (p *Proxy) NewNodePorts(addrs []netip.Addr) *NodePorts {
	ctx, cancel := context.WithCancel(context.Background())
	n := &NodePorts{p: p, addrs: slices.Clone(addrs), log: p.logger.Named("nodeport"),
		ctx: ctx, cancel: cancel, inFlight: make(chan struct{}, nodePortInFlight),
		open: map[npKey]npSocket{}, failed: map[npKey]error{}}
	n.lendCond = sync.NewCond(&n.mu)
	return n
}

// nodePortInFlight bounds the TCP NodePort connections being set up at once
// (accepted, their endpoint not yet dialled): the TUN's --max-inflight
// default. Connections beyond it are reset and counted as in_flight_limited.
const nodePortInFlight = 1024

// Sync opens and closes sockets to match t's NodePorts (step 1).
func (n *NodePorts) Sync(t *service.Table) {
	want := map[npKey]bool{}
	for _, port := range t.Ports() {
		if port.NodePort == 0 {
			continue
		}
		for _, a := range n.addrs {
			if (a.Is4() || a.Is4In6()) == (port.Family == service.IPv4) {
				want[npKey{port.Protocol, netip.AddrPortFrom(a, port.NodePort)}] = true
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	for k, s := range n.open {
		if !want[k] {
			_ = s.Close()
			delete(n.open, k)
			n.log.Info("NodePort closed", zap.Stringer("socket", k))
		}
	}
	for k := range n.failed {
		if !want[k] {
			delete(n.failed, k)
		}
	}
	for k := range want {
		if _, ok := n.open[k]; ok {
			continue
		}
		s, err := n.listen(k)
		if err != nil {
			if _, known := n.failed[k]; !known {
				n.log.Warn("cannot serve a NodePort: the port is taken on the host or the address is gone; the proxy's other ports are served",
					zap.Stringer("socket", k), zap.Error(err))
			}
			n.failed[k] = err
			continue
		}
		delete(n.failed, k)
		n.open[k] = s
		n.log.Info("NodePort open", zap.Stringer("socket", k))
	}
}

// listen opens the socket of k and starts serving it.
func (n *NodePorts) listen(k npKey) (npSocket, error) {
	fam := service.IPv4
	if k.addr.Addr().Is6() && !k.addr.Addr().Is4In6() {
		fam = service.IPv6
	}
	if k.proto == service.TCP {
		ln, ok := n.inheritedListener(k)
		if !ok {
			var err error
			if ln, err = net.Listen("tcp", k.addr.String()); err != nil {
				return nil, err
			}
		}
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.acceptTCP(ln, fam, k.addr.Port()) }()
		return ln, nil
	}
	pc, err := net.ListenPacket("udp", k.addr.String())
	if err != nil {
		return nil, err
	}
	u := &npUDP{n: n, pc: pc.(*net.UDPConn), fam: fam, port: k.addr.Port(), sessions: map[netip.AddrPort]*npSession{}}
	n.wg.Add(1)
	go func() { defer n.wg.Done(); u.serve() }()
	return pc, nil
}

// Failed returns the NodePort sockets that could not be opened, with why,
// sorted.
func (n *NodePorts) Failed() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.failed))
	for k, err := range n.failed {
		out = append(out, fmt.Sprintf("NodePort %s is not served: %v", k, err))
	}
	slices.Sort(out)
	return out
}

// Listening returns how many NodePort sockets are open.
func (n *NodePorts) Listening() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.open)
}

// Close closes every socket, cancels the dials in progress and waits for
// the accept and read loops; the flows already proxied end with the proxy's
// Shutdown. Close it before Shutdown, so that no new flow is accepted
// meanwhile. It may be called more than once.
func (n *NodePorts) Close() {
	n.cancel()
	n.mu.Lock()
	n.closed = true
	n.lendCond.Broadcast()
	for k, s := range n.open {
		_ = s.Close()
		delete(n.open, k)
	}
	for name, f := range n.inherited {
		_ = f.Close()
		delete(n.inherited, name)
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// acceptTCP serves one TCP NodePort listener until it is closed.
func (n *NodePorts) acceptTCP(ln net.Listener, fam service.Family, port uint16) { // NodePort acceptor
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if n.lending.Load() { // lent to the next process: wait (nodeport_handover.go)
				if !n.waitLent() {
					return
				}
				continue
			}
			n.log.Warn("NodePort accept", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case n.inFlight <- struct{}{}:
			go n.handleTCP(c, fam, port)
		default:
			n.p.stats.count(conntrack.TCP, ResultInFlightLimited)
			resetTCP(c)
		}
	}
}

// handleTCP proxies one accepted NodePort connection (steps 2-4); it holds
// an inFlight token until the splice starts.
func (n *NodePorts) handleTCP(c net.Conn, fam service.Family, port uint16) {
	p := n.p
	held := true
	done := func() {
		if held {
			<-n.inFlight
			held = false
		}
	}
	defer done()
	client := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	tuple := conntrack.MakeTuple(conntrack.TCP, unmapped(client), unmapped(local))
	if p.closing.Load() {
		resetTCP(c)
		return
	}
	pk, ok := p.routeHost(service.TCP, fam, port, tuple)
	if !ok {
		resetTCP(c)
		return
	}
	backend, way, err := p.dialTCP(n.ctx, &pk, tuple)
	if err != nil {
		p.ct.DeleteFlow(tuple, nil)
		resetTCP(c)
		return
	}
	defer keepAliveLater(backend, endpointKeepAlive)()
	p.stats.count(conntrack.TCP, ResultProxied)
	p.stats.countWay(conntrack.TCP, way)
	s := &splice{client: c, backend: backend, proxy: p, resetClient: func() { resetTCP(c) }}
	f := newFlow(tuple, true, conntrack.Binding{Endpoint: pk.endpoint, ServicePort: pk.port.Name.String()}, func(bool) { s.abort() })
	s.touch = func() { p.ct.Touch(tuple, conntrack.Original, f) } // not a newer flow's, once reopened
	// A handover may move it (hostmove.go).
	movable(p, s, f)
	f.count(pk)
	f.noteWay(p.cfg.Via, way)
	defer p.untrack(f)
	if !p.track(f) { // its entry went, or Shutdown began
		s.abort()
		p.ct.DeleteFlow(tuple, nil)
		return
	}
	done() // set up: a handover moves it from here on (NodePorts.Lend waits for this)
	s.run()
	p.ct.DeleteFlow(tuple, f) // no FIN passed the table: the entry goes with the flow
}

// routeHost resolves, tracks and picks a new NodePort flow; it refuses (and
// counts) what it cannot route.
func (p *Proxy) routeHost(proto service.Protocol, fam service.Family, port uint16, tuple conntrack.Tuple) (pick, bool) {
	cp := conntrack.TCP
	if proto == service.UDP {
		cp = conntrack.UDP
	}
	t := p.table.Load()
	if t == nil {
		p.stats.count(cp, ResultRejectedNoService)
		return pick{}, false
	}
	tg := p.resolveNodePort(t, proto, fam, tuple.SrcAddr(), port)
	if tg.v != service.Forward {
		p.stats.count(cp, tg.refusal())
		return pick{}, false
	}
	// The kernel accepts a SYN on the 4-tuple of a connection that is over
	// (its socket in TIME_WAIT) while that flow's handler may not yet have
	// deleted its entry: Reopen replaces that entry. It still refuses one
	// whose handler has not bound it yet (a client that reset its
	// connection while the endpoint was dialled, and reconnected from the
	// same port): that new connection is reset. For UDP it is Track, and a
	// live entry refuses the datagram.
	if err := p.ct.Reopen(tuple); err != nil {
		if errors.Is(err, conntrack.ErrTableFull) {
			p.stats.count(cp, ResultTableFull)
		} else {
			p.logger.Debug("NodePort flow already tracked", zap.Stringer("flow", tuple), zap.Error(err))
			p.stats.count(cp, ResultRejectedNoService)
		}
		return pick{}, false
	}
	pk := p.pickFor(tg, tuple)
	if !pk.ok {
		p.ct.DeleteFlow(tuple, nil)
		p.stats.count(cp, ResultRejectedNoEndpoints)
		return pick{}, false
	}
	return pk, true
}

// unmapped returns a with an IPv4-mapped IPv6 address made IPv4, as the
// conntrack table keys IPv4 flows.
func unmapped(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// npUDP serves one UDP NodePort socket: a session per client address.
type npUDP struct {
	n    *NodePorts
	pc   *net.UDPConn
	fam  service.Family
	port uint16

	mu       sync.Mutex
	sessions map[netip.AddrPort]*npSession
}

// npSession is one client's UDP flow through a NodePort.
type npSession struct {
	u       *npUDP
	client  netip.AddrPort
	tuple   conntrack.Tuple
	backend net.Conn
	flow    *flow
	once    sync.Once
	// prefix is the PROXY protocol v2 header sent before every datagram
	// (nil for none); scratch, used by the socket's reader only, holds the
	// two together.
	prefix, scratch []byte
	// lastTouch is when the entry was last refreshed, per direction
	// (Unix nanoseconds).
	lastTouch [2]atomic.Int64
}

// touch refreshes the session's entry after traffic in direction dir, at
// most once a second per direction (step 4).
func (s *npSession) touch(dir conntrack.Direction) {
	if now := time.Now().UnixNano(); now-s.lastTouch[dir].Load() > int64(time.Second) {
		s.lastTouch[dir].Store(now)
		s.u.n.p.ct.Touch(s.tuple, dir, s.flow)
	}
}

// serve reads datagrams until the socket is closed, then ends its flows.
func (u *npUDP) serve() { // NodePort UDP reader
	defer u.endAll()
	buf := make([]byte, maxDatagram)
	for {
		nr, from, err := u.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		from = unmapped(from)
		u.mu.Lock()
		s := u.sessions[from]
		u.mu.Unlock()
		if s != nil {
			s.touch(conntrack.Original)
		} else if s = u.start(from); s == nil {
			continue // refused: dropped
		}
		out := buf[:nr]
		if len(s.prefix) > 0 { // only the reader goroutine writes to the endpoint
			s.scratch = append(append(s.scratch[:0], s.prefix...), out...)
			out = s.scratch
		}
		if _, err := s.backend.Write(out); err == nil {
			u.n.p.stats.bytes[0].Add(uint64(nr))
		}
	}
}

// start sets up the flow of a new client (step 2), or returns nil.
func (u *npUDP) start(client netip.AddrPort) *npSession {
	p := u.n.p
	if p.closing.Load() {
		return nil
	}
	local := unmapped(netip.AddrPortFrom(u.pc.LocalAddr().(*net.UDPAddr).AddrPort().Addr(), u.port))
	tuple := conntrack.MakeTuple(conntrack.UDP, client, local)
	if p.udpSessions.Add(1) > int64(p.cfg.MaxUDPSessions) {
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultTableFull)
		return nil
	}
	pk, ok := p.routeHost(service.UDP, u.fam, u.port, tuple)
	if !ok {
		p.udpSessions.Add(-1)
		return nil
	}
	if !p.udpWay(pk.endpoint, pk.pod) { // only the API server reaches it: no way for UDP (dialvia.go)
		pk.release()
		p.ct.DeleteFlow(tuple, nil)
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultNoWay)
		return nil
	}
	backend, err := p.cfg.Dialer.DialContext(context.Background(), "udp", pk.endpoint.String())
	if err != nil {
		pk.release()
		p.ct.DeleteFlow(tuple, nil)
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultDialFailed)
		return nil
	}
	p.stats.count(conntrack.UDP, ResultProxied)
	p.stats.countWay(conntrack.UDP, WayDirect)
	s := &npSession{u: u, client: client, tuple: tuple, backend: backend}
	if pk.pp != ProxyProtocolNone {
		s.prefix, _ = AppendProxyHeader(nil, pk.pp, service.UDP, client, local)
	}
	s.flow = newFlow(tuple, false, conntrack.Binding{Endpoint: pk.endpoint, ServicePort: pk.port.Name.String()}, s.end)
	s.flow.noteWay(p.cfg.Via, WayDirect)
	s.flow.count(pk)
	// In the map before the entry is bound: a removal from then on ends
	// the session through the reaper, and end takes it out of the map.
	u.mu.Lock()
	u.sessions[client] = s
	u.mu.Unlock()
	if !p.track(s.flow) { // its entry went, or Shutdown began
		p.ct.DeleteFlow(tuple, nil)
		s.end(true)
		return nil
	}
	u.n.wg.Add(1)
	go func() { defer u.n.wg.Done(); s.relayReplies() }()
	return s
}

// relayReplies sends the endpoint's datagrams to the client until the
// session ends.
func (s *npSession) relayReplies() { // NodePort UDP replies
	buf := make([]byte, maxDatagram)
	for {
		nr, err := s.backend.Read(buf)
		if errors.Is(err, syscall.ECONNREFUSED) {
			continue // an ICMP error from the endpoint: the flow lives on, as on the TUN path
		}
		if err != nil {
			s.end(false)
			return
		}
		s.touch(conntrack.Reply)
		if _, err := s.u.pc.WriteToUDPAddrPort(buf[:nr], s.client); err == nil {
			s.u.n.p.stats.bytes[1].Add(uint64(nr))
		}
	}
}

// end ends the session once: its socket closes, its entry goes unless
// reaped says it is gone already.
func (s *npSession) end(reaped bool) {
	s.once.Do(func() {
		_ = s.backend.Close()
		s.u.mu.Lock()
		if s.u.sessions[s.client] == s {
			delete(s.u.sessions, s.client)
		}
		s.u.mu.Unlock()
		p := s.u.n.p
		if !reaped {
			p.ct.DeleteFlow(s.tuple, s.flow)
		}
		p.untrack(s.flow)
		p.udpSessions.Add(-1)
	})
}

// endAll ends every session of the socket.
func (u *npUDP) endAll() {
	u.mu.Lock()
	all := make([]*npSession, 0, len(u.sessions))
	for _, s := range u.sessions {
		all = append(all, s)
	}
	u.mu.Unlock()
	for _, s := range all {
		s.end(false)
	}
}

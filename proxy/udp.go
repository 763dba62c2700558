package proxy

// A UDP flow:
//
//  1. route: look up the service port, pick the endpoint (no service port
//     but a local server: local.go serves the flow); over the session
//     bound, refuse (the conntrack entry goes, so a later datagram retries).
//  2. a host UDP socket connected to the endpoint (no handshake: never
//     blocks).
//  3. track the flow: its handle is bound on the conntrack entry; the
//     entry's removal (30 s unreplied, 120 s stream, endpoint stopped
//     serving, flush) ends it through the reaper (flows.go), and so does
//     the stack's closing.
//  4. client -> endpoint: the stack hands every datagram of the flow to a
//     sender that writes it to the endpoint socket without blocking
//     (UDPRequest.Forward), on the goroutine that delivered it.
//  5. endpoint -> client: the endpoint socket joins the reply poller
//     (udppoll_linux.go), whose one goroutine reads the datagrams into its
//     own batch of buffers when they arrive and writes each to the client
//     from the service address. The handler's goroutine then returns: an
//     idle flow holds no goroutine and no buffer. Without the poller (not
//     Linux, Run not running) the handler's goroutine waits for the replies
//     itself; with an endpoint socket that is not a kernel socket (a test's
//     dialer), a plain relay goroutine per direction does both.
//  6. finish, once, on whichever goroutine ends the flow: out of the
//     poller, both sockets closed, the flow forgotten; unless the reaper
//     ended it, its entry goes too, so a later datagram is admitted afresh.
//
// A handover moves the flow to the next process, its endpoint socket and
// conntrack entry with it (udpmove.go).

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// maxDatagram is the largest UDP payload relayed.
const maxDatagram = 65535

// HandleUDP sets up one UDP flow (implements netstack.FlowHandler). With the
// reply poller running it returns once the flow is set up; the flow lives
// on until finish.
func (p *Proxy) HandleUDP(r *netstack.UDPRequest) {
	tuple := r.Tuple()
	// refuse ends a flow that never started; its entry goes, so that a
	// later datagram is admitted afresh.
	refuse := func() {
		_ = r.Conn.Close()
		p.ct.DeleteFlow(tuple, nil)
	}
	if p.closing.Load() { // Shutdown: admitted just before, refused now
		refuse()
		return
	}
	pk, _ := p.route(service.UDP, tuple) // 1
	port := pk.port
	var local LocalHandler
	if port == nil {
		if local = p.localFor(p.table.Load(), r.Service()); local == nil {
			refuse()
			return
		}
	}
	if p.udpSessions.Add(1) > int64(p.cfg.MaxUDPSessions) {
		pk.release()
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultTableFull)
		refuse()
		return
	}
	if port == nil {
		defer p.udpSessions.Add(-1)
		defer r.Conn.Close()
		p.serveLocalUDP(r, local)
		return
	}
	endpoint := pk.endpoint
	if !p.udpWay(endpoint, pk.pod) { // only the API server reaches it: no way for UDP (dialvia.go)
		pk.release()
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultNoWay)
		refuse()
		return
	}

	backend, err := p.cfg.Dialer.DialContext(r.Context(), "udp", endpoint.String()) // 2
	if err != nil {
		pk.release()
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultDialFailed)
		refuse()
		return
	}
	p.stats.count(conntrack.UDP, ResultProxied)
	p.stats.countWay(conntrack.UDP, WayDirect)

	u := p.newUDPFlow(r, backend, tuple, conntrack.Binding{Endpoint: endpoint, ServicePort: port.Name.String()}, pk.pp)
	u.flow.count(pk)
	u.flow.noteWay(p.cfg.Via, WayDirect)
	// Tracked and attached in one step against a handover's cut
	// (DetachFlows), which would otherwise find a flow not yet attached.
	p.handoverCut.RLock()
	if !p.track(u.flow) { // 3
		p.handoverCut.RUnlock()
		u.finish(true) // the entry went meanwhile: a later datagram starts afresh
		return
	}
	u.watch()
	if ce := p.logger.Check(zap.DebugLevel, "UDP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("service", r.Service()),
			zap.Stringer("servicePort", port.Name), zap.Stringer("endpoint", endpoint))
	}
	prefix := p.udpPrefix(pk.pp, tuple, port.Name.String())
	s := newUDPSender(backend, &p.stats.bytes[0])
	if s == nil {
		p.handoverCut.RUnlock()
		done := make(chan struct{}, 2)
		go p.pumpClientToEndpoint(r.Conn, backend, prefix, done)
		go p.pumpEndpointToClient(backend, r.Conn, done)
		<-done
		u.finish(false)
		<-done
		return
	}
	s.prefix = prefix
	u.sender, u.rc = s, s.rc
	polled := u.attach(false) // 4, 5
	p.handoverCut.RUnlock()
	if polled {
		return
	}
	for u.relayOnce() {
	}
	u.finish(false)
}

// udpPrefix returns the PROXY protocol header that goes before every
// datagram of a flow (pp; nil for none).
func (p *Proxy) udpPrefix(pp ProxyProtocol, tuple conntrack.Tuple, servicePort string) []byte {
	if pp == ProxyProtocolNone {
		return nil
	}
	prefix, err := AppendProxyHeader(nil, pp, service.UDP, tuple.Src(), tuple.Dst())
	if err != nil {
		p.logger.Warn("no PROXY protocol header for a UDP flow", zap.String("servicePort", servicePort), zap.Error(err))
	}
	return prefix
}

// udpFlow is a proxied UDP flow's state after set-up.
type udpFlow struct {
	p       *Proxy
	r       *netstack.UDPRequest
	backend net.Conn
	rc      syscall.RawConn // of backend, when it is a kernel socket
	sender  *udpSender      // when it is
	flow    *flow
	pp      ProxyProtocol // the PROXY protocol its datagrams carry, for a handover

	mu          sync.Mutex
	closed      bool
	stopForward func()
	stopWatch   func() bool
	unpoll      func()
	// detached is set while the flow is handed to the next process
	// (udpmove.go): nothing forwards or relays for it. lent says its
	// socket's descriptor is on its way there: finish leaves the socket
	// open, for reattach or forget to close.
	detached, lent bool

	// relayMu is held while the poller relays the flow's replies; paused
	// (under it) makes the poller leave them in the socket.
	relayMu sync.Mutex
	paused  bool
}

// newUDPFlow returns the flow of r to backend, not yet tracked.
func (p *Proxy) newUDPFlow(r *netstack.UDPRequest, backend net.Conn, tuple conntrack.Tuple, b conntrack.Binding, pp ProxyProtocol) *udpFlow {
	u := &udpFlow{p: p, r: r, backend: backend, pp: pp}
	u.flow = newFlow(tuple, false, b, u.finish)
	u.flow.mover = u
	return u
}

// watch ends the flow when the stack closes.
func (u *udpFlow) watch() {
	u.mu.Lock()
	if !u.closed {
		u.stopWatch = context.AfterFunc(u.r.Context(), func() { u.finish(false) })
	}
	u.mu.Unlock()
}

// attach starts the datagrams both ways (steps 4 and 5): the client's go
// to the sender, the endpoint's wait in the reply poller. It reports false
// when no poller takes the replies: the caller relays them itself. A flow
// that ended meanwhile has nothing to relay (true). With wait, a flow
// attached before Run has started its poller waits for it (a handover's
// flows); without, it relays on its own.
func (u *udpFlow) attach(wait bool) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return true
	}
	u.stopForward = u.r.Forward(u.sender.send)
	rp, waiting := u.p.pollerOrWait(u, wait)
	if waiting {
		return true // Run adds it to its poller as it starts
	}
	if rp == nil {
		return false
	}
	remove, err := rp.add(u, u.rc)
	if err != nil {
		return false
	}
	u.unpoll = remove
	return true
}

// pollBatch bounds the datagrams one flow relays per readiness event, so
// that a busy flow cannot starve the others on the poller's goroutine (the
// level-triggered epoll reports its socket again).
const pollBatch = 64

// relayOnce waits until the endpoint socket is readable and relays one
// datagram to the client (the goroutine mode; the poller reads in batches,
// udpbatch_linux.go). It reports false once the socket or the client's side
// was closed. An ICMP error from the endpoint (ECONNREFUSED on the connected
// socket) does not end the flow, nor does a reply dropped because the
// client's side is full (netstack.ErrReplyDropped): writes to the client
// never wait.
func (u *udpFlow) relayOnce() bool {
	ok := true
	err := u.rc.Read(func(fd uintptr) bool {
		bp := udpPool.Get().(*[]byte) // only while the socket is readable: a waiting flow holds no buffer
		defer udpPool.Put(bp)
		for {
			n, err := syscall.Read(int(fd), *bp)
			switch {
			case err == syscall.EINTR, err == syscall.ECONNREFUSED:
				continue
			case err == syscall.EAGAIN:
				return false // wait for more
			case err != nil:
				ok = false
				return true
			}
			ok = u.reply((*bp)[:n])
			return true
		}
	})
	return ok && err == nil
}

// reply writes one datagram of the endpoint to the client and counts it;
// it reports false once the client's side is closed (a reply dropped is
// not: writes to the client never wait).
func (u *udpFlow) reply(b []byte) bool {
	switch err := u.r.Reply(b); {
	case err == nil:
		u.p.stats.bytes[1].Add(uint64(len(b)))
	case !errors.Is(err, netstack.ErrReplyDropped):
		return false
	}
	return true
}

// finish ends the flow, once (step 6); byReaper says its entry is gone
// already.
func (u *udpFlow) finish(byReaper bool) { // byReaper: the entry is gone already
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return
	}
	u.closed = true
	stopForward, stopWatch, unpoll, lent := u.stopForward, u.stopWatch, u.unpoll, u.lent
	u.mu.Unlock()
	if stopForward != nil {
		stopForward()
	}
	if stopWatch != nil {
		stopWatch()
	}
	if unpoll != nil {
		unpoll()
	}
	_ = u.r.Close()
	if !lent { // else its descriptor number is on its way to the next process: it must not be reused
		_ = u.backend.Close()
	}
	if !byReaper {
		u.p.ct.DeleteFlow(u.flow.tuple, u.flow)
	}
	u.p.untrack(u.flow)
	u.p.udpSessions.Add(-1)
}

func (p *Proxy) pumpClientToEndpoint(client, backend net.Conn, prefix []byte, done chan<- struct{}) { // pump: client -> endpoint
	p.pump(backend, client, 0, prefix)
	done <- struct{}{}
}

func (p *Proxy) pumpEndpointToClient(backend, client net.Conn, done chan<- struct{}) { // pump: endpoint -> client
	p.pump(client, backend, 1, nil)
	done <- struct{}{}
}

// pump relays datagrams from src to dst until either fails, each after
// prefix (a PROXY protocol header; nil for none). An ICMP error from the
// endpoint (ECONNREFUSED on the connected socket) does not end it.
func (p *Proxy) pump(dst, src net.Conn, dir int, prefix []byte) {
	bp := udpPool.Get().(*[]byte)
	defer udpPool.Put(bp)
	buf := *bp
	off := copy(buf, prefix)
	for {
		n, err := src.Read(buf[off:])
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			return
		}
		if _, err := dst.Write(buf[:off+n]); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
			return
		}
		p.stats.bytes[dir].Add(uint64(n))
	}
}

// udpSender sends datagrams on a connected kernel socket without ever
// blocking (a full socket buffer drops the datagram, as a full queue
// would), for the gate's goroutine. One per flow, built once, so that a
// datagram costs no allocation.
type udpSender struct {
	rc   syscall.RawConn
	sent *atomic.Uint64
	mu   sync.Mutex // the gates of a multi-queue TUN may send at once
	buf  []byte
	n    int
	err  error
	fn   func(fd uintptr) bool // s.write, bound once
	// prefix, when set, goes in front of every datagram: the flow's PROXY
	// protocol v2 header (a header of its own would be a datagram of its
	// own); scratch holds prefix and payload together.
	prefix, scratch []byte
	// paused drops what send is given: the flow is handed to the next
	// process, which writes to the socket from then on.
	paused bool
}

// newUDPSender returns a sender on c, or nil when c is not a kernel socket.
func newUDPSender(c net.Conn, sent *atomic.Uint64) *udpSender {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &udpSender{rc: rc, sent: sent}
	s.fn = s.write
	return s
}

func (s *udpSender) write(fd uintptr) bool {
	s.n, s.err = writeNoWait(fd, s.buf)
	return true // never wait for the socket
}

// send writes b as one datagram; b is not kept.
func (s *udpSender) send(b []byte) {
	s.mu.Lock()
	if s.paused {
		s.mu.Unlock()
		return
	}
	s.buf = b
	if len(s.prefix) > 0 {
		s.scratch = append(append(s.scratch[:0], s.prefix...), b...)
		s.buf = s.scratch
	}
	err := s.rc.Write(s.fn)
	if err == nil {
		err = s.err
	}
	n := s.n - len(s.prefix)
	s.buf = nil
	s.mu.Unlock()
	if err == nil {
		s.sent.Add(uint64(n))
	}
}

// pause makes send drop datagrams (or write them again), once a send
// under way has returned.
func (s *udpSender) pause(paused bool) {
	s.mu.Lock()
	s.paused = paused
	s.mu.Unlock()
}

var udpPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

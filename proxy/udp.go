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
//     serving, flush) closes both sockets through the reaper (flows.go).
//  4. client -> endpoint: the stack hands every datagram of the flow to a
//     sender that writes it to the endpoint socket without blocking
//     (UDPRequest.Forward), on the goroutine that delivered it: no relay
//     goroutine, no buffer held while the flow is idle.
//  5. endpoint -> client, on the handler's goroutine: wait until the
//     endpoint socket is readable, then read into a pooled buffer and write
//     the datagram to the client from the service address; an idle flow
//     holds no buffer. When the endpoint socket is not a kernel socket
//     (a test's dialer), a plain relay goroutine per direction does both.

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

// HandleUDP relays one UDP flow (implements netstack.FlowHandler).
func (p *Proxy) HandleUDP(r *netstack.UDPRequest) {
	defer r.Conn.Close()
	tuple := r.Tuple()
	exact := conntrack.Filter{Protocol: conntrack.UDP, Src: tuple.SrcAddr(), SrcPort: tuple.SrcPort(), Dst: tuple.DstAddr(), DstPort: tuple.DstPort()}
	port, i, _, _ := p.route(service.UDP, tuple) // 1
	var local LocalHandler
	if port == nil {
		if local = p.localFor(p.table.Load(), r.Service()); local == nil {
			p.ct.Delete(exact)
			return
		}
	}
	if p.udpSessions.Add(1) > int64(p.cfg.MaxUDPSessions) {
		p.udpSessions.Add(-1)
		p.stats.count(conntrack.UDP, ResultTableFull)
		p.ct.Delete(exact)
		return
	}
	defer p.udpSessions.Add(-1)
	if port == nil {
		p.serveLocalUDP(r, local, exact)
		return
	}
	endpoint := port.Endpoints[i].Addr

	backend, err := p.cfg.Dialer.DialContext(r.Context(), "udp", endpoint.String()) // 2
	if err != nil {
		p.stats.count(conntrack.UDP, ResultDialFailed)
		p.ct.Delete(exact)
		return
	}
	defer backend.Close()
	p.stats.count(conntrack.UDP, ResultProxied)

	var (
		mu          sync.Mutex
		closed      bool
		stopForward func()
	)
	closeBoth := func() {
		mu.Lock()
		if closed {
			mu.Unlock()
			return
		}
		closed = true
		stop := stopForward
		mu.Unlock()
		if stop != nil {
			stop()
		}
		_ = r.Conn.Close()
		_ = backend.Close()
	}
	var ended atomic.Bool // by the reaper
	f := newFlow(tuple, false, conntrack.Binding{Endpoint: endpoint, ServicePort: port.Name.String()}, func() { ended.Store(true); closeBoth() })
	defer p.untrack(f)
	if !p.track(f) { // 3
		return // the entry went meanwhile: a later datagram starts afresh
	}
	// The stack closing ends the flow too: nothing else would wake the
	// reply relay, which waits on the endpoint socket.
	stopWatch := context.AfterFunc(r.Context(), closeBoth)
	defer stopWatch()
	if ce := p.logger.Check(zap.DebugLevel, "UDP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("service", r.Service()),
			zap.Stringer("servicePort", port.Name), zap.Stringer("endpoint", endpoint))
	}
	if s := newUDPSender(backend, &p.stats.bytes[0]); s != nil {
		mu.Lock()
		if !closed {
			stopForward = r.Forward(s.send) // 4
		}
		mu.Unlock()
		p.relayReplies(s.rc, r.Conn) // 5
	} else {
		done := make(chan struct{}, 2)
		go p.pumpClientToEndpoint(r.Conn, backend, done)
		go p.pumpEndpointToClient(backend, r.Conn, done)
		<-done
		closeBoth()
		<-done
	}
	closeBoth()
	if !ended.Load() {
		// The relay ended on its own (the stack closed, a socket failed):
		// forget the flow so that a later datagram is admitted afresh.
		p.ct.Delete(exact)
	}
}

// relayReplies writes the endpoint's datagrams to the client until the
// endpoint socket fails or is closed (step 5). A buffer is taken from the
// pool only once a datagram is there to read. An ICMP error from the
// endpoint (ECONNREFUSED on the connected socket) does not end the flow.
func (p *Proxy) relayReplies(rc syscall.RawConn, client net.Conn) {
	var (
		bp   *[]byte
		n    int
		rerr error
	)
	read := func(fd uintptr) bool {
		if bp == nil {
			bp = udpPool.Get().(*[]byte)
		}
		n, rerr = syscall.Read(int(fd), *bp)
		if rerr == syscall.EAGAIN || rerr == syscall.EINTR {
			udpPool.Put(bp)
			bp = nil
			return false // wait until readable
		}
		return true
	}
	for {
		if err := rc.Read(read); err != nil {
			break // closed
		}
		if rerr != nil {
			udpPool.Put(bp)
			bp = nil
			if errors.Is(rerr, syscall.ECONNREFUSED) {
				continue
			}
			return
		}
		_, werr := client.Write((*bp)[:n])
		udpPool.Put(bp)
		bp = nil
		if werr != nil {
			return
		}
		p.stats.bytes[1].Add(uint64(n))
	}
	if bp != nil {
		udpPool.Put(bp)
	}
}

func (p *Proxy) pumpClientToEndpoint(client, backend net.Conn, done chan<- struct{}) { // pump: client -> endpoint
	p.pump(backend, client, 0)
	done <- struct{}{}
}

func (p *Proxy) pumpEndpointToClient(backend, client net.Conn, done chan<- struct{}) { // pump: endpoint -> client
	p.pump(client, backend, 1)
	done <- struct{}{}
}

// pump relays datagrams from src to dst until either fails. An ICMP error
// from the endpoint (ECONNREFUSED on the connected socket) does not end it.
func (p *Proxy) pump(dst, src net.Conn, dir int) {
	bp := udpPool.Get().(*[]byte)
	defer udpPool.Put(bp)
	buf := *bp
	for {
		n, err := src.Read(buf)
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				continue
			}
			return
		}
		if _, err := dst.Write(buf[:n]); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
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
	s.n, s.err = syscall.Write(int(fd), s.buf)
	return true // never wait for the socket
}

// send writes b as one datagram; b is not kept.
func (s *udpSender) send(b []byte) {
	s.mu.Lock()
	s.buf = b
	err := s.rc.Write(s.fn)
	if err == nil {
		err = s.err
	}
	n := s.n
	s.buf = nil
	s.mu.Unlock()
	if err == nil {
		s.sent.Add(uint64(n))
	}
}

var udpPool = sync.Pool{New: func() any { b := make([]byte, maxDatagram); return &b }}

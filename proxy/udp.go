package proxy

// A UDP flow:
//
//  1. route: look up the service port, pick the endpoint (no service port
//     but a local server: local.go serves the flow); over the session
//     bound, refuse (the conntrack entry goes, so a later datagram retries).
//  2. a host UDP socket connected to the endpoint (no handshake: never
//     blocks).
//  3. bind the conntrack entry, register the flow; its removal from the
//     table (30 s unreplied, 120 s stream, endpoint removed, flush) closes
//     both sockets.
//  4. relay: one pump per direction; replies leave from the service
//     address, because the stack's socket is connected from it.

import (
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

	p.ct.Bind(tuple, endpoint, port.Name.String()) // 3
	if ce := p.logger.Check(zap.DebugLevel, "UDP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("service", r.Service()),
			zap.Stringer("servicePort", port.Name), zap.Stringer("endpoint", endpoint))
	}
	// The client's later datagrams skip gVisor and the client pump: the
	// gate writes them to the endpoint socket itself.
	stopBypass := func() {}
	if s := newUDPSender(backend, &p.stats.bytes[0]); s != nil {
		stopBypass = r.Bypass(s.send)
	}
	var once sync.Once
	var removed atomic.Bool
	closeBoth := func() {
		once.Do(func() {
			stopBypass()
			_ = r.Conn.Close()
			_ = backend.Close()
		})
	}
	f := &flow{close: func() { removed.Store(true); closeBoth() }}
	p.register(tuple, f)

	done := make(chan struct{}, 2) // 4
	go p.pumpClientToEndpoint(r.Conn, backend, done)
	go p.pumpEndpointToClient(backend, r.Conn, done)
	<-done
	closeBoth()
	<-done
	p.unregister(tuple, f)
	if !removed.Load() {
		// The relay ended on its own (the stack closed, a socket failed):
		// forget the flow so that a later datagram is admitted afresh.
		p.ct.Delete(exact)
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

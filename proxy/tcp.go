package proxy

// A TCP flow, from the forwarder request to the end of the splice:
//
//  1. route: look up the service port, pick the endpoint.
//  2. dial the endpoint from the host, bounded by DialTimeout; a refused or
//     timed-out dial refuses the client with a RST, as the pod would.
//  3. accept: complete the client's handshake only now; the endpoint
//     connection's keep-alive is turned on only if the flow lasts
//     endpointKeepAlive (keepAliveLater).
//  4. track the flow: its handle is bound on the conntrack entry, so that
//     the entry's removal ends it (flows.go) with a RST to both peers; an
//     entry already gone ends it at once.
//  5. splice: one copier per direction; EOF half-closes the other side;
//     a reset on one side resets the other; both done -> both closed.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// HandleTCP proxies one TCP flow (implements netstack.FlowHandler).
func (p *Proxy) HandleTCP(r *netstack.TCPRequest) {
	tuple := r.Tuple()
	if p.closing.Load() { // Shutdown: admitted just before, refused now
		r.Refuse()
		return
	}
	pk, v := p.route(service.TCP, tuple) // 1
	port := pk.port
	if port == nil {
		if h := p.localFor(p.table.Load(), r.Service()); h != nil {
			p.serveLocalTCP(r, h)
			return
		}
		if v.Drop() {
			r.Ignore()
		} else {
			r.Refuse()
		}
		return
	}
	endpoint := pk.endpoint

	backend, way, err := p.dialTCP(r.Context(), &pk, tuple) // 2
	if err != nil {
		r.Refuse()
		return
	}

	client, err := r.Accept() // 3
	if err != nil {
		pk.release()
		_ = backend.Close()
		return
	}
	defer keepAliveLater(backend, endpointKeepAlive)()
	p.stats.count(conntrack.TCP, ResultProxied)
	p.stats.countWay(conntrack.TCP, way)

	s := &splice{client: client, backend: backend, proxy: p, resetClient: func() { _ = client.Abort() }}
	f := newFlow(tuple, true, conntrack.Binding{Endpoint: endpoint, ServicePort: port.Name.String()}, func(bool) { s.abort() }) // 4
	f.count(pk)
	f.noteWay(p.cfg.Via, way)
	defer p.untrack(f)
	if !p.track(f) {
		s.abort()
		return
	}
	if ce := p.logger.Check(zap.DebugLevel, "TCP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("service", r.Service()),
			zap.Stringer("servicePort", port.Name), zap.Stringer("endpoint", endpoint), zap.Stringer("way", way))
	}
	s.run() // 5
}

// dialTCP dials the pick's endpoint, the way Config.Via says
// (dialvia.go), within DialTimeout of parent, and sends the PROXY protocol
// header its Service asks for. On a failure the pick is released and the
// failure counted and logged; the caller refuses the client.
func (p *Proxy) dialTCP(parent context.Context, pk *pick, tuple conntrack.Tuple) (net.Conn, Way, error) {
	ctx, cancel := context.WithTimeout(parent, p.cfg.DialTimeout)
	backend, way, err := p.dialEndpoint(ctx, pk)
	cancel()
	if err == nil {
		err = p.sendProxyHeader(backend, *pk, tuple)
	}
	if err != nil {
		if ce := p.logger.Check(zap.DebugLevel, "endpoint dial failed"); ce != nil {
			ce.Write(zap.Stringer("servicePort", pk.port.Name), zap.Stringer("endpoint", pk.endpoint),
				zap.Stringer("way", way), zap.Error(err))
		}
		pk.release()
		if errors.Is(err, ErrNoPod) {
			p.stats.count(conntrack.TCP, ResultNoWay)
		} else {
			p.stats.count(conntrack.TCP, ResultDialFailed)
		}
		return nil, way, err
	}
	return backend, way, nil
}

// sendProxyHeader writes the PROXY protocol header the pick's Service asks
// for, if any, first on the endpoint connection: the client's address and
// the destination it used (proxyproto.go). A failure closes backend.
func (p *Proxy) sendProxyHeader(backend net.Conn, pk pick, tuple conntrack.Tuple) error {
	if pk.pp == ProxyProtocolNone {
		return nil
	}
	_ = backend.SetWriteDeadline(time.Now().Add(p.cfg.DialTimeout))
	err := writeProxyHeader(backend, pk.pp, service.TCP, tuple.Src(), tuple.Dst())
	_ = backend.SetWriteDeadline(time.Time{})
	if err != nil {
		resetTCP(backend)
	}
	return err
}

// halfCloser is a connection that can close its write side alone.
type halfCloser interface {
	CloseWrite() error
}

// bufPool holds the copy buffers of splices: 32 KiB, the buffer a direction
// reads with while it waits, so an idle flow holds no more. bulkPool holds
// the 1 MiB buffers a direction moves to after a read that filled the small
// one, and leaves after a read that did not fill the big one (the source had
// no more for now, so the next read may wait): a direction that keeps its
// source ahead of it then hands gVisor writes it cuts into full 64 KiB
// segments (and GSO super-packets), and takes what the host socket holds in
// one read (BENCHMARKS.md, tuning log: TCP down 8.78 -> 11.14 Gbit/s in one
// round, 4.18 -> 6.55-9.38 across full runs). At most maxBulkBuffers are out
// at once, so that many flows whose clients stopped reading cannot pin more
// than maxBulkBuffers MiB; past that, flows copy with the small buffer.
var (
	bufPool   = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}
	bulkPool  = sync.Pool{New: func() any { b := make([]byte, bulkBuf); return &b }}
	bulkInUse atomic.Int64
)

const (
	smallBuf       = 32 << 10
	bulkBuf        = 1 << 20
	maxBulkBuffers = 128
)

// takeBulk returns a bulk buffer, or nil when maxBulkBuffers are out.
func takeBulk() *[]byte {
	if bulkInUse.Add(1) > maxBulkBuffers {
		bulkInUse.Add(-1)
		return nil
	}
	return bulkPool.Get().(*[]byte)
}

// putBuf returns a copy buffer of either size to its pool.
func putBuf(bp *[]byte) {
	if len(*bp) != bulkBuf {
		bufPool.Put(bp)
		return
	}
	bulkPool.Put(bp)
	bulkInUse.Add(-1)
}

type splice struct {
	client  net.Conn
	backend net.Conn
	proxy   *Proxy
	once    sync.Once
	// resetClient closes the client's side with a RST.
	resetClient func()
	// touch, when set, is called after reads at most every touchEvery: a
	// flow conntrack sees no packets of (nodeport.go) keeps its entry
	// alive with it.
	touch     func()
	lastTouch atomic.Int64
	// A handover parks a host flow's copiers (hostmove.go). parking says
	// so: a copier whose socket's deadline passed then reports on
	// parked[dir] the bytes it read and has not written, and waits on
	// resume[dir] (true: copy on; false: stop, leaving the sockets to the
	// next process). exited[dir] is closed as a copier returns, eof[dir]
	// set when it returned at its source's EOF (its destination
	// half-closed). pending[dir] is what an adopted flow's copier writes
	// first. All nil or zero for a flow that cannot move.
	parking atomic.Bool
	parked  [2]chan []byte
	resume  [2]chan bool
	exited  [2]chan struct{}
	eof     [2]atomic.Bool
	pending [2][]byte
}

// errHandedOff ends a parked copier that the next process goes on for.
var errHandedOff = errors.New("proxy: the flow was handed to the next process")

// touchEvery is how often an active host-socket flow refreshes its
// conntrack entry.
const touchEvery = 10 * time.Second

// keepAliveLater turns on the keep-alive probes of an endpoint connection
// the proxy dialled itself (dialHost leaves them to the flow) after the flow
// has lasted after, and returns the function that stops the timer; the flow
// calls it as it ends. A Config.Dialer sets its own keep-alive: then there
// is no timer.
//
// Four setsockopt calls are a TCP flow's dearest setup after the connect
// itself (about 3% of the CPU of the harness's conn/s cell, BENCHMARKS.md),
// and a flow that ends within endpointKeepAlive could never send a probe:
// nothing idles that long in it. A flow that lives on gets them then, and
// its first probe still comes after endpointKeepAlive of idleness: setting
// TCP_KEEPIDLE on a socket with SO_KEEPALIVE on re-arms the kernel's timer
// for the idle time left since the last segment received
// (tcp_sock_set_keepidle_locked, net/ipv4/tcp.c), which is why keepAlive
// sets SO_KEEPALIVE first.
func keepAliveLater(c net.Conn, after time.Duration) (stop func() bool) {
	k, ok := c.(interface{ keepAlive() error })
	if !ok {
		return func() bool { return false }
	}
	return time.AfterFunc(after, func() { _ = k.keepAlive() }).Stop
}

// resetTCP closes a host TCP connection (a *net.TCPConn or a hostConn)
// with a RST.
func resetTCP(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = l.SetLinger(0)
	}
	_ = c.Close()
}

// run copies both ways until both directions are done: client -> endpoint
// on a copier goroutine of its own, endpoint -> client on the caller's (the
// flow's handler), which would otherwise only wait: two goroutines per flow,
// not three.
func (s *splice) run() {
	done := make(chan struct{})
	if s.eof[0].Load() { // an adopted flow whose client had half-closed
		s.exit(0)
		close(done)
	} else {
		go s.copyClientToEndpoint(done)
	}
	if s.eof[1].Load() {
		s.exit(1)
	} else {
		s.copyEndpointToClient()
	}
	<-done
	_ = s.client.Close()
	_ = s.backend.Close()
}

func (s *splice) copyClientToEndpoint(done chan<- struct{}) { // copier: client -> endpoint
	_ = s.copy(s.backend, s.client, 0)
	s.exit(0)
	close(done)
}

func (s *splice) copyEndpointToClient() { // copier: endpoint -> client, on the handler's goroutine
	_ = s.copy(s.client, s.backend, 1)
	s.exit(1)
}

// exit notes that dir's copier returned (a flow that can move).
func (s *splice) exit(dir int) {
	if s.exited[dir] != nil {
		close(s.exited[dir])
	}
}

// parkAt parks dir's copier for a handover with pending, the bytes it
// read and did not write, when parking is on and err is its socket's
// deadline; it reports whether it parked, and then whether to copy on
// (false: the next process has the flow).
func (s *splice) parkAt(dir int, pending []byte, err error) (parked, goOn bool) {
	var ne net.Error
	if s.parked[dir] == nil || !s.parking.Load() || !errors.As(err, &ne) || !ne.Timeout() {
		return false, false
	}
	s.parked[dir] <- bytes.Clone(pending)
	return true, <-s.resume[dir]
}

// copy moves bytes from src to dst. At src's EOF it half-closes dst; on a
// reset or any other error it aborts both sides, so a reset reaches the other
// peer as a reset.
func (s *splice) copy(dst, src net.Conn, dir int) error {
	bp := bufPool.Get().(*[]byte)
	defer func() { putBuf(bp) }()
	buf := *bp
	pending := s.pending[dir] // an adopted flow's, written first
	s.pending[dir] = nil
	for {
		// Bytes read and not yet written: an adopted flow's, or those of a
		// write a handover cut short and then gave back.
		for len(pending) > 0 {
			w, werr := dst.Write(pending)
			s.proxy.stats.bytes[dir].Add(uint64(w))
			if werr != nil {
				parked, goOn := s.parkAt(dir, pending[w:], werr)
				if !parked {
					s.abort()
					return werr
				}
				if !goOn {
					return errHandedOff
				}
				pending = pending[w:]
				continue
			}
			pending = nil
		}
		n, rerr := src.Read(buf)
		if s.touch != nil {
			if now := time.Now().UnixNano(); now-s.lastTouch.Load() > int64(touchEvery) {
				s.lastTouch.Store(now)
				s.touch()
			}
		}
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			s.proxy.stats.bytes[dir].Add(uint64(w))
			if werr != nil {
				parked, goOn := s.parkAt(dir, buf[w:n], werr)
				if !parked {
					s.abort()
					return werr
				}
				if !goOn {
					return errHandedOff
				}
				pending = bytes.Clone(buf[w:n])
				continue
			}
		}
		if rerr == nil {
			// Size the next read (see bulkPool).
			switch {
			case len(buf) == smallBuf && n == len(buf):
				if big := takeBulk(); big != nil {
					putBuf(bp)
					bp, buf = big, *big
				}
			case len(buf) == bulkBuf && n < len(buf):
				putBuf(bp)
				bp = bufPool.Get().(*[]byte)
				buf = *bp
			}
			continue
		}
		if errors.Is(rerr, io.EOF) {
			if hc, ok := dst.(halfCloser); ok {
				_ = hc.CloseWrite()
			} else {
				_ = dst.Close()
			}
			s.eof[dir].Store(true)
			return nil
		}
		if parked, goOn := s.parkAt(dir, nil, rerr); parked {
			if !goOn {
				return errHandedOff
			}
			continue
		}
		s.abort()
		return rerr
	}
}

// abort closes both sides with a RST.
func (s *splice) abort() {
	s.once.Do(func() {
		s.resetClient()
		resetTCP(s.backend)
	})
}

package kube

// Reaching pods through the API server (proxy.PodDialer; `--dial-via
// apiserver|auto`), the way `kubectl port-forward` does, but one tunnel per
// pod carrying every flow to it:
//
//  1. DialPod finds the pod's tunnel, or opens one: a POST to
//     pods/NAME/portforward upgraded with client-go's dialers (SPDY over a
//     WebSocket, falling back to plain SPDY for an API server that does not
//     take the WebSocket). Concurrent dials to one pod wait for the same
//     opening; a failed opening is not kept, so the next dial tries again.
//  2. Each flow is one pair of streams on the tunnel, as the kubelet's
//     port-forward protocol has it (portforward.k8s.io): an error stream
//     and a data stream with the same requestID and the pod's port.
//  3. The flow's connection (podConn) reads and writes the data stream; at
//     the data stream's end it looks at the error stream: a message there
//     (the kubelet could not reach the port), or a tunnel that broke, is a
//     read error, so the proxy resets the client rather than ending its
//     flow cleanly.
//  4. A tunnel with no streams left is closed after Idle; a tunnel that
//     breaks (the API server, the kubelet, the network) leaves the table at
//     once, and its flows fail as in step 3; the next dial opens a new one.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/userproxy/userproxy/service"
)

// PortForwardConfig configures a PortForwarder.
type PortForwardConfig struct {
	// REST is the API server's client configuration (RESTConfig).
	REST *rest.Config
	// Idle is how long a tunnel with no flows stays open; 0 means 30 s.
	Idle time.Duration
	// OpenTimeout bounds the opening of a tunnel; 0 means 15 s.
	OpenTimeout time.Duration
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// PortForwarder carries TCP connections to pods through the API server's
// pods/portforward; it implements proxy.PodDialer. Its methods are safe for
// concurrent use.
type PortForwarder struct {
	cfg    PortForwardConfig
	pods   rest.Interface
	logger *zap.Logger
	// open opens a tunnel to a pod (a field, so that tests can count).
	open func(pod service.PodRef) (httpstream.Connection, error)

	mu      sync.Mutex
	tunnels map[service.PodRef]*tunnel
	closed  bool
	wg      sync.WaitGroup // the openers and the tunnels' watchers

	stats struct {
		opens, openFailures, broken, idleClosed atomic.Uint64
		streams, streamFailures, streamErrors   atomic.Uint64
		streamsOpen                             atomic.Int64
	}
}

// PortForwardStats count the tunnels and streams.
type PortForwardStats struct {
	// Tunnels is the tunnels open now; Opens counts the tunnels opened,
	// OpenFailures the openings that failed, Broken the tunnels that broke
	// under their flows and IdleClosed those closed for lack of flows.
	Tunnels                                 int
	Opens, OpenFailures, Broken, IdleClosed uint64
	// StreamsOpen is the flows carried now; Streams counts the flows
	// carried, StreamFailures those whose streams could not be opened and
	// StreamErrors those the kubelet ended with an error (or whose tunnel
	// broke).
	StreamsOpen                           int
	Streams, StreamFailures, StreamErrors uint64
}

// NewPortForwarder returns a PortForwarder for the API server of cfg.REST.
// It does not contact the server.
func NewPortForwarder(cfg PortForwardConfig) (*PortForwarder, error) {
	if cfg.REST == nil {
		return nil, errors.New("kube: PortForwardConfig.REST is nil")
	}
	if cfg.Idle <= 0 {
		cfg.Idle = 30 * time.Second
	}
	if cfg.OpenTimeout <= 0 {
		cfg.OpenTimeout = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cs, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("kube: port-forward client: %w", err)
	}
	f := &PortForwarder{cfg: cfg, pods: cs.CoreV1().RESTClient(), logger: cfg.Logger, tunnels: map[service.PodRef]*tunnel{}}
	f.open = f.upgrade
	return f, nil
}

// upgrade opens a tunnel to pod (step 1): SPDY over a WebSocket, else SPDY.
func (f *PortForwarder) upgrade(pod service.PodRef) (httpstream.Connection, error) {
	u := f.pods.Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, f.cfg.REST)
	if err != nil {
		return nil, err
	}
	rt, up, err := spdy.RoundTripperFor(f.cfg.REST)
	if err != nil {
		return nil, err
	}
	// k8s.io/streaming's checks: the WebSocket dialer fails with its
	// UpgradeFailureError, which apimachinery's IsUpgradeFailure does not
	// recognize.
	d := portforward.NewFallbackDialerForStreaming(ws, spdy.NewDialerForStreaming(up, &http.Client{Transport: rt}, http.MethodPost, u),
		func(err error) bool { return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err) })
	conn, _, err := d.Dial(portforward.PortForwardProtocolV1Name)
	return conn, err
}

// tunnel is one pod's port-forward connection.
type tunnel struct {
	pod   service.PodRef
	ready chan struct{} // closed once the opening ended
	conn  httpstream.Connection
	err   error // of the opening, set before ready closes

	nextID  atomic.Uint64 // requestID of the next stream pair
	streams int           // under PortForwarder.mu
	idle    *time.Timer   // under PortForwarder.mu: runs while streams == 0
	gone    bool          // under PortForwarder.mu: out of the table
}

// ErrClosed is the dial error once the PortForwarder is closed.
var ErrClosed = errors.New("kube: port forwarder closed")

// DialPod opens a connection to port of pod through its tunnel (steps 1
// and 2); it implements proxy.PodDialer.
func (f *PortForwarder) DialPod(ctx context.Context, pod service.PodRef, port uint16) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		t, err := f.tunnelFor(ctx, pod)
		if err != nil {
			return nil, err
		}
		sctx, cancel := ctx, context.CancelFunc(func() {})
		if attempt == 0 {
			// A tunnel whose far end died is noticed only at the next ping
			// (through a WebSocket, up to 10 s: the API server's tunnel
			// waits for the client to write); a live one answers in
			// milliseconds. So the first try is short, and then the tunnel
			// is given up and a new one opened.
			sctx, cancel = context.WithTimeout(ctx, streamAttempt)
		}
		c, err := f.openStreams(sctx, t, port)
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil || attempt > 0 {
			return nil, err
		}
		f.drop(t, &f.stats.broken)
	}
}

// streamAttempt bounds the first try to open a flow's streams on a tunnel.
const streamAttempt = 2 * time.Second

// tunnelFor returns pod's open tunnel, opening it if needed, and counts a
// stream on it; the caller must call release.
func (f *PortForwarder) tunnelFor(ctx context.Context, pod service.PodRef) (*tunnel, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, ErrClosed
	}
	t := f.tunnels[pod]
	if t == nil {
		t = &tunnel{pod: pod, ready: make(chan struct{})}
		f.tunnels[pod] = t
		f.wg.Add(1)
		go f.openTunnel(t)
	}
	t.streams++
	if t.idle != nil {
		t.idle.Stop()
		t.idle = nil
	}
	f.mu.Unlock()
	select {
	case <-t.ready:
	case <-ctx.Done():
		f.release(t)
		return nil, ctx.Err()
	}
	if t.err != nil {
		f.release(t)
		return nil, t.err
	}
	return t, nil
}

// openTunnel opens t (step 1), bounded by OpenTimeout: an opening that
// takes longer fails its waiters, and a connection that arrives later is
// closed.
func (f *PortForwarder) openTunnel(t *tunnel) {
	defer f.wg.Done()
	type result struct {
		conn httpstream.Connection
		err  error
	}
	res := make(chan result, 1)
	go func() {
		c, err := f.open(t.pod)
		res <- result{c, err}
	}()
	timer := time.NewTimer(f.cfg.OpenTimeout)
	defer timer.Stop()
	var r result
	select {
	case r = <-res:
	case <-timer.C:
		r.err = fmt.Errorf("opening the tunnel took longer than %v", f.cfg.OpenTimeout)
		go func() {
			if late := <-res; late.conn != nil {
				_ = late.conn.Close()
			}
		}()
	}
	if r.err != nil {
		t.err = fmt.Errorf("pods/portforward of %s: %w", t.pod, r.err)
		f.stats.openFailures.Add(1)
		f.logger.Warn("tunnel to a pod through the API server failed", zap.Stringer("pod", t.pod), zap.Error(r.err))
		f.mu.Lock()
		f.forget(t)
		f.mu.Unlock()
		close(t.ready)
		return
	}
	t.conn = r.conn
	f.stats.opens.Add(1)
	f.logger.Debug("tunnel to a pod opened through the API server", zap.Stringer("pod", t.pod))
	f.mu.Lock()
	if f.closed { // Close ran meanwhile
		f.forget(t)
		f.mu.Unlock()
		_ = t.conn.Close()
		t.conn, t.err = nil, ErrClosed
		close(t.ready)
		return
	}
	f.wg.Add(1)
	f.mu.Unlock()
	close(t.ready)
	go f.watch(t)
}

// watch drops t from the table when its connection closes (step 4).
func (f *PortForwarder) watch(t *tunnel) {
	defer f.wg.Done()
	<-t.conn.CloseChan()
	f.mu.Lock()
	gone := t.gone
	f.forget(t)
	f.mu.Unlock()
	if !gone {
		f.stats.broken.Add(1)
		f.logger.Info("tunnel to a pod through the API server broke", zap.Stringer("pod", t.pod))
	}
}

// forget takes t out of the table, under f.mu.
func (f *PortForwarder) forget(t *tunnel) {
	t.gone = true
	if f.tunnels[t.pod] == t {
		delete(f.tunnels, t.pod)
	}
	if t.idle != nil {
		t.idle.Stop()
		t.idle = nil
	}
}

// drop closes t and counts why.
func (f *PortForwarder) drop(t *tunnel, why *atomic.Uint64) {
	f.mu.Lock()
	gone := t.gone
	f.forget(t)
	f.mu.Unlock()
	if !gone {
		why.Add(1)
	}
	if t.conn != nil {
		_ = t.conn.Close()
	}
}

// release uncounts a stream of t; the last one starts the idle timer.
func (f *PortForwarder) release(t *tunnel) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t.streams--
	if t.streams > 0 || t.gone || t.conn == nil {
		return
	}
	t.idle = time.AfterFunc(f.cfg.Idle, func() {
		f.mu.Lock()
		if t.streams > 0 || t.gone {
			f.mu.Unlock()
			return
		}
		f.forget(t)
		f.mu.Unlock()
		f.stats.idleClosed.Add(1)
		_ = t.conn.Close()
	})
}

// openStreams opens a flow's pair of streams on t (step 2). CreateStream
// takes no context, so the pair is opened on a goroutine and abandoned
// (and closed when it arrives) if ctx ends first.
func (f *PortForwarder) openStreams(ctx context.Context, t *tunnel, port uint16) (net.Conn, error) {
	type result struct {
		c   *podConn
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := f.createPair(t, port)
		res <- result{c, err}
	}()
	select {
	case r := <-res:
		if r.err != nil {
			f.stats.streamFailures.Add(1)
			f.release(t)
			return nil, r.err
		}
		f.stats.streams.Add(1)
		f.stats.streamsOpen.Add(1)
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-res; r.c != nil {
				_ = r.c.Close()
			} else {
				f.release(t)
			}
		}()
		return nil, ctx.Err()
	}
}

// createPair creates the error and data streams of one flow.
func (f *PortForwarder) createPair(t *tunnel, port uint16) (*podConn, error) {
	h := http.Header{}
	h.Set(v1.StreamType, v1.StreamTypeError)
	h.Set(v1.PortHeader, strconv.Itoa(int(port)))
	h.Set(v1.PortForwardRequestIDHeader, strconv.FormatUint(t.nextID.Add(1), 10))
	errStream, err := t.conn.CreateStream(h)
	if err != nil {
		return nil, fmt.Errorf("error stream to %s port %d: %w", t.pod, port, err)
	}
	_ = errStream.Close() // nothing is written to it
	h.Set(v1.StreamType, v1.StreamTypeData)
	data, err := t.conn.CreateStream(h)
	if err != nil {
		_ = errStream.Reset()
		t.conn.RemoveStreams(errStream)
		return nil, fmt.Errorf("data stream to %s port %d: %w", t.pod, port, err)
	}
	c := &podConn{f: f, t: t, port: port, data: data, errStream: errStream, errDone: make(chan struct{})}
	go c.readError()
	return c, nil
}

// podConn is one flow through a tunnel (step 3): a net.Conn over the data
// stream. Deadlines are accepted and ignored (streams have none); the
// proxy bounds a flow by its conntrack entry instead.
type podConn struct {
	f         *PortForwarder
	t         *tunnel
	port      uint16
	data      httpstream.Stream
	errStream httpstream.Stream

	errDone chan struct{} // closed when the error stream ended
	errMsg  string        // what it carried, set before errDone closes
	errErr  error

	once sync.Once
}

func (c *podConn) readError() {
	msg, err := io.ReadAll(c.errStream)
	c.errMsg, c.errErr = string(msg), err
	close(c.errDone)
}

// errTunnelBroke is a flow's read error when its tunnel broke under it.
var errTunnelBroke = errors.New("the tunnel through the API server broke")

// Read reads the data stream; its end is an error unless the kubelet ended
// the flow cleanly (step 3).
func (c *podConn) Read(b []byte) (int, error) {
	n, err := c.data.Read(b)
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, io.EOF):
		return n, c.endErr()
	}
	return n, c.streamErr(err)
}

// endErr is the read error at the data stream's end: io.EOF, the kubelet's
// message, or errTunnelBroke.
func (c *podConn) endErr() error {
	select {
	case <-c.errDone:
	case <-c.t.conn.CloseChan():
		select {
		case <-c.errDone: // both: the error stream decides
		default:
			return c.streamErr(errTunnelBroke)
		}
	}
	if c.errMsg != "" {
		return c.streamErr(fmt.Errorf("pod %s port %d: %s", c.t.pod, c.port, c.errMsg))
	}
	if c.errErr != nil {
		return c.streamErr(c.errErr)
	}
	select {
	case <-c.t.conn.CloseChan():
		return c.streamErr(errTunnelBroke)
	default:
	}
	return io.EOF
}

func (c *podConn) streamErr(err error) error {
	c.f.stats.streamErrors.Add(1)
	return err
}

func (c *podConn) Write(b []byte) (int, error) {
	n, err := c.data.Write(b)
	if err != nil {
		return n, fmt.Errorf("pod %s port %d: %w", c.t.pod, c.port, err)
	}
	return n, nil
}

// CloseWrite half-closes the flow: the kubelet sees the data stream end.
func (c *podConn) CloseWrite() error { return c.data.Close() }

// Close resets both streams, frees them, and uncounts the flow.
func (c *podConn) Close() error {
	c.once.Do(func() {
		_ = c.data.Reset()
		_ = c.errStream.Reset()
		c.t.conn.RemoveStreams(c.data, c.errStream)
		c.f.stats.streamsOpen.Add(-1)
		c.f.release(c.t)
	})
	return nil
}

// podAddr is a flow's far end: the pod and port, not an address.
type podAddr struct {
	pod  service.PodRef
	port uint16
}

func (a podAddr) Network() string { return "portforward" }
func (a podAddr) String() string  { return a.pod.String() + ":" + strconv.Itoa(int(a.port)) }

func (c *podConn) LocalAddr() net.Addr              { return podAddr{} }
func (c *podConn) RemoteAddr() net.Addr             { return podAddr{pod: c.t.pod, port: c.port} }
func (c *podConn) SetDeadline(time.Time) error      { return nil }
func (c *podConn) SetReadDeadline(time.Time) error  { return nil }
func (c *podConn) SetWriteDeadline(time.Time) error { return nil }

// Stats returns the counters.
func (f *PortForwarder) Stats() PortForwardStats {
	f.mu.Lock()
	n := 0
	for _, t := range f.tunnels {
		if t.conn != nil {
			n++
		}
	}
	f.mu.Unlock()
	s := &f.stats
	return PortForwardStats{
		Tunnels: n, Opens: s.opens.Load(), OpenFailures: s.openFailures.Load(), Broken: s.broken.Load(), IdleClosed: s.idleClosed.Load(),
		StreamsOpen: int(s.streamsOpen.Load()), Streams: s.streams.Load(), StreamFailures: s.streamFailures.Load(), StreamErrors: s.streamErrors.Load(),
	}
}

// Tunnels returns the pods with an open tunnel and the flows on each, for
// /debug.
func (f *PortForwarder) Tunnels() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]int, len(f.tunnels))
	for p, t := range f.tunnels {
		if t.conn != nil {
			out[p.String()] = t.streams
		}
	}
	return out
}

// Close closes every tunnel (their flows fail) and waits for the
// goroutines; later dials fail with ErrClosed.
func (f *PortForwarder) Close() {
	f.mu.Lock()
	f.closed = true
	var ts []*tunnel
	for _, t := range f.tunnels {
		ts = append(ts, t)
	}
	f.mu.Unlock()
	for _, t := range ts {
		select {
		case <-t.ready:
			f.drop(t, new(atomic.Uint64))
		default: // still opening: openTunnel sees closed
		}
	}
	f.wg.Wait()
}

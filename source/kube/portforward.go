package kube

// Reaching pods through the API server (proxy.PodDialer; `--dial-via
// apiserver|auto`), the way `kubectl port-forward` does, but one tunnel per
// pod carrying every flow to it:
//
//  1. DialPod finds the pod's tunnel, or opens one: a POST to
//     pods/NAME/portforward upgraded with client-go's dialers (SPDY over a
//     WebSocket, falling back to plain SPDY for an API server that does not
//     take the WebSocket). Concurrent dials to one pod wait for the same
//     opening; a failed opening is remembered for failHold, so that a pod
//     that cannot be reached is not asked for on every flow.
//  2. Each flow is one pair of streams on the tunnel, as the kubelet's
//     port-forward protocol has it (portforward.k8s.io): an error stream
//     and a data stream with the same requestID and the pod's port. The
//     first try on a tunnel is short (streamAttempt): a tunnel that does not
//     answer is retired (no new flows; its flows go on) and a new one opened.
//  3. The flow's connection (podConn): a pump goroutine reads the data
//     stream into a bounded buffer (2 MiB). The SPDY library has no
//     per-stream flow control and hands each stream its frames in turn, so
//     a client that reads more slowly than its pod sends holds up the
//     tunnel's other flows once its buffer is full, as with kubectl
//     port-forward; one that reads nothing for StallLimit is reset, and the
//     others go on. At the data stream's end the pump looks at the error
//     stream: a message there (the kubelet could not reach the port) or a
//     tunnel that broke is a read error, so the proxy resets the client
//     rather than ending its flow cleanly; a flow that failed fails its
//     writes too.
//  4. A tunnel with no flows left is closed after Idle; a tunnel that
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
	// StallLimit is how long a flow whose client reads nothing may hold a
	// full buffer (2 MiB) before it is reset, so that it does not hold up
	// the other flows of its tunnel; 0 means 10 s.
	StallLimit time.Duration
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

const (
	// streamAttempt bounds the first try to open a flow's streams on a
	// tunnel. A tunnel whose far end died is noticed only at its next ping
	// (through the API server's WebSocket translation up to 10 s: its
	// tunnel waits for the client to write); a live one answers in
	// milliseconds.
	streamAttempt = 2 * time.Second
	// failHold is how long a failed opening answers the dials to its pod.
	failHold = time.Second
	// maxBuffered bounds what a flow's pump holds for a client that does
	// not read (PortForwardConfig.StallLimit).
	maxBuffered = 2 << 20
	chunkSize   = 32 << 10
)

// PortForwarder carries TCP connections to pods through the API server's
// pods/portforward; it implements proxy.PodDialer. Its methods are safe for
// concurrent use.
type PortForwarder struct {
	cfg    PortForwardConfig
	pods   rest.Interface
	logger *zap.Logger
	// open opens a tunnel to a pod (a field, so that tests can replace
	// it). It takes no context (client-go's dialers do not): openTunnel
	// bounds the wait instead.
	open func(pod service.PodRef) (httpstream.Connection, error)
	done chan struct{} // closed by Close

	mu      sync.Mutex
	tunnels map[service.PodRef]*tunnel // the tunnels new flows take
	live    map[*tunnel]struct{}       // every open tunnel, retired ones too
	closed  bool
	wg      sync.WaitGroup // openTunnel, the watchers, the flows' pumps and closers
	// openers are the goroutines creating stream pairs: the SPDY library
	// waits up to 30 s for each stream's reply (60 s for a pair) and cannot
	// be told to stop, so Close does not wait for them (tests do, with
	// waitOpeners).
	openers sync.WaitGroup

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
	// under their flows or stopped answering, and IdleClosed those closed
	// for lack of flows.
	Tunnels                                 int
	Opens, OpenFailures, Broken, IdleClosed uint64
	// StreamsOpen is the flows carried now; Streams counts the flows
	// carried, StreamFailures those whose streams could not be opened and
	// StreamErrors those ended with an error (the kubelet's, a broken
	// tunnel, a client that stopped reading).
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
	if cfg.StallLimit <= 0 {
		cfg.StallLimit = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cs, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("kube: port-forward client: %w", err)
	}
	f := &PortForwarder{cfg: cfg, pods: cs.CoreV1().RESTClient(), logger: cfg.Logger,
		tunnels: map[service.PodRef]*tunnel{}, live: map[*tunnel]struct{}{}, done: make(chan struct{})}
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

// tunnel is one pod's port-forward connection. conn, err and failedAt are
// set under PortForwarder.mu before ready closes; after that they do not
// change.
type tunnel struct {
	pod      service.PodRef
	ready    chan struct{} // closed once the opening ended
	conn     httpstream.Connection
	err      error     // of the opening
	failedAt time.Time // when the opening failed
	// openerDone closes when client-go's dial returned, even after an
	// opening that was given up: until then the pod gets no new opening,
	// so that a hung API server cannot pile them up.
	openerDone chan struct{}

	closing   chan struct{} // closed just before we close conn ourselves
	closeOnce sync.Once

	nextID  atomic.Uint64 // requestID of the next stream pair
	streams int           // under PortForwarder.mu: flows on it and dials waiting for it
	idle    *time.Timer   // under PortForwarder.mu: runs while streams == 0
	gone    bool          // under PortForwarder.mu: out of the table (no new flows)
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
		f.retire(t)
	}
}

// tunnelFor returns pod's tunnel, opening it if needed, and counts a flow
// on it; the caller must release it.
func (f *PortForwarder) tunnelFor(ctx context.Context, pod service.PodRef) (*tunnel, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, ErrClosed
	}
	t := f.tunnels[pod]
	if t != nil && f.stale(t) {
		delete(f.tunnels, pod) // the failure is old: try again
		t = nil
	}
	if t == nil {
		t = &tunnel{pod: pod, ready: make(chan struct{}), closing: make(chan struct{}), openerDone: make(chan struct{})}
		f.tunnels[pod] = t
		f.wg.Add(1)
		go f.openTunnel(t)
	}
	if t.err != nil {
		f.mu.Unlock()
		return nil, t.err
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

// stale reports whether t is a failed opening that new dials may replace,
// under f.mu: held for failHold, and until its opener returned.
func (f *PortForwarder) stale(t *tunnel) bool {
	if t.err == nil || time.Since(t.failedAt) < failHold {
		return false
	}
	select {
	case <-t.openerDone:
		return true
	default:
		return false
	}
}

// dropStale takes t out of the table once it is stale, so that failed
// pods do not stay in it.
func (f *PortForwarder) dropStale(t *tunnel) {
	f.mu.Lock()
	if f.tunnels[t.pod] == t && f.stale(t) {
		delete(f.tunnels, t.pod)
	}
	f.mu.Unlock()
}

// openTunnel opens t (step 1), bounded by OpenTimeout and by Close. A
// connection that arrives after the wait ended is closed; the goroutine
// inside client-go's dialer that it waits for is not ours to stop.
func (f *PortForwarder) openTunnel(t *tunnel) {
	defer f.wg.Done()
	type result struct {
		conn httpstream.Connection
		err  error
	}
	res := make(chan result, 1)
	go func() { // tunnel opener: client-go's dial, which takes no context
		c, err := f.open(t.pod)
		close(t.openerDone)
		res <- result{c, err}
	}()
	abandon := func() {
		go func() { // late tunnel closer
			if late := <-res; late.conn != nil {
				_ = late.conn.Close()
			}
			time.AfterFunc(failHold, func() { f.dropStale(t) })
		}()
	}
	timer := time.NewTimer(f.cfg.OpenTimeout)
	defer timer.Stop()
	var r result
	select {
	case r = <-res:
	case <-timer.C:
		r.err = fmt.Errorf("opening the tunnel took longer than %v", f.cfg.OpenTimeout)
		abandon()
	case <-f.done:
		r.err = ErrClosed
		abandon()
	}
	f.mu.Lock()
	if r.err == nil && f.closed { // Close ran meanwhile
		_ = r.conn.Close()
		r.conn, r.err = nil, ErrClosed
	}
	if r.err != nil {
		t.err, t.failedAt = fmt.Errorf("pods/portforward of %s: %w", t.pod, r.err), time.Now()
		t.gone = true // kept in the table for failHold, for no new flows
		f.mu.Unlock()
		close(t.ready)
		if !errors.Is(r.err, ErrClosed) {
			f.stats.openFailures.Add(1)
			f.logger.Warn("tunnel to a pod through the API server failed", zap.Stringer("pod", t.pod), zap.Error(r.err))
			time.AfterFunc(failHold, func() { f.dropStale(t) })
		}
		return
	}
	t.conn = r.conn
	f.live[t] = struct{}{}
	if t.streams == 0 { // every dial waiting for it gave up
		f.armIdle(t)
	}
	f.wg.Add(1)
	f.mu.Unlock()
	close(t.ready)
	f.stats.opens.Add(1)
	f.logger.Debug("tunnel to a pod opened through the API server", zap.Stringer("pod", t.pod))
	go f.watch(t)
}

// watch takes t out of the table when its connection closes (step 4).
func (f *PortForwarder) watch(t *tunnel) {
	defer f.wg.Done()
	// When we close it, the SPDY library reports the close only once its
	// streams are done, a pair still waiting for its reply included (up to
	// 30 s): closing is not waited for.
	select {
	case <-t.conn.CloseChan():
	case <-t.closing:
	}
	f.mu.Lock()
	delete(f.live, t)
	f.forget(t)
	f.mu.Unlock()
	select {
	case <-t.closing: // we closed it
		return
	default:
	}
	f.stats.broken.Add(1)
	f.logger.Info("tunnel to a pod through the API server broke", zap.Stringer("pod", t.pod))
}

// forget takes t out of the table: no new flows, under f.mu.
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

// closeConn closes t's connection; its flows see a broken tunnel. The SPDY
// library closes the socket only once its streams are gone, a stream whose
// reply never came included; the idle timeout resets those and closes it.
func (t *tunnel) closeConn() {
	t.closeOnce.Do(func() {
		close(t.closing)
		if t.conn != nil {
			_ = t.conn.Close()
			t.conn.SetIdleTimeout(time.Second)
		}
	})
}

// retire takes a tunnel that did not answer out of the table; its flows go
// on, and it closes with the last of them.
func (f *PortForwarder) retire(t *tunnel) {
	f.mu.Lock()
	was := t.gone
	f.forget(t)
	last := t.streams == 0
	f.mu.Unlock()
	if !was {
		f.stats.broken.Add(1)
		f.logger.Info("tunnel to a pod through the API server did not answer: a new one is opened", zap.Stringer("pod", t.pod))
	}
	if last {
		t.closeConn()
	}
}

// release uncounts a flow of t; the last one starts the idle timer, or
// closes a tunnel out of the table.
func (f *PortForwarder) release(t *tunnel) {
	f.mu.Lock()
	t.streams--
	closeNow := t.streams == 0 && t.gone && t.conn != nil
	if t.streams == 0 && !t.gone && t.conn != nil {
		f.armIdle(t)
	}
	f.mu.Unlock()
	if closeNow {
		t.closeConn()
	}
}

// armIdle starts t's idle timer, under f.mu.
func (f *PortForwarder) armIdle(t *tunnel) {
	var timer *time.Timer
	timer = time.AfterFunc(f.cfg.Idle, func() {
		f.mu.Lock()
		if t.idle != timer || t.streams > 0 || t.gone { // stopped, used, or dropped meanwhile
			f.mu.Unlock()
			return
		}
		f.forget(t)
		f.mu.Unlock()
		f.stats.idleClosed.Add(1)
		t.closeConn()
	})
	t.idle = timer
}

// openStreams opens a flow's pair of streams on t (step 2). CreateStream
// takes no context, so the pair is opened on a goroutine and abandoned
// (and freed when it arrives) if ctx ends first.
func (f *PortForwarder) openStreams(ctx context.Context, t *tunnel, port uint16) (net.Conn, error) {
	type result struct {
		c   *podConn
		err error
	}
	res := make(chan result, 1)
	f.openers.Add(1)
	go func() { // stream opener
		defer f.openers.Done()
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
		f.mu.Lock()
		if f.closed { // Close ran meanwhile: no goroutines after its Wait
			f.mu.Unlock()
			r.c.free()
			f.release(t)
			return nil, ErrClosed
		}
		f.wg.Add(2) // start's
		f.mu.Unlock()
		f.stats.streams.Add(1)
		f.stats.streamsOpen.Add(1)
		r.c.start()
		return r.c, nil
	case <-ctx.Done():
		f.stats.streamFailures.Add(1)
		f.openers.Add(1)
		go func() { // late stream pair freer
			defer f.openers.Done()
			if r := <-res; r.c != nil {
				r.c.free()
			}
			f.release(t)
		}()
		return nil, fmt.Errorf("streams to %s port %d: %w", t.pod, port, ctx.Err())
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
	return &podConn{f: f, t: t, port: port, data: data, errStream: errStream,
		errDone: make(chan struct{}), chunks: make(chan chunk, maxBuffered/chunkSize), closed: make(chan struct{})}, nil
}

// podConn is one flow through a tunnel (step 3): a net.Conn over the data
// stream. Read is for one goroutine at a time, as is Write. Deadlines are
// accepted and ignored (streams have none); the proxy bounds a flow by its
// conntrack entry instead. Close resets the flow and never blocks.
type podConn struct {
	f         *PortForwarder
	t         *tunnel
	port      uint16
	data      httpstream.Stream
	errStream httpstream.Stream

	errDone chan struct{} // closed when the error stream ended
	errMsg  string        // what it carried, set before errDone closes
	errErr  error

	chunks  chan chunk    // the pump's reads, closed at the stream's end
	final   error         // io.EOF or the flow's error, set before chunks closes
	cur     chunk         // the chunk Read is taking bytes from
	pending []byte        // what Read has left of it
	closed  chan struct{} // closed by Close

	failed     atomic.Pointer[error] // the flow's error, once it failed: Write returns it
	halfClosed atomic.Bool           // CloseWrite was called
	clean      atomic.Bool           // the data stream ended without an error
	once       sync.Once
}

// start runs the flow's goroutines: the error stream's reader and the
// pump (the caller has added them to f.wg).
func (c *podConn) start() {
	go func() { // error stream reader
		defer c.f.wg.Done()
		msg, err := io.ReadAll(c.errStream)
		c.errMsg, c.errErr = string(msg), err
		close(c.errDone)
	}()
	go func() { defer c.f.wg.Done(); c.pump() }()
}

// chunk is one read of the pump: n bytes of a pooled buffer, handed to
// Read, which gives the buffer back once it has copied them out.
type chunk struct {
	buf *[]byte
	n   int
}

var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

// pump moves the data stream into chunks (step 3).
func (c *podConn) pump() { // pump: data stream -> the flow's buffer
	defer close(c.chunks)
	for {
		buf := chunkPool.Get().(*[]byte)
		n, err := c.data.Read(*buf)
		if n == 0 {
			chunkPool.Put(buf)
		} else if perr := c.put(chunk{buf, n}); perr != nil {
			chunkPool.Put(buf)
			c.fail(perr)
			return
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, io.EOF):
			if end := c.endErr(); end != io.EOF {
				c.fail(end)
				return
			}
			c.final = io.EOF
			c.clean.Store(true)
		default:
			c.fail(c.streamErr(err))
		}
		return
	}
}

// fail records the flow's error for Read (after what is buffered) and for
// Write, on the pump's goroutine before chunks closes.
func (c *podConn) fail(err error) {
	c.final = err
	c.failed.Store(&err)
}

// errStalled ends a flow whose client stopped reading.
var errStalled = fmt.Errorf("the client read nothing of the %d MiB buffered for it", maxBuffered>>20)

// put hands a chunk to Read. It fails when the flow ends instead: closed
// (net.ErrClosed), or stalled, its client reading nothing for StallLimit
// while its buffer is full; then the flow is reset, so that it holds up
// the tunnel's other flows no longer.
func (c *podConn) put(ch chunk) error {
	select {
	case c.chunks <- ch: // room: no timer
		return nil
	default:
	}
	timer := time.NewTimer(c.f.cfg.StallLimit)
	defer timer.Stop()
	select {
	case c.chunks <- ch:
		return nil
	case <-c.closed:
		return net.ErrClosed
	case <-c.f.done:
		return ErrClosed
	case <-timer.C:
		_ = c.data.Reset()
		return c.streamErr(fmt.Errorf("pod %s port %d: %w", c.t.pod, c.port, errStalled))
	}
}

// endErr is the read error at the data stream's end: io.EOF, the kubelet's
// message, or a broken tunnel.
func (c *podConn) endErr() error {
	broke := func() error {
		return c.streamErr(fmt.Errorf("pod %s port %d: the tunnel through the API server broke", c.t.pod, c.port))
	}
	select {
	case <-c.errDone:
	case <-c.t.conn.CloseChan():
		select {
		case <-c.errDone: // both: the error stream decides
		default:
			return broke()
		}
	case <-c.t.closing:
		return broke()
	case <-c.f.done:
		return broke()
	case <-c.closed: // nobody reads on
		return net.ErrClosed
	}
	switch {
	case c.errMsg != "":
		return c.streamErr(fmt.Errorf("pod %s port %d: %s", c.t.pod, c.port, c.errMsg))
	case c.errErr != nil:
		return c.streamErr(c.errErr)
	}
	select {
	case <-c.t.conn.CloseChan():
		return broke()
	case <-c.t.closing:
		return broke()
	default:
	}
	return io.EOF
}

func (c *podConn) streamErr(err error) error {
	c.f.stats.streamErrors.Add(1)
	return err
}

// Read reads what the pump read; the flow's end is io.EOF only if the
// kubelet ended it cleanly. After Close it is net.ErrClosed, whatever the
// pump left.
func (c *podConn) Read(b []byte) (int, error) {
	if c.isClosed() { // before what is buffered, and before the end the pump saw
		return 0, net.ErrClosed
	}
	if len(c.pending) == 0 {
		if c.cur.buf != nil {
			chunkPool.Put(c.cur.buf)
			c.cur = chunk{}
		}
		var ok bool
		select {
		case c.cur, ok = <-c.chunks:
		case <-c.closed:
			return 0, net.ErrClosed
		}
		if !ok {
			if c.isClosed() { // the pump saw the reset of Close: both were ready
				return 0, net.ErrClosed
			}
			return 0, c.final
		}
		c.pending = (*c.cur.buf)[:c.cur.n]
	}
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

// isClosed reports whether Close was called.
func (c *podConn) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// Write writes to the data stream; once the flow failed (a stall, the
// kubelet's error, a broken tunnel), it returns that error, since the SPDY
// library would drop the bytes of a reset stream without one.
func (c *podConn) Write(b []byte) (int, error) {
	if e := c.failed.Load(); e != nil {
		return 0, *e
	}
	if c.isClosed() {
		return 0, net.ErrClosed
	}
	n, err := c.data.Write(b)
	if err != nil {
		return n, fmt.Errorf("pod %s port %d: %w", c.t.pod, c.port, err)
	}
	return n, nil
}

// CloseWrite half-closes the flow: the kubelet sees the data stream end.
func (c *podConn) CloseWrite() error {
	c.halfClosed.Store(true)
	return c.data.Close()
}

// Close ends the flow and uncounts it. The streams are reset on a
// goroutine: a reset is a frame written under the tunnel's write lock, which
// a backed-up tunnel may hold for a while, and Close runs on the proxy's
// reaper.
func (c *podConn) Close() error {
	c.once.Do(func() {
		close(c.closed)
		c.f.stats.streamsOpen.Add(-1)
		c.f.mu.Lock()
		closed := c.f.closed
		if !closed {
			c.f.wg.Add(1)
		}
		c.f.mu.Unlock()
		if closed { // the tunnel is closed: nothing to wait for
			c.free()
			c.f.release(c.t)
			return
		}
		go func() { // stream pair closer
			defer c.f.wg.Done()
			c.free()
			c.f.release(c.t)
		}()
	})
	return nil
}

// free resets both streams and takes them off the tunnel. A half-closed
// data stream is finished for the SPDY library, whose Reset then sends
// nothing: it is cancelled (an RST_STREAM) unless it ended cleanly.
func (c *podConn) free() {
	if c.halfClosed.Load() && !c.clean.Load() {
		if cs, ok := c.data.(interface{ Cancel() error }); ok {
			_ = cs.Cancel()
		}
	}
	_ = c.data.Reset()
	_ = c.errStream.Reset()
	c.t.conn.RemoveStreams(c.data, c.errStream)
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
	n := len(f.live)
	f.mu.Unlock()
	s := &f.stats
	return PortForwardStats{
		Tunnels: n, Opens: s.opens.Load(), OpenFailures: s.openFailures.Load(), Broken: s.broken.Load(), IdleClosed: s.idleClosed.Load(),
		StreamsOpen: int(s.streamsOpen.Load()), Streams: s.streams.Load(), StreamFailures: s.streamFailures.Load(), StreamErrors: s.streamErrors.Load(),
	}
}

// Tunnels returns the pods with an open tunnel in the table and, for each,
// its flows and the dials waiting for it, for /debug.
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

// Close closes every tunnel (their flows fail), stops the openings and
// waits for the goroutines but the stream pairs' openers (see openers);
// later dials fail with ErrClosed.
func (f *PortForwarder) Close() {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.wg.Wait()
		return
	}
	f.closed = true
	close(f.done)
	var ts []*tunnel
	for _, t := range f.tunnels {
		f.forget(t) // a tunnel still opening: openTunnel sees done
	}
	for t := range f.live {
		ts = append(ts, t)
	}
	f.mu.Unlock()
	for _, t := range ts {
		t.closeConn()
	}
	f.wg.Wait()
}

// waitOpeners waits for the goroutines creating stream pairs (tests).
func (f *PortForwarder) waitOpeners() { f.openers.Wait() }

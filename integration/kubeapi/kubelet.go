package kubeapi

// A fake node agent serving the kubelet's port-forward API, in order:
//
//  1. StartKubelet: a self-signed certificate (the API server does not check
//     it without --kubelet-certificate-authority), TLS over the caller's
//     listener, HTTP/1.1 for /portForward/{namespace}/{pod}[/{uid}];
//  2. a request: subprotocol handshake (portforward.k8s.io), SPDY/3.1
//     upgrade; the upgraded connection is one tunnel, owned by the goroutine
//     of its request;
//  3. streams arrive on SPDY's frame workers (receive), are checked (port,
//     streamType) and handed to the tunnel's owner (run), which pairs them
//     by requestID and expires a pair whose second stream is late;
//  4. a complete pair is forwarded on a goroutine of its own: dial the
//     backend, one copier per direction, each half-closing the other side;
//     a failed dial is written to the error stream, as the kubelet does;
//  5. Kill cuts the listener and every TCP connection at once; Close also
//     waits for every goroutine.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"
)

// portForwardProtocol is the only subprotocol the kubelet's port-forward
// endpoint speaks over SPDY (client-go's PortForwardProtocolV1Name).
const portForwardProtocol = "portforward.k8s.io"

const (
	// defaultStreamCreationTimeout is the kubelet's default wait for the
	// second stream of a pair.
	defaultStreamCreationTimeout = 30 * time.Second
	// maxPairsPerTunnel bounds the pairs a tunnel holds, waiting or
	// forwarding (three goroutines each); more are refused on their error
	// stream. The kubelet has no such bound.
	maxPairsPerTunnel = 256
	// backendDialTimeout bounds one dial of a backend.
	backendDialTimeout = 10 * time.Second
)

// KubeletConfig configures a fake node agent.
type KubeletConfig struct {
	// Listener the agent serves on (TLS is added by the agent); the test
	// creates it, possibly inside a network namespace. Kill and Close close
	// it.
	Listener net.Listener
	// Backend returns the address to forward (namespace, pod, port) to,
	// false if the pod or port is unknown. It is called concurrently.
	Backend func(namespace, pod string, port int32) (string, bool)
	// Dial dials backends (nil: net.Dialer); for a namespace, a dialer that
	// runs there.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// StreamCreationTimeout bounds the wait for a pair's second stream
	// (0: 30 s, the kubelet's default).
	StreamCreationTimeout time.Duration
	// Logger (nil: none) gets each upgrade request at debug level, with its
	// headers, and each refused stream or failed dial.
	Logger *zap.Logger
}

// Kubelet is a running fake node agent. Its methods are safe for concurrent
// use.
type Kubelet struct {
	cfg    KubeletConfig
	log    *zap.Logger
	srv    *http.Server
	served chan struct{} // closed when srv.Serve has returned

	// httpConns counts the HTTP server's connections until they close or
	// are hijacked; handlers counts the requests being served (an upgraded
	// one until its tunnel and every forward of it have ended).
	httpConns, handlers sync.WaitGroup

	mu      sync.Mutex
	killed  bool
	conns   map[*kubeletConn]struct{} // accepted TCP connections not yet closed
	tunnels map[string]int            // "namespace/pod" -> upgrades accepted
	streams map[string]int            // "namespace/pod" -> data streams forwarded
	open    int                       // tunnels open now
}

// StartKubelet serves the port-forward API on cfg.Listener until Kill or
// Close.
func StartKubelet(cfg KubeletConfig) (*Kubelet, error) {
	if cfg.Listener == nil || cfg.Backend == nil {
		return nil, errors.New("kubeapi: KubeletConfig needs a Listener and a Backend")
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.StreamCreationTimeout <= 0 {
		cfg.StreamCreationTimeout = defaultStreamCreationTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	cert, err := kubeletCertificate()
	if err != nil {
		return nil, fmt.Errorf("kubeapi: kubelet certificate: %w", err)
	}
	k := &Kubelet{
		cfg:     cfg,
		log:     cfg.Logger,
		served:  make(chan struct{}),
		conns:   map[*kubeletConn]struct{}{},
		tunnels: map[string]int{},
		streams: map[string]int{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/portForward/{namespace}/{pod}", k.servePortForward)
	mux.HandleFunc("/portForward/{namespace}/{pod}/{uid}", k.servePortForward)
	k.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(k.log),
		ConnState: func(_ net.Conn, st http.ConnState) {
			switch st {
			case http.StateNew:
				k.httpConns.Add(1)
			case http.StateHijacked, http.StateClosed:
				k.httpConns.Done()
			}
		},
	}
	ln := tls.NewListener(kubeletListener{Listener: cfg.Listener, k: k}, &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"http/1.1"}, // an upgrade needs HTTP/1.1
		MinVersion:   tls.VersionTLS12,
	})
	go func() { // kubelet acceptor: until the listener is closed
		defer close(k.served)
		_ = k.srv.Serve(ln)
	}()
	return k, nil
}

// Port returns the port the agent listens on.
func (k *Kubelet) Port() int {
	if a, ok := k.cfg.Listener.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	ap, err := netip.ParseAddrPort(k.cfg.Listener.Addr().String())
	if err != nil {
		return 0
	}
	return int(ap.Port())
}

// Tunnels returns how many port-forward connections (upgrades) the agent
// has accepted per "namespace/pod".
func (k *Kubelet) Tunnels() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return copyCounts(k.tunnels)
}

// Streams returns how many data streams the agent has forwarded per
// "namespace/pod": pairs whose backend it dialled; a pair refused or whose
// dial failed does not count.
func (k *Kubelet) Streams() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return copyCounts(k.streams)
}

// OpenTunnels returns how many port-forward connections are open now.
func (k *Kubelet) OpenTunnels() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.open
}

func copyCounts(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for key, n := range m {
		out[key] = n
	}
	return out
}

// Kill closes the listener and every TCP connection at once, mid-flow, as
// a killed kubelet's are: no TLS close_notify, no SPDY GOAWAY; in-flight
// streams break. The tunnels then end on their own goroutines and close
// their backend connections. It may be called more than once.
func (k *Kubelet) Kill() {
	k.mu.Lock()
	k.killed = true
	conns := k.conns
	k.conns = map[*kubeletConn]struct{}{}
	k.mu.Unlock()
	_ = k.cfg.Listener.Close()
	for c := range conns {
		_ = c.Conn.Close()
	}
}

// Close is Kill, then waits for every goroutine of the agent to end.
func (k *Kubelet) Close() {
	k.Kill()
	<-k.served
	k.httpConns.Wait()
	k.handlers.Wait()
}

// kubeletListener records each accepted TCP connection, for Kill.
type kubeletListener struct {
	net.Listener
	k *Kubelet
}

func (l kubeletListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.k.mu.Lock()
	defer l.k.mu.Unlock()
	if l.k.killed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	kc := &kubeletConn{Conn: c, k: l.k}
	l.k.conns[kc] = struct{}{}
	return kc, nil
}

// kubeletConn is an accepted TCP connection that leaves Kubelet.conns when
// closed.
type kubeletConn struct {
	net.Conn
	k *Kubelet
}

func (c *kubeletConn) Close() error {
	c.k.mu.Lock()
	delete(c.k.conns, c)
	c.k.mu.Unlock()
	return c.Conn.Close()
}

// enter admits a request unless the agent is killed; admitted requests are
// waited for by Close.
func (k *Kubelet) enter() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.killed {
		return false
	}
	k.handlers.Add(1)
	return true
}

// servePortForward upgrades a port-forward request and serves the tunnel
// until the connection ends.
func (k *Kubelet) servePortForward(w http.ResponseWriter, r *http.Request) {
	if !k.enter() {
		http.Error(w, "the kubelet is shutting down", http.StatusServiceUnavailable)
		return
	}
	defer k.handlers.Done()
	ns, pod := r.PathValue("namespace"), r.PathValue("pod")
	if ce := k.log.Check(zap.DebugLevel, "port-forward request"); ce != nil {
		ce.Write(zap.String("method", r.Method), zap.String("uri", r.RequestURI), zap.String("proto", r.Proto),
			zap.Any("headers", r.Header), zap.String("remote", r.RemoteAddr))
	}
	if _, err := httpstream.Handshake(r, w, []string{portForwardProtocol}); err != nil {
		k.log.Info("port-forward handshake failed", zap.String("pod", ns+"/"+pod), zap.Error(err))
		return // Handshake has answered
	}
	t := &tunnel{
		k: k, ns: ns, pod: pod,
		arrivals: make(chan arrival),
		gone:     make(chan struct{}),
		pending:  map[string]*pair{},
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	defer t.cancel()
	conn := spdy.NewResponseUpgrader().UpgradeResponse(w, r, t.receive)
	if conn == nil {
		close(t.gone)
		return // UpgradeResponse has answered
	}
	t.conn = conn
	k.mu.Lock()
	k.tunnels[ns+"/"+pod]++
	k.open++
	k.mu.Unlock()
	t.run()
	k.mu.Lock()
	k.open--
	k.mu.Unlock()
}

// tunnel is one upgraded port-forward connection. run owns pending; the
// other fields are set before run and not changed.
type tunnel struct {
	k       *Kubelet
	ns, pod string
	conn    httpstream.Connection

	arrivals chan arrival  // receive -> run: streams accepted
	gone     chan struct{} // closed when run stops taking arrivals
	ctx      context.Context
	cancel   context.CancelFunc // ends the forwards, once the connection is closed

	pending  map[string]*pair // requestID -> a pair still missing a stream
	active   atomic.Int32     // pairs being forwarded
	forwards sync.WaitGroup
}

// arrival is a stream accepted by receive; replied is closed once SPDY has
// tried to send its SYN_REPLY.
type arrival struct {
	s       httpstream.Stream
	port    int32
	replied <-chan struct{}
}

// pair is the error and data streams of one forwarded connection.
type pair struct {
	id       string
	errs     *arrival
	data     *arrival
	deadline time.Time
}

var errTunnelGone = errors.New("the port-forward connection is closing")

// receive is SPDY's handler of a new stream, called on a frame worker
// before the stream is answered: it refuses (resets) a stream whose headers
// are wrong and hands the others to run.
func (t *tunnel) receive(s httpstream.Stream, replied <-chan struct{}) error {
	h := s.Headers()
	port, err := strconv.ParseUint(h.Get(v1.PortHeader), 10, 16)
	if err != nil || port == 0 {
		return fmt.Errorf("header %s %q is not a port", v1.PortHeader, h.Get(v1.PortHeader))
	}
	if typ := h.Get(v1.StreamType); typ != v1.StreamTypeError && typ != v1.StreamTypeData {
		return fmt.Errorf("header %s %q is neither %q nor %q", v1.StreamType, typ, v1.StreamTypeError, v1.StreamTypeData)
	}
	select {
	case t.arrivals <- arrival{s: s, port: int32(port), replied: replied}:
		return nil
	case <-t.gone:
		return errTunnelGone
	}
}

// run pairs the tunnel's streams and starts a forward for each complete
// pair, until the connection closes; then it ends every pair and waits for
// the forwards.
func (t *tunnel) run() { // tunnel owner: pairs streams, expires late ones
	expiry := time.NewTimer(time.Hour)
	expiry.Stop()
	defer expiry.Stop()
	for {
		t.schedule(expiry)
		select {
		case <-t.conn.CloseChan():
			t.end()
			return
		case a := <-t.arrivals:
			t.add(a)
		case now := <-expiry.C:
			t.expire(now)
		}
	}
}

// schedule sets the timer to the earliest deadline of a waiting pair.
func (t *tunnel) schedule(expiry *time.Timer) {
	var first time.Time
	for _, p := range t.pending {
		if first.IsZero() || p.deadline.Before(first) {
			first = p.deadline
		}
	}
	if first.IsZero() {
		expiry.Stop()
		return
	}
	expiry.Reset(time.Until(first))
}

// add files a stream under its requestID and starts the pair's forward
// once both streams are there.
func (t *tunnel) add(a arrival) {
	id := requestID(a.s)
	p := t.pending[id]
	if p == nil {
		if len(t.pending)+int(t.active.Load()) >= maxPairsPerTunnel {
			t.fail(&pair{id: id}, &a, fmt.Sprintf("request %s refused: %d port-forward streams are open on this connection", id, maxPairsPerTunnel))
			return
		}
		p = &pair{id: id, deadline: time.Now().Add(t.k.cfg.StreamCreationTimeout)}
		t.pending[id] = p
	}
	slot := &p.data
	if a.s.Headers().Get(v1.StreamType) == v1.StreamTypeError {
		slot = &p.errs
	}
	if *slot != nil {
		// The pair goes on; only the duplicate is refused, and the pair's
		// error stream (if any) says why.
		msg := fmt.Sprintf("error processing stream for request %s: %s stream already assigned", id, a.s.Headers().Get(v1.StreamType))
		t.k.log.Info("port-forward stream refused", zap.String("pod", t.ns+"/"+t.pod), zap.String("reason", msg))
		if p.errs != nil && t.answered(p.errs) {
			_, _ = io.WriteString(p.errs.s, msg)
		}
		_ = a.s.Reset()
		t.conn.RemoveStreams(a.s)
		return
	}
	*slot = &a
	if p.errs == nil || p.data == nil {
		return
	}
	delete(t.pending, id)
	t.active.Add(1)
	t.forwards.Add(1)
	go t.forward(p) // pair forwarder: dials, then runs the two copiers
}

// requestID is the pair a stream belongs to. Clients too old to send the
// header create the error stream, then the data stream, two stream IDs
// later; the kubelet pairs those by ID, and so does this.
func requestID(s httpstream.Stream) string {
	if id := s.Headers().Get(v1.PortForwardRequestIDHeader); id != "" {
		return id
	}
	n := s.Identifier()
	if s.Headers().Get(v1.StreamType) == v1.StreamTypeData {
		n -= 2
	}
	return "stream-" + strconv.FormatUint(uint64(n), 10)
}

// expire ends the pairs still missing a stream at their deadline.
func (t *tunnel) expire(now time.Time) {
	for id, p := range t.pending {
		if p.deadline.After(now) {
			continue
		}
		delete(t.pending, id)
		t.fail(p, nil, fmt.Sprintf("request %s timed out waiting for streams", id))
	}
}

// end runs once the connection is closed: it stops receive, resets the
// waiting pairs, ends the forwards and waits for them.
func (t *tunnel) end() {
	close(t.gone)
	t.cancel()
	for id, p := range t.pending {
		delete(t.pending, id)
		t.fail(p, nil, "")
	}
	t.forwards.Wait()
}

// fail ends a pair that is not forwarded, with extra (a stream of no pair)
// if any: msg goes to the pair's error stream, which is then closed, as the
// kubelet reports a failure; the other streams are reset.
func (t *tunnel) fail(p *pair, extra *arrival, msg string) {
	if extra != nil {
		if extra.s.Headers().Get(v1.StreamType) == v1.StreamTypeError {
			p.errs = extra
		} else {
			p.data = extra
		}
	}
	if msg != "" {
		t.k.log.Info("port-forward failed", zap.String("pod", t.ns+"/"+t.pod), zap.String("reason", msg))
	}
	if p.errs != nil {
		if msg != "" && t.answered(p.errs) {
			_, _ = io.WriteString(p.errs.s, msg)
			_ = p.errs.s.Close()
		} else {
			_ = p.errs.s.Reset()
		}
		t.conn.RemoveStreams(p.errs.s)
	}
	if p.data != nil {
		_ = p.data.s.Reset()
		t.conn.RemoveStreams(p.data.s)
	}
}

// answered waits until SPDY has tried to answer a's stream and says whether
// it may be written to. A write to a stream whose SYN_REPLY was never sent
// blocks for good (spdystream waits for the reply); the reply fails only
// when the connection is gone, which the check below sees.
func (t *tunnel) answered(a *arrival) bool {
	select {
	case <-a.replied:
	case <-t.conn.CloseChan():
		return false
	}
	select {
	case <-t.conn.CloseChan():
		return false
	default:
		return true
	}
}

// forward connects one pair to its backend and copies both ways until both
// directions have ended, or the connection has.
func (t *tunnel) forward(p *pair) {
	defer t.forwards.Done()
	defer t.active.Add(-1)
	if !t.answered(p.errs) || !t.answered(p.data) {
		t.fail(p, nil, "")
		return
	}
	port := p.data.port
	addr, ok := t.k.cfg.Backend(t.ns, t.pod, port)
	if !ok {
		t.fail(p, nil, fmt.Sprintf("error forwarding port %d to pod %s/%s: no such pod or port", port, t.ns, t.pod))
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, backendDialTimeout)
	backend, err := t.k.cfg.Dial(ctx, "tcp", addr)
	cancel()
	if err != nil {
		t.fail(p, nil, fmt.Sprintf("error forwarding port %d to pod %s/%s: %v", port, t.ns, t.pod, err))
		return
	}
	t.k.mu.Lock()
	t.k.streams[t.ns+"/"+t.pod]++
	t.k.mu.Unlock()

	done := make(chan struct{}, 2)
	go func() { clientToBackend(backend, p.data.s); done <- struct{}{} }() // copier: client data -> backend
	go func() { backendToClient(p.data.s, backend); done <- struct{}{} }() // copier: backend -> client data
	gone := t.ctx.Done()
	for running := 2; running > 0; {
		select {
		case <-done:
			running--
		case <-gone: // the connection is closed: cut the backend too
			gone = nil
			_ = backend.Close()
			_ = p.data.s.Reset()
		}
	}
	_ = backend.Close()
	// An error stream closed empty tells the client the forward went well.
	_ = p.errs.s.Close()
	t.conn.RemoveStreams(p.data.s, p.errs.s)
}

// clientToBackend copies the client's data to the backend; the client's
// end of the stream (FIN, or a reset) half-closes the backend connection,
// and a backend that takes no more resets the stream.
func clientToBackend(backend net.Conn, data httpstream.Stream) {
	_, err := io.Copy(backend, data)
	if err != nil {
		_ = data.Reset()
		_ = backend.Close()
		return
	}
	closeWrite(backend)
}

// backendToClient copies the backend's data to the client; the backend's
// EOF closes the stream's write side (FIN), any error resets it.
func backendToClient(data httpstream.Stream, backend net.Conn) {
	if _, err := io.Copy(data, backend); err != nil {
		_ = data.Reset()
		return
	}
	_ = data.Close()
}

// closeWrite half-closes c, or closes it when it cannot.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}

// kubeletCertificate makes a self-signed serving certificate for 127.0.0.1,
// ::1 and localhost.
func kubeletCertificate() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "userproxy-kubeapi-kubelet"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// RegisterNode creates Node name as a kubelet would register it, with the
// status the API server reads to reach it: addresses [InternalIP
// 127.0.0.1] (no Hostname, which the API server would prefer),
// daemonEndpoints.kubeletEndpoint.Port = port and a Ready condition True.
func RegisterNode(ctx context.Context, cs kubernetes.Interface, name string, port int) error {
	if port <= 0 || port > 65535 {
		return fmt.Errorf("kubeapi: node %s: port %d out of range", name, port)
	}
	node, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kubeapi: creating node %s: %w", name, err)
	}
	now := metav1.Now()
	node.Status.Addresses = []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(port)
	node.Status.Conditions = []v1.NodeCondition{{
		Type: v1.NodeReady, Status: v1.ConditionTrue,
		Reason: "KubeletReady", Message: "fake kubelet of integration/kubeapi",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("kubeapi: node %s status: %w", name, err)
	}
	return nil
}

// CreatePod creates Pod ns/name, one container with containerPort port/TCP,
// bound to node (spec.nodeName, as the scheduler would bind it), then sets
// the status a kubelet would: phase Running, hostIP 127.0.0.1 and podIP(s)
// ip. The ServiceAccount admission plugin rejects a pod whose service
// account does not exist, and without a controller-manager nobody makes a
// namespace's "default" one: CreatePod creates it when missing. The pod
// mounts no token.
func CreatePod(ctx context.Context, cs kubernetes.Interface, ns, name, node string, ip netip.Addr, port int32) (*v1.Pod, error) {
	if !ip.IsValid() {
		return nil, fmt.Errorf("kubeapi: pod %s/%s: no IP", ns, name)
	}
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kubeapi: service account %s/default: %w", ns, err)
	}
	automount := false
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: &automount,
			Containers: []v1.Container{{
				Name:  "app",
				Image: "registry.k8s.io/pause:3.10", // never pulled: there is no runtime
				Ports: []v1.ContainerPort{{ContainerPort: port, Protocol: v1.ProtocolTCP}},
			}},
		},
	}
	created, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeapi: creating pod %s/%s: %w", ns, name, err)
	}
	created.Status.Phase = v1.PodRunning
	created.Status.HostIP = "127.0.0.1"
	created.Status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	created.Status.PodIP = ip.String()
	created.Status.PodIPs = []v1.PodIP{{IP: ip.String()}}
	updated, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeapi: pod %s/%s status: %w", ns, name, err)
	}
	return updated, nil
}

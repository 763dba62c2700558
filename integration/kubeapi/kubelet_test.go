package kubeapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/userproxy/userproxy/integration/kubeapi"
)

// The fake kubelet behind the real API server, reached with client-go's
// port-forward dialers: the WebSocket one (which the API server translates
// to SPDY towards the node) falling back to SPDY, and SPDY alone. Each pod
// reaches its own backend; 20 streams share one connection; an unknown port
// and a lone stream are reported on the error stream; Kill breaks an open
// stream, and an agent restarted on the same port serves again.
//
// Through the WebSocket tunnel a killed node is noticed late: the API
// server's tunneling connection (k8s.io/apiserver pkg/util/proxy
// streamtunnel.go) holds a read lock while its Read waits on the client, and
// its Close, once the node side has ended, waits for that lock — until the
// client next writes, at the latest its SPDY ping (portforward.PingPeriod,
// 10 s). Over SPDY the Read fails at once.
func TestKubeletPortForward(t *testing.T) {
	c, cs := startCluster(t)
	for _, tc := range []struct {
		name      string
		websocket bool
	}{
		{"websocket-fallback", true},
		{"spdy", false},
	} {
		t.Run(tc.name, func(t *testing.T) { testKubeletPortForward(t, c, cs, tc.name, tc.websocket) })
	}
}

func testKubeletPortForward(t *testing.T, c *kubeapi.Cluster, cs kubernetes.Interface, node string, websocket bool) {
	ns := newNamespace(t, cs)
	const port = 8080
	backends := map[string]*echoServer{"pod-a": newEchoServer(t, "pod-a"), "pod-b": newEchoServer(t, "pod-b")}
	logger := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)) // DebugLevel: each request the API server sends
	k, cfg := podsBehindKubelet(t, cs, node, ns, port, map[string]string{"pod-a": backends["pod-a"].addr, "pod-b": backends["pod-b"].addr},
		netip.MustParseAddr("198.51.100.10"), kubeapi.KubeletConfig{StreamCreationTimeout: time.Second, Logger: logger})
	wantVia, killNoticed := "spdy", 10*time.Second
	if websocket {
		wantVia, killNoticed = "websocket", 3*portforward.PingPeriod
	}
	dial := func(pod string) httpstream.Connection {
		t.Helper()
		conn, via, err := dialPortForward(c, cs, ns, pod, websocket)
		if err != nil {
			t.Fatalf("port-forward to %s: %v", pod, err)
		}
		if via != wantVia {
			t.Errorf("port-forward to %s connected by %s, want %s", pod, via, wantVia)
		}
		t.Cleanup(func() { _ = conn.Close() })
		return conn
	}

	// Each pod reaches its own backend; one stream, then the connection
	// closes.
	for _, pod := range []string{"pod-a", "pod-b"} {
		conn := dial(pod)
		if err := openForward(conn, pod, port, 1).roundTrip("hello "+pod, pod); err != nil {
			t.Fatalf("%s: %v", pod, err)
		}
		_ = conn.Close()
	}

	// 20 streams at once on one connection: one more tunnel, 20 streams.
	key := ns + "/pod-a"
	tunnels0, streams0 := k.Tunnels()[key], k.Streams()[key]
	conn := dial("pod-a")
	const concurrent = 20
	start := time.Now()
	errs := make(chan error, concurrent)
	var wg sync.WaitGroup
	for i := range concurrent {
		wg.Go(func() {
			errs <- openForward(conn, "pod-a", port, 100+i).roundTrip(fmt.Sprintf("stream %d %s", i, strings.Repeat("x", 10_000*i)), "pod-a")
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if got := k.Tunnels()[key] - tunnels0; got != 1 {
		t.Errorf("tunnels for %s: %d more, want 1", key, got)
	}
	if got := k.Streams()[key] - streams0; got != concurrent {
		t.Errorf("streams for %s: %d more, want %d", key, got, concurrent)
	}
	t.Logf("%d concurrent streams on one connection in %v; tunnels %v, streams %v", concurrent, time.Since(start).Round(time.Millisecond), k.Tunnels(), k.Streams())

	// An unknown port: a message on the error stream, the data stream reset.
	f := openForward(conn, "pod-a", 9999, 200)
	msg, err := f.errorMessage(10 * time.Second)
	if err != nil || msg == "" {
		t.Fatalf("unknown port: error stream %q, %v; want a message", msg, err)
	}
	t.Logf("unknown port: the error stream says %q", msg)
	if _, err := readWithin(f.data, make([]byte, 1), 10*time.Second); err == nil {
		t.Error("unknown port: the data stream gave data")
	}

	// An error stream whose data stream never comes: the agent gives up
	// after StreamCreationTimeout and says so.
	lone, err := createStream(conn, v1.StreamTypeError, port, 300)
	if err != nil {
		t.Fatal(err)
	}
	_ = lone.Close()
	if b, err := readAllWithin(lone, 10*time.Second); err != nil || !strings.Contains(string(b), "timed out waiting for streams") {
		t.Errorf("lone error stream: %q, %v; want a timeout message", b, err)
	}
	// The connection still works after all that.
	if err := openForward(conn, "pod-a", port, 400).roundTrip("still there", "pod-a"); err != nil {
		t.Fatal(err)
	}

	// Kill mid-flow: an open stream's Read ends, with no data.
	connB := dial("pod-b")
	open := openForward(connB, "pod-b", port, 1)
	br := bufio.NewReader(open.data)
	if name, err := readLineWithin(br, 10*time.Second); err != nil || name != "pod-b" {
		t.Fatalf("before the kill: %q, %v", name, err)
	}
	if got := k.OpenTunnels(); got != 2 {
		t.Errorf("open tunnels before the kill: %d, want 2 (pod-a's and pod-b's)", got)
	}
	killed := time.Now()
	k.Kill()
	n, err := readWithin(br, make([]byte, 1), killNoticed)
	if n != 0 || err == nil || errors.Is(err, errReadTimeout) {
		t.Fatalf("Read after the kill: %d bytes, %v; want no data and an error", n, err)
	}
	t.Logf("after the kill the open stream's Read returned %v in %v", err, time.Since(killed).Round(time.Millisecond))
	if _, ok := waitFor(10*time.Second, func() bool { return k.OpenTunnels() == 0 }); !ok {
		t.Errorf("open tunnels after the kill: %d", k.OpenTunnels())
	}
	if _, ok := waitFor(10*time.Second, func() bool { return backends["pod-b"].open() == 0 }); !ok {
		t.Errorf("backend connections of pod-b after the kill: %d", backends["pod-b"].open()) // the agent closes its own
	}
	k.Close()
	_ = connB.Close()
	_ = conn.Close()

	// Restarted on the same port, by the test, as a kubelet would be.
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(k.Port()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	k2, err := kubeapi.StartKubelet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k2.Close() })
	connB = dial("pod-b")
	if err := openForward(connB, "pod-b", port, 1).roundTrip("after the restart", "pod-b"); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if got := k2.Tunnels()[ns+"/pod-b"]; got != 1 {
		t.Errorf("the restarted agent's tunnels for pod-b: %d, want 1", got)
	}
}

// dialPortForward opens a port-forward connection to ns/pod through the
// API server as kubectl does: the WebSocket dialer first, falling back to
// SPDY when websocket is set; SPDY alone otherwise. It says which dialer
// connected, "websocket" or "spdy". The types are k8s.io/streaming's:
// client-go's WebSocket dialer fails with that package's
// UpgradeFailureError, which the deprecated apimachinery httpstream's
// IsUpgradeFailure does not recognise.
func dialPortForward(c *kubeapi.Cluster, cs kubernetes.Interface, ns, pod string, websocket bool) (httpstream.Connection, string, error) {
	u := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	cfg := c.RESTConfig("")
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, "", err
	}
	var via string
	var dialer httpstream.Dialer = recordingDialer{spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: rt}, http.MethodPost, u), "spdy", &via}
	if websocket {
		ws, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
		if err != nil {
			return nil, "", err
		}
		dialer = portforward.NewFallbackDialerForStreaming(recordingDialer{ws, "websocket", &via}, dialer, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
	}
	conn, proto, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err != nil {
		return nil, "", err
	}
	if proto != portforward.PortForwardProtocolV1Name {
		_ = conn.Close()
		return nil, "", fmt.Errorf("negotiated %q, want %q", proto, portforward.PortForwardProtocolV1Name)
	}
	return conn, via, nil
}

// recordingDialer sets *via to name when it makes the connection.
type recordingDialer struct {
	httpstream.Dialer
	name string
	via  *string
}

func (d recordingDialer) Dial(protocols ...string) (httpstream.Connection, string, error) {
	conn, proto, err := d.Dialer.Dial(protocols...)
	if err == nil {
		*d.via = d.name
	}
	return conn, proto, err
}

// forward is one forwarded connection: its data stream and what its error
// stream said (read in the background, to its end).
type forward struct {
	data    httpstream.Stream
	errDone chan struct{}
	errMsg  string
	errErr  error
	err     error // creating the streams
}

// openForward creates the error and then the data stream of one request,
// as client-go's PortForwarder does.
func openForward(conn httpstream.Connection, pod string, port, id int) *forward {
	f := &forward{errDone: make(chan struct{})}
	errs, err := createStream(conn, v1.StreamTypeError, port, id)
	if err != nil {
		f.err = fmt.Errorf("%s: error stream: %w", pod, err)
		close(f.errDone)
		return f
	}
	_ = errs.Close() // nothing to write on it
	go func() {      // error stream reader: to its end
		defer close(f.errDone)
		b, err := io.ReadAll(errs)
		f.errMsg, f.errErr = string(b), err
	}()
	if f.data, err = createStream(conn, v1.StreamTypeData, port, id); err != nil {
		f.err = fmt.Errorf("%s: data stream: %w", pod, err)
	}
	return f
}

func createStream(conn httpstream.Connection, typ string, port, id int) (httpstream.Stream, error) {
	h := http.Header{}
	h.Set(v1.StreamType, typ)
	h.Set(v1.PortHeader, strconv.Itoa(port))
	h.Set(v1.PortForwardRequestIDHeader, strconv.Itoa(id))
	return conn.CreateStream(h)
}

// roundTrip checks the backend's name line, the echo of msg, and the end of
// both streams after a half-close: the backend closes on EOF, the error
// stream ends empty.
func (f *forward) roundTrip(msg, wantName string) error {
	if f.err != nil {
		return f.err
	}
	r := bufio.NewReader(f.data)
	name, err := readLineWithin(r, 10*time.Second)
	if err != nil || name != wantName {
		return fmt.Errorf("name line %q, %v; want %q", name, err, wantName)
	}
	type echo struct {
		b   []byte
		err error
	}
	echoed := make(chan echo, 1)
	go func() { b, err := readAllWithin(r, 20*time.Second); echoed <- echo{b, err} }() // reads while we write
	if _, err := io.WriteString(f.data, msg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	_ = f.data.Close() // half-close: the backend sees EOF
	e := <-echoed
	got, err := e.b, e.err
	if err != nil || string(got) != msg {
		return fmt.Errorf("echo of %d bytes: %d bytes %.40q, %v", len(msg), len(got), got, err)
	}
	if m, err := f.errorMessage(10 * time.Second); err != nil || m != "" {
		return fmt.Errorf("error stream %q, %v; want it empty", m, err)
	}
	return nil
}

func (f *forward) errorMessage(within time.Duration) (string, error) {
	select {
	case <-f.errDone:
		if f.err != nil {
			return "", f.err
		}
		return f.errMsg, f.errErr
	case <-time.After(within):
		return "", errReadTimeout
	}
}

var errReadTimeout = errors.New("read timed out")

// readWithin is r.Read(p), or errReadTimeout after within. (A stream has no
// deadline; after a timeout the Read goes on until the connection closes.)
func readWithin(r io.Reader, p []byte, within time.Duration) (int, error) {
	type result struct {
		n   int
		err error
	}
	ch := make(chan result, 1)
	go func() { n, err := r.Read(p); ch <- result{n, err} }()
	select {
	case res := <-ch:
		return res.n, res.err
	case <-time.After(within):
		return 0, errReadTimeout
	}
}

func readAllWithin(r io.Reader, within time.Duration) ([]byte, error) {
	var b []byte
	var err error
	done := make(chan struct{})
	go func() { b, err = io.ReadAll(r); close(done) }()
	select {
	case <-done:
		return b, err
	case <-time.After(within):
		return nil, errReadTimeout
	}
}

func readLineWithin(r *bufio.Reader, within time.Duration) (string, error) {
	var line string
	var err error
	done := make(chan struct{})
	go func() { line, err = r.ReadString('\n'); close(done) }()
	select {
	case <-done:
		return strings.TrimSuffix(line, "\n"), err
	case <-time.After(within):
		return "", errReadTimeout
	}
}

// echoServer is a pod's backend on loopback: it writes its name and a
// newline, then echoes, and closes after the client's EOF.
type echoServer struct {
	name, addr string
	ln         net.Listener
	wg         sync.WaitGroup
	mu         sync.Mutex
	conns      map[net.Conn]struct{}
}

func newEchoServer(t testing.TB, name string) *echoServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{name: name, addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Go(func() { // echo acceptor
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *echoServer) serve(c net.Conn) { // echo connection: name, then echo to EOF
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		_ = c.Close()
	}()
	if _, err := io.WriteString(c, s.name+"\n"); err != nil {
		return
	}
	_, _ = io.Copy(c, c)
}

// open returns how many connections the server has open.
func (s *echoServer) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// podsBehindKubelet starts the fake kubelet on 127.0.0.1 with cfg (its
// Listener and Backend are set here), registers it as Node node, and creates
// the Pods of backends on it in namespace ns, with addresses from firstIP on
// (stored, never dialled): the kubelet forwards port of each to its backend.
// It returns the kubelet, closed when the test ends, and the config it was
// started with, for a restart on a new listener.
func podsBehindKubelet(t testing.TB, cs kubernetes.Interface, node, ns string, port int32, backends map[string]string, firstIP netip.Addr, cfg kubeapi.KubeletConfig) (*kubeapi.Kubelet, kubeapi.KubeletConfig) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listener = ln
	cfg.Backend = func(namespace, pod string, p int32) (string, bool) {
		addr, ok := backends[pod]
		return addr, ok && namespace == ns && p == port
	}
	k, err := kubeapi.StartKubelet(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := kubeapi.RegisterNode(ctx, cs, node, k.Port()); err != nil {
		t.Fatal(err)
	}
	pods := slices.Sorted(maps.Keys(backends))
	ip := firstIP
	for _, pod := range pods {
		if _, err := kubeapi.CreatePod(ctx, cs, ns, pod, node, ip, port); err != nil {
			t.Fatal(err)
		}
		ip = ip.Next()
	}
	return k, cfg
}

package kubeapi_test

import (
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// gate is a TCP forwarder on loopback in front of the API server that can
// be closed (the port refuses, every connection through it is cut) and
// opened again on the same port: the Source's own view of an outage, while
// the test's client still reaches the API server directly.
type gate struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        map[net.Conn]struct{}
	wg           sync.WaitGroup
}

func newGate(t *testing.T, target string) *gate {
	g := &gate{target: target, conns: map[net.Conn]struct{}{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = ln.Addr().String()
	g.serve(ln)
	t.Cleanup(func() { g.close(); g.wg.Wait() })
	return g
}

func (g *gate) serve(ln net.Listener) {
	g.mu.Lock()
	g.ln = ln
	g.mu.Unlock()
	g.wg.Go(func() { // gate acceptor
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			g.wg.Go(func() { g.forward(c) })
		}
	})
}

// forward splices one connection to the target until either side ends.
func (g *gate) forward(c net.Conn) { // gate connection: both directions
	up, err := net.Dial("tcp", g.target)
	if err != nil {
		c.Close()
		return
	}
	g.mu.Lock()
	if g.ln == nil {
		g.mu.Unlock()
		c.Close()
		up.Close()
		return
	}
	g.conns[c], g.conns[up] = struct{}{}, struct{}{}
	g.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }() // gate copier: client -> API server
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }() // gate copier: API server -> client
	<-done
	c.Close()
	up.Close()
	<-done
	g.mu.Lock()
	delete(g.conns, c)
	delete(g.conns, up)
	g.mu.Unlock()
}

// refuse closes the port; open connections go on.
func (g *gate) refuse() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ln != nil {
		_ = g.ln.Close()
		g.ln = nil
	}
}

// close refuses new connections and cuts the open ones.
func (g *gate) close() {
	g.refuse()
	g.mu.Lock()
	defer g.mu.Unlock()
	for c := range g.conns {
		_ = c.Close()
	}
}

// open listens again on the same port.
func (g *gate) open(t *testing.T) {
	ln, err := net.Listen("tcp", g.addr)
	if err != nil {
		t.Fatalf("reopening the gate on %s: %v", g.addr, err)
	}
	g.serve(ln)
}

// waitFor polls cond every 20 ms until it holds or within passes.
func waitFor(within time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > within {
			return time.Since(start), false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outageRig is a cluster with Services a, b, c live in a Source that
// reaches the API server through a gate, and debug logs kept.
type outageRig struct {
	t    *testing.T
	c    *kubeapi.Cluster
	cs   kubernetes.Interface
	ns   string
	g    *gate
	p    *proxySide
	logs *observer.ObservedLogs
	want view
}

func newOutageRig(t *testing.T, extraAPIServerArgs ...string) *outageRig {
	c, cs := startClusterWith(t, extraAPIServerArgs...)
	r := &outageRig{t: t, c: c, cs: cs, ns: newNamespace(t, cs), want: view{}}
	r.create("a", "10.1.0.1", "10.1.0.2")
	r.create("b", "10.1.1.1")
	r.create("c", "10.1.2.1")
	r.g = newGate(t, strings.TrimPrefix(c.URL(), "https://"))
	kubeconfig := t.TempDir() + "/kubeconfig"
	if err := c.WriteKubeconfigVia(kubeconfig, "https://"+r.g.addr, c.AdminToken()); err != nil {
		t.Fatal(err)
	}
	client, err := kube.NewClient(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// Debug lines too: client-go's say how each watch ended.
	core, logs := observer.New(zapcore.DebugLevel)
	r.logs = logs
	r.p = startSourceWith(t, client, 0, nil, zap.New(zapcore.NewTee(core, zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)).Core())))
	r.wait(time.Minute)
	return r
}

// create writes a Service and its slice and adds them to want.
func (r *outageRig) create(name string, addrs ...string) {
	r.t.Helper()
	ctx := ctxT(r.t)
	svc, err := r.cs.CoreV1().Services(r.ns).Create(ctx, newService(r.ns, name), metav1.CreateOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.cs.DiscoveryV1().EndpointSlices(r.ns).Create(ctx, newSlice(r.ns, name+"-1", name, discoveryv1.AddressTypeIPv4, eps(addrs...)...), metav1.CreateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	http, dns := portKeys(name, svc.Spec.ClusterIP, 80)
	r.want[http], r.want[dns] = keys(8080, addrs...), keys(5353, addrs...)
}

// setEndpoints replaces the endpoints of a Service's slice.
func (r *outageRig) setEndpoints(name string, addrs ...string) {
	r.t.Helper()
	ctx := ctxT(r.t)
	if _, err := r.cs.DiscoveryV1().EndpointSlices(r.ns).Update(ctx, newSlice(r.ns, name+"-1", name, discoveryv1.AddressTypeIPv4, eps(addrs...)...), metav1.UpdateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	for k := range r.want {
		if strings.HasPrefix(k, name+":http ") {
			r.want[k] = keys(8080, addrs...)
		} else if strings.HasPrefix(k, name+":dns ") {
			r.want[k] = keys(5353, addrs...)
		}
	}
}

// remove deletes a Service and its slice.
func (r *outageRig) remove(name string) {
	r.t.Helper()
	ctx := ctxT(r.t)
	if err := r.cs.CoreV1().Services(r.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
	if err := r.cs.DiscoveryV1().EndpointSlices(r.ns).Delete(ctx, name+"-1", metav1.DeleteOptions{}); err != nil {
		r.t.Fatal(err)
	}
	for k := range r.want {
		if strings.HasPrefix(k, name+":") {
			delete(r.want, k)
		}
	}
}

// wait waits for the table to equal want and returns how long it took.
func (r *outageRig) wait(within time.Duration) time.Duration {
	r.t.Helper()
	took, err := r.p.waitView(r.ns, r.want, within)
	if err != nil {
		r.t.Fatal(err)
	}
	return took
}

// waitReported waits for the Source to report the outage that began at
// since, and checks that the table did not move.
func (r *outageRig) waitReported(since time.Time, before *service.Table, within time.Duration) {
	r.t.Helper()
	if _, ok := waitFor(within, func() bool { return r.p.src.LastError() != nil }); !ok {
		r.t.Fatalf("the Source reported no error %v into the outage; its log:\n%s", within, strings.Join(messages(r.logs.All()), "\n"))
	}
	r.t.Logf("the Source reported the outage %v after it began: %v", time.Since(since).Round(time.Millisecond), r.p.src.LastError())
	if st := r.p.src.Stats(); st.Connected || st.Outages != 1 || st.DisconnectedSince.IsZero() {
		r.t.Errorf("stats during the outage: %+v", st)
	}
	if got := r.p.tracker.Current(); got != before {
		r.t.Errorf("a new table during the outage: %s", viewOf(got, r.ns))
	}
}

// changeWhileAway, with the Source's path cut and the control plane back:
// b deleted, a's endpoints replaced, d created, etcd's history compacted.
func (r *outageRig) changeWhileAway(before *service.Table) {
	r.t.Helper()
	cs, err := r.c.Client() // the old client's connections went with the server
	if err != nil {
		r.t.Fatal(err)
	}
	r.cs = cs
	r.remove("b")
	r.setEndpoints("a", "10.1.0.3")
	r.create("d", "10.1.3.1")
	rev, err := r.c.CompactEtcd(ctxT(r.t))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Logf("b deleted, a's endpoints replaced, d created; etcd compacted at revision %d", rev)
	if got := r.p.tracker.Current(); got != before {
		r.t.Fatalf("the table changed while the Source was cut off: %s", viewOf(got, r.ns))
	}
}

// recovered checks the Source's state after recovery and that one more
// change arrives within followWithin.
func (r *outageRig) recovered() {
	r.t.Helper()
	if _, ok := waitFor(10*time.Second, func() bool { return r.p.src.LastError() == nil }); !ok {
		r.t.Errorf("LastError after recovery: %v", r.p.src.LastError())
	}
	if st := r.p.src.Stats(); !st.Connected || st.Outages != 1 {
		r.t.Errorf("stats after recovery: %+v", st)
	}
	r.setEndpoints("c", "10.1.2.2")
	r.t.Logf("a change after recovery live in %v", r.wait(followWithin).Round(time.Millisecond))
}

// TestOutageRestartRelist crashes the control plane under a running Source
// that reaches it through a proxy (as through a load balancer), and brings
// it back changed:
//
//  1. Services a, b, c with endpoints are live.
//  2. The API server is killed. The proxy in front still accepts
//     connections and resets them, which client-go's watch retries hide
//     (it returns an empty watch and no error): the Source must still report
//     the outage (LastError, what /healthz shows), and the last table keeps
//     serving unchanged.
//  3. The Source's path is cut; etcd is killed too and restarted on its
//     data, then the API server. Through it the test deletes b, replaces
//     a's endpoints, creates d, and compacts etcd.
//  4. The path opens: the Source relists and the table becomes exactly a',
//     c, d — b, whose deletion no watch delivered, must not stay behind.
//  5. The watch is live again: one more change arrives within followWithin.
func TestOutageRestartRelist(t *testing.T) {
	r := newOutageRig(t)
	before := r.p.tracker.Current()

	// 2. The API server crashes.
	killed := time.Now()
	r.c.KillAPIServer()
	r.waitReported(killed, before, 30*time.Second)

	// 3. Cut, crash etcd, restart both, change things.
	r.g.close()
	r.c.KillEtcd()
	restart := time.Now()
	if err := r.c.StartEtcd(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if err := r.c.StartAPIServer(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd (same data) and the API server back in %v", time.Since(restart).Round(time.Millisecond))
	r.changeWhileAway(before)

	// 4. The path opens.
	r.g.open(t)
	t.Logf("path open: the table is a', c, d after %v (the informers' back-off included)", r.wait(time.Minute).Round(time.Millisecond))

	// 5.
	r.recovered()
}

// TestGracefulRestart410 restarts the API server gracefully, its watches
// drained (--shutdown-watch-termination-grace-period) and new connections
// refused meanwhile, so the Source's informers resume their watches from
// the resource versions they had rather than relisting. The new API server's watch cache starts later
// than those versions and etcd is compacted, so the resumed watches get 410
// Gone (resource version too old), and only a relist can show that b is
// gone.
//
// Whether a resumed watch meets the new API server or the old one's last
// moments is a race: a watch resumed on the old server's drained HTTP/2
// connection closes at once, and the reflector, taking it for a "very
// short watch", relists without ever seeing 410. The outcome (the table
// right after the restart) is checked every time; the 410 path must show
// in one of three attempts.
func TestGracefulRestart410(t *testing.T) {
	const attempts = 3
	for i := 1; i <= attempts; i++ {
		var gone []string
		t.Run(fmt.Sprintf("attempt%d", i), func(t *testing.T) { gone = gracefulRestart(t) })
		if t.Failed() {
			return
		}
		if len(gone) > 0 {
			t.Logf("attempt %d: %d resumed watches ended with 410 Gone and relisted, e.g. %s", i, len(gone), gone[0])
			return
		}
		t.Logf("attempt %d: no resumed watch ended with 410 Gone (the reflector relisted after a very short watch instead)", i)
	}
	t.Errorf("no watch ended with 410 Gone in %d attempts, so the relist after it was not exercised", attempts)
}

// gracefulRestart is one attempt of TestGracefulRestart410; it returns the
// log lines of watches that ended with 410 Gone.
func gracefulRestart(t *testing.T) []string {
	r := newOutageRig(t, "--shutdown-watch-termination-grace-period=2s")
	before := r.p.tracker.Current()
	// Watches that close within a second of opening are "very short" to
	// the reflector, which then relists instead of resuming: let them run
	// a while, as in any proxy that has been up for more than a moment.
	time.Sleep(2 * time.Second)

	// The gate's port closes first, its open connections stay: the
	// drained watches end cleanly, and the informers' attempts to resume
	// them are refused (and retried) until the port opens again.
	r.g.refuse()
	stopped := time.Now()
	if err := r.c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server stopped gracefully in %v", time.Since(stopped).Round(time.Millisecond))
	r.waitReported(stopped, before, 45*time.Second)
	if err := r.c.StartAPIServer(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r.changeWhileAway(before)

	r.g.open(t)
	t.Logf("path open: the table is a', c, d after %v", r.wait(time.Minute).Round(time.Millisecond))
	var gone []string
	for _, e := range r.logs.All() {
		if err, ok := e.ContextMap()["err"].(string); ok && strings.Contains(err, "too old resource version") {
			gone = append(gone, e.Message+": "+err)
		}
	}
	if len(gone) == 0 {
		t.Logf("no watch ended with 410 Gone; the log:\n%s", strings.Join(messages(r.logs.All()), "\n"))
	}
	r.recovered()
	return gone
}

func messages(es []observer.LoggedEntry) []string {
	var out []string
	for _, e := range es {
		if strings.HasSuffix(e.Message, " Body") {
			continue // client-go's request dumps
		}
		out = append(out, e.Time.Format("15:04:05.000")+" "+e.Message+": "+fmt.Sprint(e.ContextMap()))
	}
	return out
}

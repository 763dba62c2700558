package proxy

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// wayClock is a settable clock for the auto policy's memory.
type wayClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *wayClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *wayClock) advance(d time.Duration) { c.mu.Lock(); c.now = c.now.Add(d); c.mu.Unlock() }

// wayRig serves 10.96.0.1:80 (TCP) and 10.96.0.2:53 (UDP) over endpoints
// at 198.51.100.x that are never dialled: the direct dialer maps the
// routable ones to a loopback echo server and leaves the others unanswered
// until the dial's deadline, and the pod dialer maps every Pod to the echo
// server. Both record what they were asked.
type wayRig struct {
	p     *Proxy
	st    *netstack.Stack
	echo  string
	clock *wayClock

	mu       sync.Mutex
	routable map[netip.Addr]bool
	refusing map[netip.Addr]bool // answer with a RST (ECONNREFUSED)
	calls    []string            // "direct 198.51.100.1:8080", "apiserver ns/web-a 8080"
}

func (w *wayRig) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap := netip.MustParseAddrPort(address)
	w.mu.Lock()
	w.calls = append(w.calls, "direct "+address)
	ok, refuse := w.routable[ap.Addr()], w.refusing[ap.Addr()]
	w.mu.Unlock()
	if refuse {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	if !ok {
		<-ctx.Done()
		return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, w.echo)
}

func (w *wayRig) DialPod(ctx context.Context, pod service.PodRef, port uint16) (net.Conn, error) {
	w.mu.Lock()
	w.calls = append(w.calls, "apiserver "+pod.String()+" "+strconv.Itoa(int(port)))
	w.mu.Unlock()
	var d net.Dialer
	return d.DialContext(ctx, "tcp", w.echo)
}

func (w *wayRig) takeCalls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.calls
	w.calls = nil
	return c
}

var _ PodDialer = (*wayRig)(nil)

// newWayRig builds the rig with cfg's policy; pods names each endpoint's
// Pod ("" for none), routable the endpoints the host reaches.
func newWayRig(t *testing.T, cfg Config, pods map[string]string, routable ...string) *wayRig {
	t.Helper()
	ln, err := echoOn(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &wayRig{echo: ln.Addr().String(), clock: &wayClock{now: time.Unix(1e9, 0)}, routable: map[netip.Addr]bool{}, refusing: map[netip.Addr]bool{}}
	for _, a := range routable {
		w.routable[netip.MustParseAddr(a)] = true
	}
	cfg.Dialer, cfg.Clock = w, w.clock
	if cfg.Via != ViaDirect {
		cfg.PodDialer = w
	}
	cfg.DirectAttempt = 50 * time.Millisecond
	p, tr, ct := newTestProxyWith(t, cfg, true)
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 256).Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	st.SetFlowHandler(p)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		p.Shutdown(ctx)
		cancel()
		st.Close()
	})
	w.p, w.st = p, st
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80))
	tr.OnServiceAdd(svc("dns", "10.96.0.2", v1.ProtocolUDP, 53))
	tr.OnEndpointSliceAdd(podSlice("web", v1.ProtocolTCP, 8080, pods))
	tr.OnEndpointSliceAdd(podSlice("dns", v1.ProtocolUDP, 5353, pods))
	tr.OnSynced()
	return w
}

// podSlice is an EndpointSlice of svcName whose endpoints name their Pods
// (targetRef) as pods says.
func podSlice(svcName string, proto v1.Protocol, port int32, pods map[string]string) *discoveryv1.EndpointSlice {
	pn := "p"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: svcName + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Protocol: &proto, Port: &port}},
	}
	for addr, pod := range pods {
		e := discoveryv1.Endpoint{Addresses: []string{addr}}
		if pod != "" {
			e.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: pod}
		}
		es.Endpoints = append(es.Endpoints, e)
	}
	return es
}

// exchange opens one connection to the TCP service and echoes a byte; it
// returns the flow's listed way, or the dial's error.
func (w *wayRig) exchange(t *testing.T) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := w.st.DialContext(ctx, "tcp", "10.96.0.1:80")
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	expectExchange(t, c, c, "x")
	src := netip.MustParseAddrPort(c.LocalAddr().String())
	for _, e := range w.p.Conntrack().List(conntrack.Filter{}) {
		if e.Original.Src() == src {
			if v, ok := e.Owner.(interface{ Via() string }); ok {
				return v.Via(), nil
			}
			return "", nil
		}
	}
	t.Fatalf("no conntrack entry from %v", src)
	return "", nil
}

// TestDialViaAPIServer: with --dial-via apiserver every TCP flow goes
// through the pod dialer, none direct, and is listed via=apiserver; an
// endpoint that names no Pod is refused and counted; UDP is rejected at
// admission (pods/portforward carries TCP only).
func TestDialViaAPIServer(t *testing.T) {
	w := newWayRig(t, Config{Via: ViaAPIServer}, map[string]string{"198.51.100.1": "web-a"}, "198.51.100.1")
	for range 3 {
		via, err := w.exchange(t)
		if err != nil || via != "apiserver" {
			t.Fatalf("flow via %q, %v; want apiserver", via, err)
		}
	}
	if d := cmp.Diff([]string{"apiserver ns/web-a 8080", "apiserver ns/web-a 8080", "apiserver ns/web-a 8080"}, w.takeCalls()); d != "" {
		t.Errorf("dials (-want +got):\n%s", d)
	}
	s := w.p.Stats()
	if s.Dials[WayAPIServer].Count != 3 || s.Dials[WayDirect].Count != 0 {
		t.Errorf("dials per way %+v", s.Dials)
	}
	udp := conntrack.MakeTuple(conntrack.UDP, netip.MustParseAddrPort("10.0.0.9:4000"), netip.MustParseAddrPort("10.96.0.2:53"))
	if got := w.p.Admit(udp); got != netstack.Reject {
		t.Errorf("a UDP flow to endpoints only the API server reaches: %v, want Reject", got)
	}
	if n := w.p.Stats().Flows[1][ResultNoWay]; n != 1 {
		t.Errorf("UDP no_way_to_endpoint %d, want 1", n)
	}

	// An endpoint without a Pod: no way there.
	w2 := newWayRig(t, Config{Via: ViaAPIServer}, map[string]string{"198.51.100.7": ""}, "198.51.100.7")
	if _, err := w2.exchange(t); err == nil {
		t.Fatal("a flow to an endpoint with no Pod was proxied")
	}
	if n := w2.p.Stats().Flows[0][ResultNoWay]; n != 1 {
		t.Errorf("TCP no_way_to_endpoint %d, want 1", n)
	}
	if c := w2.takeCalls(); len(c) != 0 {
		t.Errorf("dials %v, want none", c)
	}
}

// TestDialViaAuto: the first flow to an endpoint the host reaches goes
// direct and the way is remembered; the first to one it does not reach
// pays one short direct attempt, then goes through the API server, and the
// next flows go there at once; when the memory expires the direct attempt
// is made again.
func TestDialViaAuto(t *testing.T) {
	w := newWayRig(t, Config{Via: ViaAuto, ViaMemory: time.Minute},
		map[string]string{"198.51.100.1": "web-a"}, "198.51.100.1")
	for i, want := range []string{"direct", "direct"} {
		if via, err := w.exchange(t); err != nil || via != want {
			t.Fatalf("flow %d via %q, %v; want %s", i, via, err, want)
		}
	}
	if d := cmp.Diff([]string{"direct 198.51.100.1:8080", "direct 198.51.100.1:8080"}, w.takeCalls()); d != "" {
		t.Errorf("routable endpoint's dials (-want +got):\n%s", d)
	}

	w = newWayRig(t, Config{Via: ViaAuto, ViaMemory: time.Minute},
		map[string]string{"198.51.100.2": "web-b"})
	start := time.Now()
	if via, err := w.exchange(t); err != nil || via != "apiserver" {
		t.Fatalf("first flow via %q, %v; want apiserver", via, err)
	}
	t.Logf("first flow to an unreachable endpoint set up in %v (direct attempt 50 ms)", time.Since(start).Round(time.Millisecond))
	for range 2 {
		if via, err := w.exchange(t); err != nil || via != "apiserver" {
			t.Fatalf("next flow via %q, %v; want apiserver", via, err)
		}
	}
	want := []string{"direct 198.51.100.2:8080", "apiserver ns/web-b 8080", "apiserver ns/web-b 8080", "apiserver ns/web-b 8080"}
	if d := cmp.Diff(want, w.takeCalls()); d != "" {
		t.Errorf("unreachable endpoint's dials (-want +got):\n%s", d)
	}
	if got := w.p.RememberedWays(); len(got) != 1 || got[0].Way != WayAPIServer {
		t.Errorf("remembered %+v", got)
	}
	// UDP to it: rejected at admission, since its only endpoint needs the
	// API server.
	udp := conntrack.MakeTuple(conntrack.UDP, netip.MustParseAddrPort("10.0.0.9:4000"), netip.MustParseAddrPort("10.96.0.2:53"))
	if got := w.p.Admit(udp); got != netstack.Reject {
		t.Errorf("UDP to an endpoint remembered as apiserver-only: %v, want Reject", got)
	}

	w.clock.advance(time.Minute)
	if via, err := w.exchange(t); err != nil || via != "apiserver" {
		t.Fatalf("flow after the memory expired via %q, %v", via, err)
	}
	want = []string{"direct 198.51.100.2:8080", "apiserver ns/web-b 8080"}
	if d := cmp.Diff(want, w.takeCalls()); d != "" {
		t.Errorf("after expiry, dials (-want +got):\n%s", d)
	}
}

// TestParseDialVia: the flag's three values, and an error naming a bad one.
func TestParseDialVia(t *testing.T) {
	for _, s := range []string{"direct", "apiserver", "auto"} {
		v, err := ParseDialVia(s)
		if err != nil || v.String() != s {
			t.Errorf("ParseDialVia(%q) = %v, %v", s, v, err)
		}
	}
	if _, err := ParseDialVia("tunnel"); err == nil {
		t.Error("ParseDialVia(tunnel) succeeded")
	}
	if _, err := New(Config{Via: ViaAPIServer}); err == nil {
		t.Error("New accepted apiserver without a PodDialer")
	}
}

// TestDialViaAutoAnswers: under auto, a refused direct dial is an answer
// (the address is routable: remembered as direct, no API server); an
// unanswered first attempt is a fallback, not a dial failure; a remembered
// direct address that stops answering is forgotten, so the next flow probes
// again; and a UDP flow to an unknown address with a Pod goes direct while
// a TCP probe of its port teaches the next ones.
func TestDialViaAutoAnswers(t *testing.T) {
	w := newWayRig(t, Config{Via: ViaAuto, ViaMemory: time.Minute, DialTimeout: 300 * time.Millisecond},
		map[string]string{"198.51.100.3": "web-c"})
	w.refusing[netip.MustParseAddr("198.51.100.3")] = true
	if _, err := w.exchange(t); err == nil {
		t.Fatal("a flow to a refusing endpoint was proxied")
	}
	if d := cmp.Diff([]string{"direct 198.51.100.3:8080"}, w.takeCalls()); d != "" {
		t.Errorf("refused endpoint's dials (-want +got):\n%s", d)
	}
	if got := w.p.RememberedWays(); len(got) != 1 || got[0].Way != WayDirect {
		t.Errorf("after a refusal, remembered %+v; want direct", got)
	}

	// Routable, remembered direct, then silent: forgotten, then the API
	// server once probed again.
	w2 := newWayRig(t, Config{Via: ViaAuto, ViaMemory: time.Minute, DialTimeout: 300 * time.Millisecond},
		map[string]string{"198.51.100.4": "web-d"}, "198.51.100.4")
	if via, err := w2.exchange(t); err != nil || via != "direct" {
		t.Fatalf("via %q, %v", via, err)
	}
	w2.mu.Lock()
	w2.routable = map[netip.Addr]bool{}
	w2.mu.Unlock()
	if _, err := w2.exchange(t); err == nil {
		t.Fatal("a flow to a remembered direct endpoint that went silent was proxied")
	}
	if got := w2.p.RememberedWays(); len(got) != 0 {
		t.Errorf("a silent direct endpoint still remembered: %+v", got)
	}
	if via, err := w2.exchange(t); err != nil || via != "apiserver" {
		t.Fatalf("next flow via %q, %v; want apiserver", via, err)
	}
	want := []string{"direct 198.51.100.4:8080", "direct 198.51.100.4:8080", "direct 198.51.100.4:8080", "apiserver ns/web-d 8080"}
	if d := cmp.Diff(want, w2.takeCalls()); d != "" {
		t.Errorf("dials (-want +got):\n%s", d)
	}
	s := w2.p.Stats()
	if s.Fallbacks != 1 || s.Dials[WayDirect].Failed != 1 || s.FlowsByWay[0][WayDirect] != 1 || s.FlowsByWay[0][WayAPIServer] != 1 {
		t.Errorf("fallbacks %d, direct failures %d, flows by way %v; want 1, 1 (the remembered one), [1 1]",
			s.Fallbacks, s.Dials[WayDirect].Failed, s.FlowsByWay[0])
	}

	// UDP to an address not yet known: admitted (direct), and probed.
	w3 := newWayRig(t, Config{Via: ViaAuto, ViaMemory: time.Minute}, map[string]string{"198.51.100.5": "web-e"})
	udp := conntrack.MakeTuple(conntrack.UDP, netip.MustParseAddrPort("10.0.0.9:4000"), netip.MustParseAddrPort("10.96.0.2:53"))
	if got := w3.p.Admit(udp); got != netstack.Accept {
		t.Fatalf("UDP to an unknown address: %v, want Accept (direct)", got)
	}
	waitUntil(t, "the probe to remember the API server", func() bool {
		r := w3.p.RememberedWays()
		return len(r) == 1 && r[0].Way == WayAPIServer
	})
	if d := cmp.Diff([]string{"direct 198.51.100.5:5353"}, w3.takeCalls()); d != "" {
		t.Errorf("probe (-want +got):\n%s", d)
	}
	if got := w3.p.Admit(udp); got != netstack.Reject {
		t.Errorf("UDP after the probe: %v, want Reject", got)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

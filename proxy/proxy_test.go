package proxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// The datapath scenarios (split, affinity, refusals, bulk, half-close,
// resets, UDP, IPv6) run in integration/, in-process and on a real TUN. The
// tests here cover the proxy's own decisions.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newTestProxy(t *testing.T) (*Proxy, *service.Tracker, *conntrack.Table) {
	t.Helper()
	return newTestProxyWith(t, Config{}, true)
}

// newTestProxyWith builds a proxy from cfg, runs it until the test ends if
// run is set, and feeds it from a tracker (synced by the caller).
func newTestProxyWith(t testing.TB, cfg Config, run bool) (*Proxy, *service.Tracker, *conntrack.Table) {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ct := p.Conntrack()
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); p.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	tr, err := service.NewTracker(service.Config{NodeName: "node-a", OnSync: p.SetTable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return p, tr, ct
}

func svc(name, ip string, proto v1.Protocol, port int32, mods ...func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "p", Protocol: proto, Port: port}}},
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func slice(svcName, name string, proto v1.Protocol, port int32, node string, addrs ...string) *discoveryv1.EndpointSlice {
	pn := "p"
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Protocol: &proto, Port: &port}},
	}
	for _, a := range addrs {
		n := node
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}, NodeName: &n})
	}
	return es
}

// Admit maps table verdicts to the gate's decisions as kube-proxy's rules do:
// REJECT for no service, unknown port and no endpoints; DROP for
// internalTrafficPolicy Local without local endpoints.
func TestAdmitDecisions(t *testing.T) {
	p, tr, _ := newTestProxy(t)
	local := v1.ServiceInternalTrafficPolicyLocal
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, 8080, "node-b", "10.0.0.1"))
	tr.OnServiceAdd(svc("empty", "10.96.0.2", v1.ProtocolTCP, 80))
	tr.OnServiceAdd(svc("local", "10.96.0.3", v1.ProtocolTCP, 80, func(s *v1.Service) { s.Spec.InternalTrafficPolicy = &local }))
	tr.OnEndpointSliceAdd(slice("local", "local-1", v1.ProtocolTCP, 8080, "node-b", "10.0.0.2"))

	client := netip.MustParseAddrPort("192.0.2.1:5000")
	tuple := func(proto conntrack.Protocol, dst string) conntrack.Tuple {
		return conntrack.MakeTuple(proto, client, netip.MustParseAddrPort(dst))
	}
	if got := p.Admit(tuple(conntrack.TCP, "10.96.0.1:80")); got != netstack.Reject {
		t.Fatalf("before the first table: %v, want Reject", got)
	}
	tr.OnSynced()
	cases := []struct {
		name string
		flow conntrack.Tuple
		want netstack.Decision
	}{
		{"forward", tuple(conntrack.TCP, "10.96.0.1:80"), netstack.Accept},
		{"not a ClusterIP", tuple(conntrack.TCP, "10.96.0.9:80"), netstack.Reject},
		{"unknown port", tuple(conntrack.TCP, "10.96.0.1:81"), netstack.Reject},
		{"TCP port probed with UDP", tuple(conntrack.UDP, "10.96.0.1:80"), netstack.Reject},
		{"no endpoints", tuple(conntrack.TCP, "10.96.0.2:80"), netstack.Reject},
		{"local policy, none local", tuple(conntrack.TCP, "10.96.0.3:80"), netstack.Drop},
	}
	for _, c := range cases {
		if got := p.Admit(c.flow); got != c.want {
			t.Errorf("%s: Admit = %v, want %v", c.name, got, c.want)
		}
	}
	s := p.Stats()
	if s.Flows[0][ResultRejectedNoService] != 3 || s.Flows[1][ResultRejectedNoService] != 1 ||
		s.Flows[0][ResultRejectedNoEndpoints] != 1 || s.Flows[0][ResultDroppedLocalPolicy] != 1 {
		t.Errorf("flow counters %+v", s.Flows)
	}
}

// TestAdmitUnusableSource: a flow from an address no reply can reach
// (0.0.0.0 from a namespace with loopback only, ::, multicast, broadcast,
// 0.0.0.0/8) is dropped, counted as dropped_unusable_source, and the
// warning saying what to do is logged once.
func TestAdmitUnusableSource(t *testing.T) {
	core, logs := observer.New(zapcore.WarnLevel)
	p, tr, _ := newTestProxyWith(t, Config{Logger: zap.New(core)}, true)
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, 8080, "node-b", "10.0.0.1"))
	tr.OnSynced()
	for _, src := range []string{"0.0.0.0:5000", "[::]:5000", "224.0.0.1:5000", "255.255.255.255:5000", "0.1.2.3:5000", "[ff02::1]:5000"} {
		dst := "10.96.0.1:80"
		if netip.MustParseAddrPort(src).Addr().Is6() {
			dst = "[fd00::1]:80"
		}
		if got := p.Admit(conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst))); got != netstack.Drop {
			t.Errorf("from %s: Admit = %v, want Drop", src, got)
		}
	}
	if got := p.Admit(conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort("192.0.2.1:5000"), netip.MustParseAddrPort("10.96.0.1:80"))); got != netstack.Accept {
		t.Errorf("from a usable address: Admit = %v, want Accept", got)
	}
	if n := p.Stats().Flows[0][ResultDroppedUnusableSource]; n != 6 {
		t.Errorf("dropped_unusable_source %d, want 6", n)
	}
	warned := logs.FilterMessageSnippet("no reply can reach")
	if warned.Len() != 1 || !strings.Contains(warned.All()[0].Message, "give one of its interfaces an address") {
		t.Errorf("warnings: %+v", logs.All())
	}
}

// A new table keeps the affinity state of unchanged service ports and drops
// the lists of endpoints that left.
func TestSetTableKeepsAffinityOfSurvivors(t *testing.T) {
	p, tr, _ := newTestProxy(t)
	affinity := func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, affinity))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, 8080, "", "10.0.0.1", "10.0.0.2"))
	tr.OnSynced()
	flow := conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort("192.0.2.1:5000"), netip.MustParseAddrPort("10.96.0.1:80"))
	pk, _ := p.route(service.TCP, flow)
	port, first := pk.port, pk.endpoint
	if port == nil {
		t.Fatal("no route")
	}
	if again, _ := p.route(service.TCP, flow); again.endpoint != first || !again.byAffinity {
		t.Fatalf("second pick %v (affinity %v), want %v by affinity", again.endpoint, again.byAffinity, first)
	}
	// Another service changes: web's picker, and its lists, survive.
	tr.OnServiceAdd(svc("other", "10.96.0.2", v1.ProtocolTCP, 80))
	if again, _ := p.route(service.TCP, flow); again.endpoint != first || !again.byAffinity {
		t.Fatal("affinity lost when another service changed")
	}
	// The client's endpoint leaves and comes back: its list is gone.
	keys := port.EndpointKeys
	firstKey := slices.Index(keys, first.String())
	kept := netip.MustParseAddrPort(keys[1-firstKey]).Addr().String()
	tr.OnEndpointSliceUpdate(nil, slice("web", "web-1", v1.ProtocolTCP, 8080, "", kept))
	tr.OnEndpointSliceUpdate(nil, slice("web", "web-1", v1.ProtocolTCP, 8080, "", "10.0.0.1", "10.0.0.2"))
	st := (*p.states.Load())[keyOf(port)]
	if got := st.picker.Affinity().Clients(keys[firstKey]); len(got) != 0 {
		t.Fatalf("list of the endpoint that left still holds %v", got)
	}
}

// The proxy's conntrack table gets a random hash seed unless one is given,
// so that clients cannot precompute tuples that collide in its index (issue
// 15, item 7: run and the embed example built their tables with seed 0).
func TestConntrackSeedIsRandom(t *testing.T) {
	a, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	sa, sb := a.Conntrack().HashSeed(), b.Conntrack().HashSeed()
	if sa == 0 || sb == 0 || sa == sb {
		t.Errorf("seeds %#x and %#x: want two different non-zero seeds", sa, sb)
	}
	c, err := New(Config{Conntrack: conntrack.Config{HashSeed: 42}})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Conntrack().HashSeed(); got != 42 {
		t.Errorf("a given seed became %d", got)
	}
	if _, err := New(Config{Conntrack: conntrack.Config{OnRemove: func(conntrack.EntryInfo, conntrack.RemoveReason) {}}}); err == nil {
		t.Error("New accepted an OnRemove of its own: the proxy's teardown would never run")
	}
}

// At most maxBulkBuffers 1 MiB copy buffers are out at once: flows whose
// clients stopped reading cannot pin more, and the budget comes back as
// buffers are returned.
func TestBulkBufferBudget(t *testing.T) {
	if n := bulkInUse.Load(); n != 0 {
		t.Fatalf("%d bulk buffers out before the test", n)
	}
	var got []*[]byte
	t.Cleanup(func() { // what a failure left out
		for _, bp := range got {
			if bp != nil {
				putBuf(bp)
			}
		}
	})
	for {
		bp := takeBulk()
		if bp == nil {
			break
		}
		if len(*bp) != bulkBuf {
			t.Fatalf("bulk buffer of %d bytes", len(*bp))
		}
		got = append(got, bp)
		if len(got) > maxBulkBuffers {
			t.Fatalf("more than %d bulk buffers handed out", maxBulkBuffers)
		}
	}
	if len(got) != maxBulkBuffers {
		t.Fatalf("%d bulk buffers handed out, want %d", len(got), maxBulkBuffers)
	}
	putBuf(got[0])
	if bp := takeBulk(); bp == nil {
		t.Fatal("no bulk buffer after one was returned")
	} else {
		got[0] = bp
	}
	for _, bp := range got {
		putBuf(bp)
	}
	got = nil
	if n := bulkInUse.Load(); n != 0 {
		t.Fatalf("%d bulk buffers out after all were returned", n)
	}
}

// A direction takes a bulk buffer when a read fills the small one, and gives
// it back as soon as a read does not fill the big one: a flow that goes
// quiet after a burst waits for its next bytes with the small buffer, while
// the flow stays open. The burst arrives in one piece over a pipe, so each
// read returns what one write sent.
func TestBulkBufferReturnedWhenIdle(t *testing.T) {
	if n := bulkInUse.Load(); n != 0 {
		t.Fatalf("%d bulk buffers out before the test", n)
	}
	srcR, srcW := net.Pipe()
	dstR, dstW := net.Pipe()
	s := &splice{client: dstW, backend: srcR, proxy: &Proxy{}}
	done := make(chan error, 1)
	go func() { done <- s.copy(dstW, srcR, 1) }()
	defer func() {
		_ = srcW.Close()
		_ = dstR.Close()
		<-done
	}()
	go func() { _, _ = io.Copy(io.Discard, dstR) }()

	send := func(n int) {
		t.Helper()
		if _, err := srcW.Write(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
	}
	waitBulk := func(want int64, what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for bulkInUse.Load() != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d bulk buffers out, want %d", what, bulkInUse.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	send(smallBuf) // fills the small buffer
	waitBulk(1, "after a read that filled the small buffer")
	send(bulkBuf) // fills the big one: it stays
	send(smallBuf + 1)
	waitBulk(0, "idle after a burst's last read of more than the small buffer")
}

package proxy

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/userproxy/userproxy/netstack"
)

// udpEcho answers each datagram with its own address, until closed.
func udpEcho(t *testing.T, addr string) net.PacketConn {
	t.Helper()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 512)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(pc.LocalAddr().String()), from)
		}
	}()
	t.Cleanup(func() { pc.Close(); <-done })
	return pc
}

// A UDP flow keeps its endpoint while that endpoint still serves — here it
// starts terminating while the other is ready, which takes it out of the
// usable set — and moves to a live endpoint once it stops serving (issue 15,
// item 4; kube-proxy pkg/proxy/conntrack/cleanup.go).
func TestUDPFlowSurvivesWhileItsEndpointServes(t *testing.T) {
	p, tr, ct := newTestProxy(t)
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 256).Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.SetFlowHandler(p)
	a, b := udpEcho(t, "127.0.0.1:0"), udpEcho(t, "127.0.0.2:0")
	portA, portB := int32(a.LocalAddr().(*net.UDPAddr).Port), int32(b.LocalAddr().(*net.UDPAddr).Port)
	// One slice per endpoint, so that each may have its own port.
	endpointSlice := func(name, addr string, port int32, cond discoveryv1.EndpointConditions) *discoveryv1.EndpointSlice {
		es := slice("dns", name, v1.ProtocolUDP, port, "", addr)
		es.Endpoints[0].Conditions = cond
		return es
	}
	yes, no := true, false
	ready := discoveryv1.EndpointConditions{}
	tr.OnServiceAdd(svc("dns", "10.96.0.53", v1.ProtocolUDP, 53))
	tr.OnEndpointSliceAdd(endpointSlice("dns-a", "127.0.0.1", portA, ready))
	tr.OnEndpointSliceAdd(endpointSlice("dns-b", "127.0.0.2", portB, ready))
	tr.OnSynced()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "udp", "10.96.0.53:53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func() string {
		t.Helper()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("?")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		return string(buf[:n])
	}
	first := ask()
	mine, mineAddr, mineSlice, mineConn := portA, "127.0.0.1", "dns-a", a
	if first == b.LocalAddr().String() {
		mine, mineAddr, mineSlice, mineConn = portB, "127.0.0.2", "dns-b", b
	}
	if first != mineConn.LocalAddr().String() {
		t.Fatalf("answer from %q", first)
	}

	// Terminating but serving: out of the usable set, the flow stays.
	tr.OnEndpointSliceUpdate(nil, endpointSlice(mineSlice, mineAddr, mine, discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}))
	for i := range 3 {
		if got := ask(); got != first {
			t.Fatalf("datagram %d after the endpoint started terminating went to %s, want %s (the flow was cut)", i, got, first)
		}
	}
	// No longer serving: the flow's entry goes, the next datagram is new
	// and reaches the other endpoint.
	tr.OnEndpointSliceUpdate(nil, endpointSlice(mineSlice, mineAddr, mine, discoveryv1.EndpointConditions{Ready: &no, Serving: &no, Terminating: &yes}))
	deadline := time.Now().Add(5 * time.Second)
	for got := ask(); got == first; got = ask() {
		if time.Now().After(deadline) {
			t.Fatal("the flow stayed on an endpoint that stopped serving")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// udpDatapath is a proxy serving 10.96.0.53:53 over UDP from one echo
// endpoint, with Run under the test's control.
func udpDatapath(t *testing.T) (*Proxy, *netstack.Stack, context.CancelFunc, chan struct{}) {
	t.Helper()
	p, tr, ct := newTestProxyWith(t, Config{}, false)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	// A flow set up before Run's poller is running relays on a goroutine
	// of its own, and Run's end does not end it: wait for the poller.
	for deadline := time.Now().Add(5 * time.Second); p.poller.Load() == nil; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Run's reply poller did not start")
		}
	}
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 256).Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.SetFlowHandler(p)
	a := udpEcho(t, "127.0.0.1:0")
	tr.OnServiceAdd(svc("dns", "10.96.0.53", v1.ProtocolUDP, 53))
	tr.OnEndpointSliceAdd(slice("dns", "dns-a", v1.ProtocolUDP, int32(a.LocalAddr().(*net.UDPAddr).Port), "", "127.0.0.1"))
	tr.OnSynced()
	return p, st, cancel, ran
}

func udpExchange(t *testing.T, st *netstack.Stack) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "udp", "10.96.0.53:53")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("?")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 64)); err != nil {
		t.Fatalf("no answer: %v", err)
	}
	return c
}

// Shutdown ends UDP flows at once, their conntrack entries with them, so
// that a late datagram cannot bring the flow back, and does not wait out
// its grace period for them.
func TestShutdownEndsUDPFlows(t *testing.T) {
	p, st, _, _ := udpDatapath(t)
	c := udpExchange(t, st)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if n := p.Shutdown(ctx); n != 0 {
		t.Errorf("Shutdown reset %d flows, want 0 (the UDP flow ends at its start)", n)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Shutdown took %v with only a UDP flow", took)
	}
	if n := p.Conntrack().Stats().EntriesUDP; n != 0 {
		t.Errorf("%d UDP entries left after Shutdown", n)
	}
	_, _ = c.Write([]byte("late"))
	time.Sleep(100 * time.Millisecond)
	if n := p.Flows(); n != 0 {
		t.Errorf("%d flows live after a late datagram", n)
	}
}

// When Run ends, the UDP flows whose replies its poller relayed end too:
// nothing would relay them any more.
func TestRunEndEndsPolledUDPFlows(t *testing.T) {
	p, st, cancel, ran := udpDatapath(t)
	udpExchange(t, st)
	waitFlows(t, p, 1)
	cancel()
	<-ran
	waitFlows(t, p, 0)
	if n := p.udpSessions.Load(); n != 0 {
		t.Errorf("%d UDP sessions counted after the flows ended", n)
	}
}

// An idle UDP flow holds no goroutine (issue 15, item 9: each held three,
// and two 64 KiB buffers, for its whole life): the client's datagrams go
// from the stack to the endpoint socket on the delivering goroutine, and
// the replies wait in the poller's one epoll set.
func TestIdleUDPFlowsHoldNoGoroutine(t *testing.T) {
	p, st, _, _ := udpDatapath(t)
	udpExchange(t, st) // the poller and the stack's goroutines are up
	waitFlows(t, p, 1)
	time.Sleep(50 * time.Millisecond)
	before := runtime.NumGoroutine()
	const flows = 50
	for range flows {
		udpExchange(t, st)
	}
	waitFlows(t, p, flows+1)
	time.Sleep(50 * time.Millisecond)
	after := runtime.NumGoroutine()
	t.Logf("goroutines: %d before, %d with %d more idle UDP flows", before, after, flows)
	if after-before >= flows/5 {
		t.Errorf("%d more goroutines for %d idle UDP flows, want none per flow", after-before, flows)
	}
}

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

func TestMain(m *testing.M) {
	for env, main := range childMains {
		if os.Getenv(env) != "" {
			os.Exit(main())
		}
	}
	goleak.VerifyTestMain(removeBinaries{m})
}

// childMains are the mains of the processes the tests start from their own
// binary, by the environment variable that selects each.
var childMains = map[string]func() int{}

// removeBinaries removes the binaries the tests built (userproxyBinary)
// once they have run.
type removeBinaries struct{ m *testing.M }

func (r removeBinaries) Run() int {
	code := r.m.Run()
	removeBuiltBinaries()
	return code
}

// translateTCP runs the rig's TCP flows through the translator
// (netstack/translate.go), as the binary does by default (--tcp-translate);
// USERPROXY_TCP_TRANSLATE=0, the flag's environment default, turns both to
// gVisor's TCP for a whole run of the suite.
// On a kernel without SO_PEEK_OFF for TCP it is off, as the binary turns
// it off.
var translateTCP = os.Getenv("USERPROXY_TCP_TRANSLATE") != "0" && proxy.TranslateSupported() == nil

// portableTUN opens the suite's TUN devices the portable way, as macOS
// must (netstack.TUNOptions.Portable; the binary's --tun-portable):
// USERPROXY_TUN=portable, the flag's environment default, runs the whole
// suite through that path.
var portableTUN = os.Getenv("USERPROXY_TUN") == "portable"

// testSeed returns USERPROXY_SEED if set, else def, and logs it.
func testSeed(t testing.TB, def uint64) uint64 {
	t.Helper()
	seed := def
	if s := os.Getenv("USERPROXY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("USERPROXY_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (set USERPROXY_SEED to repeat)", seed)
	return seed
}

// rig is the whole datapath over one link: the stack with its gate, the
// proxy, conntrack, and a service tracker that feeds the proxy. Endpoints are
// real sockets on loopback in the test's own network namespace.
type rig struct {
	t       testing.TB
	ct      *conntrack.Table
	st      *netstack.Stack
	px      *proxy.Proxy
	tracker *service.Tracker
}

func newRig(t testing.TB, link *netstack.Link, seed uint64) *rig {
	return newRigWith(t, link, seed, rigLimits{})
}

// rigLimits overrides the datapath's limits; zero fields keep the defaults.
type rigLimits struct {
	conntrackMax, udpSessions, inFlight, inFlightPerClient int
	// clock drives conntrack (nil: the proxy's own coarse clock).
	clock conntrack.Clock
}

func newRigWith(t testing.TB, link *netstack.Link, seed uint64, lim rigLimits) *rig {
	t.Helper()
	h := &rig{t: t}
	var err error
	h.px, err = proxy.New(proxy.Config{Conntrack: conntrack.Config{Max: lim.conntrackMax, Clock: lim.clock}, Rand: balancer.NewSeededSource(seed),
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)), DialTimeout: 2 * time.Second, MaxUDPSessions: lim.udpSessions})
	if err != nil {
		t.Fatal(err)
	}
	h.ct = h.px.Conntrack()
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); h.px.Run(runCtx) }()
	h.st, err = netstack.New(netstack.Options{Link: link, Conntrack: h.ct, Reassembler: h.px.Reassembler(), Admit: h.px.Admit, Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel)),
		MaxInFlight: lim.inFlight, MaxInFlightPerClient: lim.inFlightPerClient, TranslateTCP: translateTCP})
	if err != nil {
		t.Fatal(err)
	}
	h.st.SetFlowHandler(h.px)
	h.tracker, err = service.NewTracker(service.Config{NodeName: "node-a", OnSync: h.px.SetTable})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		h.st.Close()
		h.tracker.Close()
		stopRun()
		<-ran
	})
	h.tracker.OnSynced()
	return h
}

// addService adds a ClusterIP service with one port and one EndpointSlice
// per endpoint (so endpoints may differ in port).
func (h *rig) addService(name, clusterIP string, proto v1.Protocol, port int32, affinity bool, endpoints ...netip.AddrPort) {
	h.t.Helper()
	svc := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: v1.ServiceSpec{
			Type:       v1.ServiceTypeClusterIP,
			ClusterIP:  clusterIP,
			ClusterIPs: []string{clusterIP},
			Ports:      []v1.ServicePort{{Name: "p", Protocol: proto, Port: port, TargetPort: intstr.FromString("p")}},
		},
	}
	if affinity {
		svc.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	}
	h.tracker.OnServiceAdd(svc)
	for i, ep := range endpoints {
		at := discoveryv1.AddressTypeIPv4
		if ep.Addr().Is6() {
			at = discoveryv1.AddressTypeIPv6
		}
		pn, pp := "p", int32(ep.Port())
		h.tracker.OnEndpointSliceAdd(&discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("%s-%d", name, i),
				Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: at,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ep.Addr().String()}}},
			Ports:       []discoveryv1.EndpointPort{{Name: &pn, Protocol: &proto, Port: &pp}},
		})
	}
	if h.tracker.Current() == nil {
		h.t.Fatal("no table after adding a service")
	}
}

// removeSlice deletes the i-th EndpointSlice of a service added by
// addService.
func (h *rig) removeSlice(name string, i int) {
	h.tracker.OnEndpointSliceDelete(&discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("%s-%d", name, i),
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
	})
}

// tcpBackend is an endpoint: a listener on loopback serving each connection
// with serve, until the test ends.
type tcpBackend struct {
	ln    net.Listener
	addr  netip.AddrPort
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{} // open connections, closed by stop
	done  bool                  // stop ran: close what is accepted late
}

func startTCPBackend(t testing.TB, host string, serve func(net.Conn)) *tcpBackend {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	return serveTCP(t, ln, serve)
}

// serveTCP serves each connection of ln with serve until the test ends.
func serveTCP(t testing.TB, ln net.Listener, serve func(net.Conn)) *tcpBackend {
	b := &tcpBackend{ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort(), conns: map[net.Conn]struct{}{}}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			if b.done {
				b.mu.Unlock()
				c.Close()
				return
			}
			b.conns[c] = struct{}{}
			b.mu.Unlock()
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				defer func() {
					b.mu.Lock()
					delete(b.conns, c)
					b.mu.Unlock()
					c.Close()
				}()
				serve(c)
			}()
		}
	}()
	t.Cleanup(b.stop)
	return b
}

// stop closes the listener and waits for the connection handlers; a test
// calls it to wait for its endpoint to finish. Handlers still running after
// 10 s (a failed test can leave clients that never close their
// connections) get their connections closed, so that stop always returns.
func (b *tcpBackend) stop() {
	_ = b.ln.Close()
	finished := make(chan struct{})
	go func() { // waits for the handlers
		b.wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
		return
	case <-time.After(10 * time.Second):
	}
	b.mu.Lock()
	b.done = true
	for c := range b.conns {
		_ = c.Close()
	}
	b.mu.Unlock()
	<-finished
}

// serveUDP answers every datagram pc receives with reply(datagram), until
// the test ends, and returns pc's address.
func serveUDP(t testing.TB, pc net.PacketConn, reply func([]byte) []byte) netip.AddrPort {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(reply(buf[:n]), from)
		}
	}()
	t.Cleanup(func() { pc.Close(); wg.Wait() })
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// echoPrefixed replies "echo:" and the datagram.
func echoPrefixed(b []byte) []byte { return append([]byte("echo:"), b...) }

// nameServer writes name and closes.
func nameServer(name string) func(net.Conn) {
	return func(c net.Conn) { _, _ = io.WriteString(c, name) }
}

// closedPort returns a loopback TCP port nothing listens on.
func closedPort(t testing.TB) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return ap
}

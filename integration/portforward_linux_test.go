//go:build linux

package integration

// A laptop that cannot route to its pods (root): etcd, kube-apiserver, a
// fake kubelet serving the port-forward API for Node "node-1", and
// `userproxy run --kubeconfig` (default --dial-via auto) share namespace U;
// the pods' addresses lead over a veth to namespace B, where only
// 198.51.100.1 answers (the others are dropped there: a route that goes
// nowhere, as on a laptop). The kubelet forwards each stream to a backend
// on U's loopback, as the real one forwards into the pod.
//
//	U: etcd, kube-apiserver, kubelet (127.0.0.1)          B: lo 198.51.100.1 (pod d, direct)
//	   userproxy run --kubeconfig, TUN
//	   backends of pods a, b, c, z, d on 127.0.0.1
//	   up0 203.0.113.1/24 ═══════ veth ═══════ bp0 203.0.113.254/24
//	   198.51.100.0/24 via 203.0.113.254

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/internal/stats"
)

// pfTopo is the laptop of this file's diagram.
type pfTopo struct {
	t       testing.TB
	u       *binNS
	cluster *kubeapi.Cluster
	cs      kubernetes.Interface
	ns      string

	mu       sync.Mutex
	kubelet  *kubeapi.Kubelet
	kport    int
	backends map[string]string // pod -> its backend on U's loopback
	proc     *proc
}

// pfPods are the pods of Service web: unroutable from U.
var pfPods = []struct {
	name string
	ip   netip.Addr
}{
	{"web-a", netip.MustParseAddr("198.51.100.11")},
	{"web-b", netip.MustParseAddr("198.51.100.12")},
	{"web-c", netip.MustParseAddr("198.51.100.13")},
}

const pfPort = 8080

// nameEcho writes name and a newline, then echoes until EOF.
func nameEcho(name string) func(net.Conn) {
	return func(c net.Conn) {
		if _, err := io.WriteString(c, name+"\n"); err != nil {
			return
		}
		_, _ = io.Copy(c, c)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}
}

func newPFTopo(t *testing.T, extraArgs ...string) *pfTopo {
	requireRoot(t)
	bins := requireKubeBinaries(t)
	bin := userproxyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	u := newBinNS(t)
	bNS, bName := newNetNS(t)
	if err := inNS(bNS, func() error {
		lo, err := linkUp("lo")
		if err != nil {
			return err
		}
		return addAddr(lo, netip.PrefixFrom(diffBackend(0), 32))
	}); err != nil {
		t.Fatalf("namespace %s: %v", bName, err)
	}
	link := vethSpec{local: "up0", peer: "bp0",
		localAddr: netip.MustParsePrefix("203.0.113.1/24"), peerAddr: netip.MustParsePrefix("203.0.113.254/24"),
		routes: []netip.Prefix{diffEPNet}}
	if err := link.create(u.ns, bNS); err != nil {
		t.Fatal(err)
	}
	back := &nsClient{ns: bNS, work: make(chan func())}
	startWorkers(t, back)
	var ln net.Listener
	if err := back.run(func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(diffBackend(0), pfPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	serveTCP(t, ln, nameEcho("d"))

	tp := &pfTopo{t: t, u: u, backends: map[string]string{}}
	for _, name := range []string{"web-a", "web-b", "web-c", "web-z", "web-d"} {
		var l net.Listener
		if err := u.c.run(func() (err error) { l, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
			t.Fatal(err)
		}
		who := strings.TrimPrefix(name, "web-")
		if name == "web-d" {
			who = "d-through-the-api-server"
		}
		tp.backends[name] = serveTCP(t, l, nameEcho(who)).addr.String()
	}

	dir, err := os.MkdirTemp("/dev/shm", "upx-pf-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	tp.cluster, err = kubeapi.Start(ctx, kubeapi.Config{
		Binaries: bins, Dir: dir, Wrap: []string{"ip", "netns", "exec", u.name},
		Dial: func(_ context.Context, network, addr string) (net.Conn, error) { return u.c.dial(network, addr) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log ends:\n%s", tp.cluster.LogTail("kube-apiserver", 20))
		}
		tp.cluster.Stop()
	})
	if tp.cs, err = tp.cluster.Client(); err != nil {
		t.Fatal(err)
	}
	tp.startKubelet(0)
	t.Cleanup(func() {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		tp.kubelet.Close()
	})
	if err := kubeapi.RegisterNode(ctx, tp.cs, "node-1", tp.kport); err != nil {
		t.Fatal(err)
	}
	tp.ns = "default"
	for _, p := range append(pfPods[:len(pfPods):len(pfPods)], struct {
		name string
		ip   netip.Addr
	}{"web-z", netip.MustParseAddr("198.51.100.14")}, struct {
		name string
		ip   netip.Addr
	}{"web-d", diffBackend(0)}) {
		if _, err := kubeapi.CreatePod(ctx, tp.cs, tp.ns, p.name, "node-1", p.ip, pfPort); err != nil {
			t.Fatal(err)
		}
	}
	args := append([]string{"ip", "netns", "exec", u.name, bin, "run", "--kubeconfig", tp.cluster.Kubeconfig(),
		"--tun-name", "upxp0", "--service-cidr", kubeapi.ServiceCIDRs[0].String(), "--min-sync-period", "0",
		"--node-name", "laptop", "--log-format", "json", "--log-level", "info"}, extraArgs...)
	tp.proc = startProc(t, args...)
	u.waitHealthy(tp.proc)
	return tp
}

// startKubelet starts the fake kubelet in U, on port (0: any).
func (tp *pfTopo) startKubelet(port int) {
	tp.t.Helper()
	var ln net.Listener
	if err := tp.u.c.run(func() (err error) {
		ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		return err
	}); err != nil {
		tp.t.Fatal(err)
	}
	k, err := kubeapi.StartKubelet(kubeapi.KubeletConfig{
		Listener: ln,
		Backend: func(namespace, pod string, p int32) (string, bool) {
			addr, ok := tp.backends[pod]
			return addr, ok && namespace == tp.ns && p == pfPort
		},
		Dial: func(_ context.Context, network, addr string) (net.Conn, error) { return tp.u.c.dial(network, addr) },
	})
	if err != nil {
		tp.t.Fatal(err)
	}
	tp.mu.Lock()
	tp.kubelet, tp.kport = k, k.Port()
	tp.mu.Unlock()
}

// service creates Service name (port 80 -> pfPort, protocol proto) and its
// EndpointSlice of pods, with the Pods as targetRefs; it returns the
// ClusterIP.
func (tp *pfTopo) service(name string, proto v1.Protocol, pods ...string) netip.Addr {
	tp.t.Helper()
	ctx := context.Background()
	svc, err := tp.cs.CoreV1().Services(tp.ns).Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1.ServiceSpec{Ports: []v1.ServicePort{{Name: "p", Protocol: proto, Port: 80, TargetPort: intstr.FromInt32(pfPort)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		tp.t.Fatal(err)
	}
	port, pn, ready := int32(pfPort), "p", true
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name + "-1", Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port, Protocol: &proto}},
	}
	for _, pod := range pods {
		p, err := tp.cs.CoreV1().Pods(tp.ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			tp.t.Fatal(err)
		}
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.Status.PodIP},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}, NodeName: &p.Spec.NodeName,
			TargetRef: &v1.ObjectReference{Kind: "Pod", Namespace: tp.ns, Name: pod, UID: p.UID}})
	}
	if _, err := tp.cs.DiscoveryV1().EndpointSlices(tp.ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		tp.t.Fatal(err)
	}
	return netip.MustParseAddr(svc.Spec.ClusterIP)
}

// open connects to vip:80 from U and reads the endpoint's name line.
func (tp *pfTopo) open(vip netip.Addr) (net.Conn, *bufio.Reader, string, error) {
	c, err := tp.u.c.dial("tcp", netip.AddrPortFrom(vip, 80).String())
	if err != nil {
		return nil, nil, "", err
	}
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		c.Close()
		return nil, nil, "", err
	}
	return c, r, strings.TrimSpace(name), nil
}

// conntrackVia returns the via= of the listed TCP flows per endpoint IP.
func (tp *pfTopo) conntrackVia() map[string][]string {
	tp.t.Helper()
	_, body, err := tp.u.get("/debug/conntrack")
	if err != nil {
		tp.t.Fatal(err)
	}
	out := map[string][]string{}
	for _, l := range strings.Split(body, "\n") {
		f := strings.Fields(l)
		var dsts []string
		via := ""
		for _, w := range f {
			if v, ok := strings.CutPrefix(w, "dst="); ok {
				dsts = append(dsts, v)
			}
			if v, ok := strings.CutPrefix(w, "via="); ok {
				via = v
			}
		}
		if len(dsts) == 2 && strings.HasPrefix(l, "tcp") {
			// the reply tuple's source is the endpoint: src= second
			srcs := []string{}
			for _, w := range f {
				if v, ok := strings.CutPrefix(w, "src="); ok {
					srcs = append(srcs, v)
				}
			}
			out[srcs[1]] = append(out[srcs[1]], via)
		}
	}
	return out
}

// TestBinaryDialViaAPIServer: ClusterIPs whose pods the host cannot route to
// are reached through the API server's pods/portforward and the kubelet,
// with the lottery, conntrack and a clean reset when the kubelet dies;
// auto picks direct where the address answers.
func TestBinaryDialViaAPIServer(t *testing.T) {
	tp := newPFTopo(t)
	web := tp.service("web", v1.ProtocolTCP, "web-a", "web-b", "web-c")
	waitFor(t, "the ClusterIP of web to answer", func() bool {
		c, _, _, err := tp.open(web)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// 1. The lottery over the three pods, every flow through the API server.
	const n = 300
	counts := map[string]int{}
	start := time.Now()
	for range n {
		c, _, name, err := tp.open(web)
		if err != nil {
			t.Fatal(err)
		}
		counts[name]++
		c.Close()
	}
	perConn := time.Since(start) / n
	obs := []int{counts["a"], counts["b"], counts["c"]}
	gof, err := stats.GoodnessOfFit(obs, stats.Uniform(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d connections through the API server: a/b/c %v, %v (%v per connection, sequential)", n, obs, gof, perConn.Round(time.Microsecond))
	if obs[0]+obs[1]+obs[2] != n || gof.P < 0.001 {
		t.Errorf("split %v (%v): not the lottery's uniform split", counts, gof)
	}

	// 2. 100 connections at once: one tunnel per pod.
	tp.mu.Lock()
	k := tp.kubelet
	tp.mu.Unlock()
	streams0 := sumCounts(k.Streams())
	var conns []net.Conn
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 100 {
		wg.Go(func() {
			c, r, name, err := tp.open(web)
			if err != nil {
				errs <- err
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			if _, err := io.WriteString(c, "ping "+name+"\n"); err != nil {
				errs <- err
				return
			}
			if got, err := r.ReadString('\n'); err != nil || got != "ping "+name+"\n" {
				errs <- fmt.Errorf("echo %q, %v", got, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tunnels := k.Tunnels()
	via := tp.conntrackVia()
	t.Logf("100 concurrent connections: tunnels opened per pod %v, open now %d, streams +%d", tunnels, k.OpenTunnels(), sumCounts(k.Streams())-streams0)
	for _, p := range pfPods {
		if got := tunnels[tp.ns+"/"+p.name]; got != 1 {
			t.Errorf("pod %s: %d tunnels opened, want 1 for all its flows", p.name, got)
		}
		for _, v := range via[p.ip.String()] {
			if v != "apiserver" {
				t.Errorf("a flow to %s listed via=%q, want apiserver", p.ip, v)
			}
		}
	}
	if got := sumCounts(k.Streams()) - streams0; got != 100 {
		t.Errorf("the kubelet served %d streams for 100 connections", got)
	}
	if got := len(via["198.51.100.11"]) + len(via["198.51.100.12"]) + len(via["198.51.100.13"]); got < 100 {
		t.Errorf("conntrack lists %d flows to the pods, want the 100 open", got)
	}
	for _, c := range conns {
		c.Close()
	}

	// 3. 16 MiB each way, intact.
	c, _, name, err := tp.open(web)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	const size = 16 << 20
	sent := make(chan []byte, 1)
	go func() {
		h := sha256.New()
		_, _ = io.Copy(io.MultiWriter(c, h), io.LimitReader(rand.Reader, size))
		_ = c.(*net.TCPConn).CloseWrite()
		sent <- h.Sum(nil)
	}()
	start = time.Now()
	h := sha256.New()
	got, err := io.Copy(h, c)
	took := time.Since(start)
	c.Close()
	if err != nil || got != size || !bytes.Equal(h.Sum(nil), <-sent) {
		t.Fatalf("16 MiB echoed through pod %s: %d bytes, %v, same SHA-256 %v", name, got, err, got == size)
	}
	t.Logf("16 MiB each way through pod %s and the API server intact in %v", name, took.Round(time.Millisecond))

	// 4. The kubelet dies mid-flow: the client is reset; once it is back
	// on its port the next connection succeeds.
	c, r, _, err := tp.open(web)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(c, "before\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	port := tp.kport
	k.Kill()
	killed := time.Now()
	_ = c.SetDeadline(time.Now().Add(40 * time.Second))
	_, err = r.ReadString('\n')
	t.Logf("the client's read after the kubelet died, %v later: %v", time.Since(killed).Round(time.Millisecond), err)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("the client's flow ended with %v, want a reset", err)
	}
	c.Close()
	k.Close()
	tp.startKubelet(port)
	waitWithin(t, 30*time.Second, "a connection through the restarted kubelet", func() bool {
		c, r, _, err := tp.open(web)
		if err != nil {
			return false
		}
		defer c.Close()
		if _, err := io.WriteString(c, "after\n"); err != nil {
			return false
		}
		got, err := r.ReadString('\n')
		return err == nil && got == "after\n"
	})

	// 5. auto: direct where the address answers, the API server where not.
	mixed := tp.service("mixed", v1.ProtocolTCP, "web-d", "web-z")
	waitFor(t, "the ClusterIP of mixed to answer", func() bool {
		c, _, _, err := tp.open(mixed)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	names := map[string]int{}
	for range 40 {
		c, _, name, err := tp.open(mixed)
		if err != nil {
			t.Fatal(err)
		}
		names[name]++
		c.Close()
	}
	t.Logf("mixed, 40 connections: %v", names)
	if names["d"] == 0 || names["z"] == 0 || len(names) != 2 {
		t.Errorf("mixed answered %v: want d directly (not d-through-the-api-server) and z through the API server", names)
	}
	_, dial, err := tp.u.get("/debug/dial")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("/debug/dial:\n%s", dial)
	for _, want := range []string{"dial-via auto", "198.51.100.1 direct", "198.51.100.14 apiserver", "198.51.100.11 apiserver"} {
		if !strings.Contains(dial, want) {
			t.Errorf("/debug/dial lacks %q", want)
		}
	}

	// 6. UDP to a pod only the API server reaches: ICMP port unreachable.
	dns := tp.service("dns-u", v1.ProtocolUDP, "web-a")
	// (Refused before its EndpointSlice arrives too, for want of endpoints:
	// so until the refusal counts as no way to the endpoint.)
	waitFor(t, "the UDP service to be refused for want of a way to its pod", func() bool {
		pc, err := tp.u.c.dial("udp", netip.AddrPortFrom(dns, 80).String())
		if err != nil {
			return false
		}
		defer pc.Close()
		_ = pc.SetDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = pc.Write([]byte("q"))
		_, err = pc.Read(make([]byte, 16))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return false
		}
		_, m, err := tp.u.get("/metrics")
		return err == nil && metricValue(m, `userproxy_flows_total{protocol="udp",result="no_way_to_endpoint"}`) > 0
	})
	_, metrics, err := tp.u.get("/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{
		`userproxy_flows_total{protocol="udp",result="no_way_to_endpoint"}`,
		`userproxy_dial_duration_seconds_count{way="apiserver"}`,
		`userproxy_dial_duration_seconds_count{way="direct"}`,
		`userproxy_apiserver_tunnel_events_total{event="broken"}`,
	} {
		if v := metricValue(metrics, m); v < 1 {
			t.Errorf("%s = %v, want > 0", m, v)
		}
	}
	if err := tp.proc.stop(t); err != nil {
		t.Fatalf("userproxy exit: %v", err)
	}
}

func sumCounts(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

//go:build linux

package integration

// The real binary against a real API server (root): etcd, kube-apiserver and
// `userproxy run --kubeconfig` share a namespace U (all on U's loopback, the
// TUN there); the endpoints live in a namespace B behind a veth. A Service
// created through the API gets its ClusterIP from the API server, and a
// client in U connects to it.
//
//	U: etcd, kube-apiserver on 127.0.0.1     B: lo 198.51.100.1, .2 (endpoints :8080)
//	   userproxy run --kubeconfig, TUN
//	   uk0 203.0.113.1/24 ═════ veth ═════ bk0 203.0.113.254/24
//	   198.51.100.0/24 via 203.0.113.254

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/userproxy/userproxy/integration/kubeapi"
)

// requireKubeBinaries returns etcd and kube-apiserver; without them the test
// skips, or fails under CI.
func requireKubeBinaries(t *testing.T) kubeapi.Binaries {
	t.Helper()
	b, err := kubeapi.FindBinaries()
	if err == nil {
		return b
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("CI must run the API server tests: %v", err)
	}
	t.Skip(err)
	return b
}

// kubeAPIRig is the topology above: U with the control plane and a client,
// B with the endpoints a and b (diffBackend(0), (1) on diffTCPPort).
type kubeAPIRig struct {
	uName   string
	u       *binNS
	cluster *kubeapi.Cluster
	cs      kubernetes.Interface
	dir     string
}

// startKubeAPIRig builds the namespaces, the endpoints (serve gives each
// endpoint's handler by its name) and the control plane.
func startKubeAPIRig(t *testing.T, ctx context.Context, serve func(name string) func(net.Conn)) *kubeAPIRig {
	requireRoot(t)
	bins := requireKubeBinaries(t)

	// The namespaces, the veth, the endpoints.
	uNS, uName := newNetNS(t)
	bNS, bName := newNetNS(t)
	if err := inNS(bNS, func() error {
		lo, err := linkUp("lo")
		if err != nil {
			return err
		}
		for i := range 2 {
			if err := addAddr(lo, netip.PrefixFrom(diffBackend(i), 32)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("backends namespace %s: %v", bName, err)
	}
	link := vethSpec{
		local: "uk0", peer: "bk0",
		localAddr: netip.MustParsePrefix("203.0.113.1/24"), peerAddr: netip.MustParsePrefix("203.0.113.254/24"),
		routes: []netip.Prefix{diffEPNet},
	}
	if err := link.create(uNS, bNS); err != nil {
		t.Fatalf("veth between %s and %s: %v", uName, bName, err)
	}
	uc := &nsClient{ns: uNS, work: make(chan func())}
	startWorkers(t, uc)
	back := &nsClient{ns: bNS, work: make(chan func())}
	startWorkers(t, back)
	for i, name := range []string{"a", "b"} {
		var ln net.Listener
		if err := back.run(func() (err error) {
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(diffBackend(i), diffTCPPort).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		serveTCP(t, ln, serve(name))
	}

	// The control plane, inside U.
	dir, err := os.MkdirTemp("/dev/shm", "upx-kubeapi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	start := time.Now()
	cluster, err := kubeapi.Start(ctx, kubeapi.Config{
		Binaries: bins, Dir: dir, Wrap: []string{"ip", "netns", "exec", uName},
		Dial: func(_ context.Context, network, addr string) (net.Conn, error) { return uc.dial(network, addr) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube-apiserver log ends:\n%s", cluster.LogTail("kube-apiserver", 30))
		}
		cluster.Stop()
	})
	t.Logf("etcd and kube-apiserver ready in %s in %v", uName, time.Since(start).Round(time.Millisecond))
	cs, err := cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	return &kubeAPIRig{uName: uName, u: &binNS{t: t, ns: uNS, name: uName, c: uc}, cluster: cluster, cs: cs, dir: dir}
}

// createTCPService creates the Service name in default with one TCP port
// to diffTCPPort, and returns its ClusterIP:port, which the API server
// picked.
func createTCPService(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, portName string, port int32) string {
	t.Helper()
	svc, err := cs.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.ServiceSpec{Ports: []v1.ServicePort{
			{Name: portName, Protocol: v1.ProtocolTCP, Port: port, TargetPort: intstr.FromInt32(diffTCPPort)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), uint16(port)).String()
}

func TestBinaryKubeAPIServer(t *testing.T) {
	bin := userproxyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rig := startKubeAPIRig(t, ctx, nameServer)
	uName, cluster, cs, u := rig.uName, rig.cluster, rig.cs, rig.u
	var err error

	// A Service; the API server picks its ClusterIP.
	vip := createTCPService(t, ctx, cs, "web", "http", 80)
	slice := func(i int) *discoveryv1.EndpointSlice {
		port, proto, ready := int32(diffTCPPort), v1.ProtocolTCP, true
		name := "http"
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{diffBackend(i).String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
			Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
		}
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, slice(0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The binary, watching the API server.
	p := startProc(t, "ip", "netns", "exec", uName, bin, "run", "--kubeconfig", cluster.Kubeconfig(),
		"--tun-name", "upxk0", "--service-cidr", kubeapi.ServiceCIDRs[0].String(), "--min-sync-period", "0",
		"--node-name", "node-a", "--log-format", "json", "--log-level", "info")
	u.waitHealthy(p)
	fetch := func() string {
		got, err := u.fetchName(vip)
		if err != nil {
			return err.Error()
		}
		return got
	}
	waitFor(t, "the ClusterIP "+vip+" to reach endpoint a", func() bool { return fetch() == "a" })

	// A second ServiceCIDR outside --service-cidr, as a k3s range: the
	// proxy routes it into the TUN, and a Service given a ClusterIP in it
	// answers.
	if _, err := cs.NetworkingV1().ServiceCIDRs().Create(ctx, &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: "extra"},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"10.43.0.0/16"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a route for the cluster's ServiceCIDR 10.43.0.0/16 into the TUN", func() bool {
		out, _ := exec.Command("ip", "netns", "exec", uName, "ip", "route", "show", "10.43.0.0/16").Output()
		return strings.Contains(string(out), "dev upxk0")
	})
	if _, err := cs.CoreV1().Services("default").Create(ctx, &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "k3s-web"},
		Spec: v1.ServiceSpec{ClusterIP: "10.43.0.20", Ports: []v1.ServicePort{
			{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(diffTCPPort)},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k3s := slice(0)
	k3s.Name, k3s.Labels[discoveryv1.LabelServiceName] = "k3s-web-1", "k3s-web"
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, k3s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ClusterIP 10.43.0.20:80 in the second ServiceCIDR to reach endpoint a", func() bool {
		got, err := u.fetchName("10.43.0.20:80")
		return err == nil && got == "a"
	})
	if code, body, _ := u.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz with a ClusterIP in the cluster's second ServiceCIDR: %d %s", code, body)
	}

	// The endpoint moves.
	cur, err := cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next := slice(1)
	next.ResourceVersion = cur.ResourceVersion
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ClusterIP to reach endpoint b", func() bool { return fetch() == "b" })

	// The API server crashes: /healthz reports it, the last table serves on.
	cluster.KillAPIServer()
	var health string
	waitWithin(t, 30*time.Second, "/healthz to report the API server outage", func() bool {
		code, body, _ := u.get("/healthz")
		health = body
		return code == http.StatusServiceUnavailable && strings.Contains(body, "source:")
	})
	t.Logf("/healthz during the outage: %s", strings.TrimSpace(health))
	if got := fetch(); got != "b" {
		t.Fatalf("during the outage the ClusterIP answers %q, want b (the last table)", got)
	}

	// It comes back: healthy again, and changes flow.
	if err := cluster.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	// The informers back off while the server is away: up to ~30 s.
	waitWithin(t, time.Minute, "/healthz to recover", func() bool { code, _, _ := u.get("/healthz"); return code == http.StatusOK })
	cs, err = cluster.Client()
	if err != nil {
		t.Fatal(err)
	}
	cur, err = cs.DiscoveryV1().EndpointSlices("default").Get(ctx, "web-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	next = slice(0)
	next.ResourceVersion = cur.ResourceVersion
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Update(ctx, next, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ClusterIP to reach endpoint a again", func() bool { return fetch() == "a" })

	// The Service goes: the ClusterIP is refused.
	if err := cs.CoreV1().Services("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted Service to be refused", func() bool { return strings.Contains(fetch(), "refused") })
	if err := p.stop(t); err != nil {
		t.Fatalf("userproxy exit: %v", err)
	}
}

// waitWithin is waitFor with a deadline of the caller's choosing.
func waitWithin(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%s: %v", what, time.Since(start).Round(time.Millisecond))
}

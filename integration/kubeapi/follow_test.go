package kubeapi_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/service"
)

// followWithin bounds how long a change may take to reach the table: one
// min-sync-period (kube-proxy's default, as `userproxy run` uses) plus the
// watch delivery on a busy 2-core machine.
const followWithin = service.DefaultMinSyncPeriod + 3*time.Second

// TestVersionPinned holds Version against the module that builds the
// binary, and client-go's minor against the server's.
func TestVersionPinned(t *testing.T) {
	mod, err := os.ReadFile(filepath.Join("..", "kubeapiserver", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)$`).FindSubmatch(mod); m == nil || string(m[1]) != kubeapi.Version {
		t.Errorf("integration/kubeapiserver/go.mod pins k8s.io/kubernetes %q; kubeapi.Version is %s", m, kubeapi.Version)
	}
	main, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	want := "k8s.io/client-go v0" + kubeapi.Version[2:]
	if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(want) + `$`).Match(main) {
		t.Errorf("go.mod does not require %s: the API server and client-go must be the same release", want)
	}
}

// TestFollowsServicesAndSlices writes Services and EndpointSlices through
// the API server and checks that the service table follows each change
// within followWithin: creation, endpoint conditions, a second slice, a
// changed port, a deleted slice, the service-proxy-name label that hands a
// Service to another proxy and back, and deletion.
func TestFollowsServicesAndSlices(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	ver, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if ver.GitVersion != kubeapi.Version {
		t.Errorf("server version %q, want %s", ver.GitVersion, kubeapi.Version)
	}
	ns := newNamespace(t, cs)
	p := startSource(t, sourceClient(t, c, ""), service.DefaultMinSyncPeriod, nil)

	svc, err := cs.CoreV1().Services(ns).Create(ctx, newService(ns, "web"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip := svc.Spec.ClusterIP
	if !kubeapi.ServiceCIDRs[0].Contains(netip.MustParseAddr(ip)) {
		t.Fatalf("ClusterIP %s not allocated from %s", ip, kubeapi.ServiceCIDRs[0])
	}
	http80, dns := portKeys("web", ip, 80)
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	services := cs.CoreV1().Services(ns)

	steps := []struct {
		name  string
		write func() error
		want  view
	}{
		{"service without endpoints", func() error { return nil },
			view{http80: "NoEndpoints", dns: "NoEndpoints"}},
		{"a slice with two endpoints", func() error {
			_, err := slices.Create(ctx, newSlice(ns, "web-1", "web", discoveryv1.AddressTypeIPv4, eps("10.1.0.1", "10.1.0.2")...), metav1.CreateOptions{})
			return err
		}, view{http80: keys(8080, "10.1.0.1", "10.1.0.2"), dns: keys(5353, "10.1.0.1", "10.1.0.2")}},
		{"one endpoint not ready, a third added", func() error {
			_, err := slices.Update(ctx, newSlice(ns, "web-1", "web", discoveryv1.AddressTypeIPv4,
				endpoint{addr: "10.1.0.1"}, endpoint{addr: "10.1.0.2", notReady: true}, endpoint{addr: "10.1.0.10"}), metav1.UpdateOptions{})
			return err
		}, view{http80: keys(8080, "10.1.0.1", "10.1.0.10"), dns: keys(5353, "10.1.0.1", "10.1.0.10")}},
		{"a second slice", func() error {
			_, err := slices.Create(ctx, newSlice(ns, "web-2", "web", discoveryv1.AddressTypeIPv4, eps("10.1.1.1")...), metav1.CreateOptions{})
			return err
		}, view{http80: keys(8080, "10.1.0.1", "10.1.0.10", "10.1.1.1"), dns: keys(5353, "10.1.0.1", "10.1.0.10", "10.1.1.1")}},
		{"service port 80 -> 81", func() error {
			cur, err := services.Get(ctx, "web", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.Ports[0].Port = 81
			_, err = services.Update(ctx, cur, metav1.UpdateOptions{})
			return err
		}, view{portKey81(ip): keys(8080, "10.1.0.1", "10.1.0.10", "10.1.1.1"), dns: keys(5353, "10.1.0.1", "10.1.0.10", "10.1.1.1")}},
		{"first slice deleted", func() error {
			return slices.Delete(ctx, "web-1", metav1.DeleteOptions{})
		}, view{portKey81(ip): keys(8080, "10.1.1.1"), dns: keys(5353, "10.1.1.1")}},
		{"handed to another service proxy", func() error {
			return setLabel(t, services, "web", "service.kubernetes.io/service-proxy-name", "other")
		}, view{}},
		{"handed back", func() error {
			return setLabel(t, services, "web", "service.kubernetes.io/service-proxy-name", "")
		}, view{portKey81(ip): keys(8080, "10.1.1.1"), dns: keys(5353, "10.1.1.1")}},
		{"service deleted", func() error {
			return services.Delete(ctx, "web", metav1.DeleteOptions{})
		}, view{}},
	}
	for _, s := range steps {
		if err := s.write(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		took, err := p.waitView(ns, s.want, followWithin)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		t.Logf("%-40s live after %v", s.name, took.Round(time.Millisecond))
	}
	if err := p.src.LastError(); err != nil {
		t.Errorf("LastError after a clean run: %v", err)
	}
}

func portKey81(ip string) string {
	k, _ := portKeys("web", ip, 81)
	return k
}

// setLabel sets (or, with an empty value, removes) a label of a Service.
func setLabel(t *testing.T, services corev1client.ServiceInterface, name, key, value string) error {
	ctx := ctxT(t)
	cur, err := services.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if value == "" {
		delete(cur.Labels, key)
	} else {
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		cur.Labels[key] = value
	}
	_, err = services.Update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// TestDualStack lets the API server allocate both families: a
// RequireDualStack Service gets an IPv4 and an IPv6 ClusterIP from the two
// service ranges, and each family forwards to the endpoints of its own
// slices; an IPv6-only Service answers on IPv6 only; a headless Service is
// not in the table.
func TestDualStack(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	ns := newNamespace(t, cs)
	p := startSource(t, sourceClient(t, c, ""), service.DefaultMinSyncPeriod, nil)

	dual := newService(ns, "dual")
	dual.Spec.IPFamilyPolicy = ptr(v1.IPFamilyPolicyRequireDualStack)
	six := newService(ns, "six")
	six.Spec.IPFamilies = []v1.IPFamily{v1.IPv6Protocol}
	headless := newService(ns, "headless")
	headless.Spec.ClusterIP = v1.ClusterIPNone
	var ips = map[string][]string{}
	for _, s := range []*v1.Service{dual, six, headless} {
		got, err := cs.CoreV1().Services(ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		ips[s.Name] = got.Spec.ClusterIPs
		t.Logf("%s: ipFamilyPolicy %s, ClusterIPs %v", s.Name, *got.Spec.IPFamilyPolicy, got.Spec.ClusterIPs)
	}
	if len(ips["dual"]) != 2 || !kubeapi.ServiceCIDRs[0].Contains(netip.MustParseAddr(ips["dual"][0])) ||
		!kubeapi.ServiceCIDRs[1].Contains(netip.MustParseAddr(ips["dual"][1])) {
		t.Fatalf("dual-stack ClusterIPs %v, want one from each of %v", ips["dual"], kubeapi.ServiceCIDRs)
	}
	if len(ips["six"]) != 1 || !kubeapi.ServiceCIDRs[1].Contains(netip.MustParseAddr(ips["six"][0])) {
		t.Fatalf("IPv6 ClusterIPs %v, want one from %v", ips["six"], kubeapi.ServiceCIDRs[1])
	}
	for _, es := range []*discoveryv1.EndpointSlice{
		newSlice(ns, "dual-v4", "dual", discoveryv1.AddressTypeIPv4, eps("10.2.0.1", "10.2.0.2")...),
		newSlice(ns, "dual-v6", "dual", discoveryv1.AddressTypeIPv6, eps("fd00:2::1", "fd00:2::2")...),
		newSlice(ns, "six-v6", "six", discoveryv1.AddressTypeIPv6, eps("fd00:6::1")...),
		newHeadlessSlice(ns, "headless-v4", "headless", discoveryv1.AddressTypeIPv4, eps("10.3.0.1")...),
	} {
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatalf("%s: %v", es.Name, err)
		}
	}
	d4http, d4dns := portKeys("dual", ips["dual"][0], 80)
	d6http, d6dns := portKeys("dual", ips["dual"][1], 80)
	s6http, s6dns := portKeys("six", ips["six"][0], 80)
	want := view{
		d4http: keys(8080, "10.2.0.1", "10.2.0.2"), d4dns: keys(5353, "10.2.0.1", "10.2.0.2"),
		d6http: keys(8080, "fd00:2::1", "fd00:2::2"), d6dns: keys(5353, "fd00:2::1", "fd00:2::2"),
		s6http: keys(8080, "fd00:6::1"), s6dns: keys(5353, "fd00:6::1"),
	}
	took, err := p.waitView(ns, want, followWithin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("both families live after %v", took.Round(time.Millisecond))

	// The lookups the datapath makes, per family.
	tb := p.tracker.Current()
	for _, ip := range append(ips["dual"], ips["six"]...) {
		a := netip.MustParseAddr(ip)
		port, verdict := tb.Lookup(service.TCP, a, 80)
		if verdict != service.Forward || port.ClusterIP != a || (port.Family == service.IPv6) != a.Is6() {
			t.Errorf("lookup TCP %s: %v %+v", netip.AddrPortFrom(a, 80), verdict, port)
		}
	}
	if names := skippedNames(tb, ns); len(names) != 1 || names[0] != "headless" {
		t.Errorf("skipped services %v, want the headless one", names)
	}
}

// TestFollowsHeadlessService creates a headless Service through the API
// server, and its EndpointSlices labelled as the EndpointSlice controller
// labels them (service.kubernetes.io/headless among the labels, which
// kube-proxy's informer filters out), and checks that cluster DNS answers
// the service's name with its ready endpoints and an endpoint's own name
// with its address, following each change within followWithin, while the
// table proxies nothing of the service.
func TestFollowsHeadlessService(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	ns := newNamespace(t, cs)
	p := startSource(t, sourceClient(t, c, ""), service.DefaultMinSyncPeriod, nil)
	resp, err := clusterdns.New(clusterdns.Config{Table: p.tracker.Current})
	if err != nil {
		t.Fatal(err)
	}

	db := newService(ns, "db")
	db.Spec.ClusterIP = v1.ClusterIPNone
	if _, err := cs.CoreV1().Services(ns).Create(ctx, db, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slices := cs.DiscoveryV1().EndpointSlices(ns)
	name := "db." + ns + ".svc.cluster.local"
	pod0 := "db-0." + name
	steps := []struct {
		name  string
		write func() error
		want  dnsView
	}{
		{"headless service without endpoints", func() error { return nil },
			dnsView{name: "NOERROR", pod0: "NXDOMAIN"}},
		{"a slice of three (db-0), one not ready", func() error {
			_, err := slices.Create(ctx, newHeadlessSlice(ns, "db-1", "db", discoveryv1.AddressTypeIPv4,
				endpoint{addr: "10.4.0.1", hostname: "db-0"}, endpoint{addr: "10.4.0.2"}, endpoint{addr: "10.4.0.3", notReady: true}), metav1.CreateOptions{})
			return err
		}, dnsView{name: "NOERROR 10.4.0.1,10.4.0.2", pod0: "NOERROR 10.4.0.1"}},
		{"db-0 gone, the third ready", func() error {
			_, err := slices.Update(ctx, newHeadlessSlice(ns, "db-1", "db", discoveryv1.AddressTypeIPv4,
				endpoint{addr: "10.4.0.2"}, endpoint{addr: "10.4.0.3"}), metav1.UpdateOptions{})
			return err
		}, dnsView{name: "NOERROR 10.4.0.2,10.4.0.3", pod0: "NXDOMAIN"}},
		{"a second slice", func() error {
			_, err := slices.Create(ctx, newHeadlessSlice(ns, "db-2", "db", discoveryv1.AddressTypeIPv4,
				endpoint{addr: "10.4.1.1", hostname: "db-0"}), metav1.CreateOptions{})
			return err
		}, dnsView{name: "NOERROR 10.4.0.2,10.4.0.3,10.4.1.1", pod0: "NOERROR 10.4.1.1"}},
		{"first slice deleted", func() error {
			return slices.Delete(ctx, "db-1", metav1.DeleteOptions{})
		}, dnsView{name: "NOERROR 10.4.1.1", pod0: "NOERROR 10.4.1.1"}},
		{"service deleted", func() error {
			return cs.CoreV1().Services(ns).Delete(ctx, "db", metav1.DeleteOptions{})
		}, dnsView{name: "NXDOMAIN", pod0: "NXDOMAIN"}},
	}
	for i, s := range steps {
		if err := s.write(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		took, err := p.waitDNS(resp, s.want, followWithin)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		t.Logf("%-40s answered after %v", s.name, took.Round(time.Millisecond))
		tb := p.tracker.Current()
		if v := viewOf(tb, ns); len(v) != 0 {
			t.Errorf("%s: the headless service is proxied:%s", s.name, v)
		}
		if i < len(steps)-1 {
			if names := skippedNames(tb, ns); len(names) != 1 || names[0] != "db" {
				t.Errorf("%s: skipped services %v, want the headless one", s.name, names)
			}
		}
	}
	if err := p.src.LastError(); err != nil {
		t.Errorf("LastError after a clean run: %v", err)
	}
}

func skippedNames(tb *service.Table, ns string) []string {
	var out []string
	for _, s := range tb.Skipped() {
		if s.Service.Namespace == ns {
			out = append(out, s.Service.Name)
		}
	}
	return out
}

package service_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

// syncRecorder collects what OnSync publishes.
type syncRecorder struct {
	tables  []*service.Table
	changes []service.Changes
}

func (r *syncRecorder) onSync(t *service.Table, c service.Changes) {
	r.tables = append(r.tables, t)
	r.changes = append(r.changes, c)
}

func newTracker(t *testing.T, clk *service.ManualClock, period time.Duration, rec *syncRecorder) *service.Tracker {
	t.Helper()
	tr, err := service.NewTracker(service.Config{NodeName: "node1", MinSyncPeriod: period, Clock: clk, OnSync: rec.onSync})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func webService(ip string) *v1.Service {
	return svc("ns1/web", ip, ports(tcp("http", 80, intstr.FromInt32(8080))))
}

func webEndpoints(name string, addrs ...string) *discoveryv1.EndpointSlice {
	var eps []discoveryv1.Endpoint
	for _, a := range addrs {
		eps = append(eps, ep(a))
	}
	return slice("ns1/"+name, "web", discoveryv1.AddressTypeIPv4, eports(eport("http", v1.ProtocolTCP, 8080)), eps...)
}

func TestTrackerNoTableBeforeSynced(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr := newTracker(t, clk, 0, &rec)
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1"))
	clk.Advance(time.Hour)
	if tr.Current() != nil || len(rec.tables) != 0 {
		t.Fatalf("a table was published before OnSynced: %v, %d syncs", tr.Current(), len(rec.tables))
	}
	if p, v := tr.Current().Lookup(service.TCP, netip.MustParseAddr("10.96.0.10"), 80); p != nil || v != service.NotService {
		t.Fatalf("nil table lookup = %v, %v", p, v)
	}
	if s := tr.Stats(); s.Syncs != 0 || s.PendingChanges != 1 {
		t.Fatalf("stats before sync: %+v", s)
	}

	tr.OnSynced()
	if len(rec.tables) != 1 || tr.Current() != rec.tables[0] || tr.Current().Generation() != 1 {
		t.Fatalf("after OnSynced: %d tables, current %p", len(rec.tables), tr.Current())
	}
	c := rec.changes[0]
	if diff := cmp.Diff([]service.ServiceName{{Namespace: "ns1", Name: "web"}}, c.Added); diff != "" {
		t.Errorf("Added (-want +got):\n%s", diff)
	}
	if len(c.Ports) != 1 || c.Ports[0].Old != nil || cmp.Diff([]string{"10.0.0.1:8080"}, c.Ports[0].EndpointsAdded) != "" {
		t.Errorf("first Changes.Ports = %+v", c.Ports)
	}
	if len(c.NetworkProgrammingLatencies) != 0 {
		t.Errorf("changes before the first table were measured: %v", c.NetworkProgrammingLatencies)
	}
}

func TestTrackerEmptyFirstTable(t *testing.T) {
	var rec syncRecorder
	tr := newTracker(t, service.NewManualClock(epoch), time.Second, &rec)
	tr.OnSynced()
	if len(rec.tables) != 1 || tr.Current() == nil || tr.Current().Len() != 0 {
		t.Fatalf("OnSynced with no objects must publish an empty table; got %d tables", len(rec.tables))
	}
	tr.OnSynced()
	if len(rec.tables) != 1 {
		t.Fatalf("a second OnSynced published again")
	}
}

// TestTrackerCoalescing follows kube-proxy's BoundedFrequencyRunner
// contract: at most one build per MinSyncPeriod, the first change after a
// quiet period built at once, changes within the period joined into one build
// when it ends.
func TestTrackerCoalescing(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr := newTracker(t, clk, time.Second, &rec)
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnSynced() // build 1 at t=0
	if len(rec.tables) != 1 {
		t.Fatalf("want 1 table after OnSynced, got %d", len(rec.tables))
	}

	clk.Advance(100 * time.Millisecond)
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1"))
	clk.Advance(400 * time.Millisecond)
	tr.OnEndpointSliceAdd(webEndpoints("web-2", "10.0.0.2"))
	tr.OnServiceAdd(svc("ns1/api", "10.96.0.11", ports(tcp("grpc", 9000, intstr.FromInt32(9000)))))
	if len(rec.tables) != 1 {
		t.Fatalf("built within MinSyncPeriod: %d tables", len(rec.tables))
	}
	if s := tr.Stats(); s.PendingChanges != 2 {
		t.Fatalf("PendingChanges = %d, want 2 services", s.PendingChanges)
	}
	if clk.Pending() != 1 {
		t.Fatalf("want one armed timer, have %d", clk.Pending())
	}

	clk.Advance(499 * time.Millisecond) // t=0.999s
	if len(rec.tables) != 1 {
		t.Fatalf("built before the period ended")
	}
	clk.Advance(time.Millisecond) // t=1s: one build with all three changes
	if len(rec.tables) != 2 {
		t.Fatalf("want the coalesced build at t=1s, have %d tables", len(rec.tables))
	}
	c := rec.changes[1]
	if diff := cmp.Diff([]service.ServiceName{{Namespace: "ns1", Name: "api"}}, c.Added); diff != "" {
		t.Errorf("Added (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]service.ServiceName{{Namespace: "ns1", Name: "web"}}, c.Changed); diff != "" {
		t.Errorf("Changed (-want +got):\n%s", diff)
	}
	if got := rec.tables[1].Built(); !got.Equal(epoch.Add(time.Second)) {
		t.Errorf("Built = %v", got)
	}

	// A change long after the last build is built at once.
	clk.Advance(5 * time.Second)
	tr.OnEndpointSliceDelete(webEndpoints("web-2"))
	if len(rec.tables) != 3 {
		t.Fatalf("change after a quiet period not built at once: %d tables", len(rec.tables))
	}
	// And the next one waits a full period from that build.
	clk.Advance(10 * time.Millisecond)
	tr.OnEndpointSliceDelete(webEndpoints("web-1"))
	clk.Advance(989 * time.Millisecond)
	if len(rec.tables) != 3 {
		t.Fatal("built within the period")
	}
	clk.Advance(time.Millisecond)
	if len(rec.tables) != 4 {
		t.Fatal("not built at the end of the period")
	}
	if s := tr.Stats(); s.Syncs != 4 || s.ServiceChanges != 2 || s.EndpointChanges != 4 {
		t.Errorf("stats: %+v", s)
	}
}

func TestTrackerZeroPeriodBuildsEveryChange(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr := newTracker(t, clk, 0, &rec)
	tr.OnSynced()
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1"))
	tr.OnEndpointSliceUpdate(webEndpoints("web-1", "10.0.0.1"), webEndpoints("web-1", "10.0.0.1", "10.0.0.2"))
	if len(rec.tables) != 4 {
		t.Fatalf("want 4 tables (sync + 3 changes), got %d", len(rec.tables))
	}
	if clk.Pending() != 0 {
		t.Fatalf("a timer was armed with MinSyncPeriod 0")
	}
	for i, tbl := range rec.tables {
		if tbl.Generation() != uint64(i+1) {
			t.Errorf("table %d has generation %d", i, tbl.Generation())
		}
	}
}

func TestTrackerChanges(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr := newTracker(t, clk, 0, &rec)
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnServiceAdd(svc("ns1/other", "10.96.0.11", ports(udp("dns", 53, intstr.FromInt32(53)))))
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1", "10.0.0.2", "10.0.0.3"))
	tr.OnSynced()
	first := tr.Current()
	other := first.Service(service.ServiceName{Namespace: "ns1", Name: "other"})

	// An endpoint leaves: the proxy must hear which one.
	tr.OnEndpointSliceUpdate(nil, webEndpoints("web-1", "10.0.0.1", "10.0.0.3", "10.0.0.4"))
	c := rec.changes[len(rec.changes)-1]
	if len(c.Ports) != 1 {
		t.Fatalf("want 1 port change, got %+v", c.Ports)
	}
	pc := c.Ports[0]
	want := service.PortChange{
		Name:             service.PortName{Namespace: "ns1", Name: "web", Port: "http"},
		Protocol:         service.TCP,
		Family:           service.IPv4,
		EndpointsAdded:   []string{"10.0.0.4:8080"},
		EndpointsRemoved: []string{"10.0.0.2:8080"},
	}
	got := pc
	got.Old, got.New = nil, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("PortChange (-want +got):\n%s", diff)
	}
	if pc.Old == nil || pc.New == nil || pc.Old == pc.New {
		t.Errorf("Old/New not set: %p %p", pc.Old, pc.New)
	}
	if diff := cmp.Diff([]service.ServiceName{{Namespace: "ns1", Name: "web"}}, c.Changed); diff != "" {
		t.Errorf("Changed (-want +got):\n%s", diff)
	}
	// The untouched service keeps its *Port.
	if got := tr.Current().Service(service.ServiceName{Namespace: "ns1", Name: "other"}); got[0] != other[0] {
		t.Errorf("unchanged service got a new *Port")
	}

	// An endpoint turning not-ready leaves the usable set too.
	s := webEndpoints("web-1", "10.0.0.1", "10.0.0.3", "10.0.0.4")
	s.Endpoints[1].Conditions.Ready = ptr(false)
	tr.OnEndpointSliceUpdate(nil, s)
	c = rec.changes[len(rec.changes)-1]
	if len(c.Ports) != 1 || cmp.Diff([]string{"10.0.0.3:8080"}, c.Ports[0].EndpointsRemoved) != "" || c.Ports[0].EndpointsAdded != nil {
		t.Errorf("not-ready endpoint: %+v", c.Ports)
	}

	// A service deleted: its port and all endpoints are removed.
	tr.OnServiceDelete(webService("10.96.0.10"))
	c = rec.changes[len(rec.changes)-1]
	if diff := cmp.Diff([]service.ServiceName{{Namespace: "ns1", Name: "web"}}, c.Removed); diff != "" {
		t.Errorf("Removed (-want +got):\n%s", diff)
	}
	if len(c.Ports) != 1 || c.Ports[0].New != nil || cmp.Diff([]string{"10.0.0.1:8080", "10.0.0.4:8080"}, c.Ports[0].EndpointsRemoved) != "" {
		t.Errorf("removed port: %+v", c.Ports)
	}
	if _, v := tr.Current().Lookup(service.TCP, netip.MustParseAddr("10.96.0.10"), 80); v != service.NotService {
		t.Errorf("deleted service still answers %v", v)
	}

	// A status-only update with nothing the proxy reads changes nothing: no
	// table. (An ingress IP is read, whatever the type, as kube-proxy's
	// newBaseServiceInfo reads it; an ingress hostname is not.)
	n := len(rec.tables)
	o := svc("ns1/other", "10.96.0.11", ports(udp("dns", 53, intstr.FromInt32(53))))
	o.ResourceVersion = "42"
	o.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{Hostname: "lb.example.com"}}
	tr.OnServiceUpdate(nil, o)
	if len(rec.tables) != n {
		t.Errorf("a no-op update published a table")
	}
}

func TestTrackerSliceMovesBetweenServices(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr := newTracker(t, clk, 0, &rec)
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnServiceAdd(svc("ns1/web2", "10.96.0.12", ports(tcp("http", 80, intstr.FromInt32(8080)))))
	old := webEndpoints("s", "10.0.0.1")
	tr.OnEndpointSliceAdd(old)
	tr.OnSynced()
	moved := webEndpoints("s", "10.0.0.1")
	moved.Labels[discoveryv1.LabelServiceName] = "web2"
	tr.OnEndpointSliceUpdate(old, moved)
	got := map[string]service.Verdict{}
	for _, ip := range []string{"10.96.0.10", "10.96.0.12"} {
		_, got[ip] = tr.Current().Lookup(service.TCP, netip.MustParseAddr(ip), 80)
	}
	want := map[string]service.Verdict{"10.96.0.10": service.NoEndpoints, "10.96.0.12": service.Forward}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after relabel (-want +got):\n%s", diff)
	}
}

func TestTrackerSkipped(t *testing.T) {
	tr := syncedTracker(t, service.Config{},
		svc("ns1/headless", "None", ports(tcp("x", 80, intstr.FromInt32(80)))),
		svc("ns1/ext", "", nil, func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeExternalName }),
		svc("ns1/mixed", "10.96.0.5", ports(tcp("a", 80, intstr.FromInt32(80)), sctp("b", 90))),
		svc("ns1/badip", "10.96.0.300", ports(tcp("a", 80, intstr.FromInt32(80)))),
	)
	want := []service.Skipped{
		{Service: service.ServiceName{Namespace: "ns1", Name: "badip"}, Reason: `invalid spec.clusterIPs[0] "10.96.0.300"`},
		{Service: service.ServiceName{Namespace: "ns1", Name: "ext"}, Reason: service.ReasonExternalName},
		{Service: service.ServiceName{Namespace: "ns1", Name: "headless"}, Reason: service.ReasonHeadless},
		{Service: service.ServiceName{Namespace: "ns1", Name: "mixed"}, Port: "b", PortNumber: 90, Reason: service.ReasonSCTP},
	}
	if diff := cmp.Diff(want, tr.Current().Skipped()); diff != "" {
		t.Errorf("Skipped (-want +got):\n%s", diff)
	}
	if s := tr.Stats(); s.Skipped != 4 || s.Ports != 1 || s.Services != 1 {
		t.Errorf("stats: %+v", s)
	}
	// Unskipping: the headless service gets an IP.
	tr.OnServiceUpdate(nil, svc("ns1/headless", "10.96.0.6", ports(tcp("x", 80, intstr.FromInt32(80)))))
	if n := len(tr.Current().Skipped()); n != 3 {
		t.Errorf("after update %d skipped, want 3", n)
	}
}

func TestTrackerConflictingClusterIPs(t *testing.T) {
	a := svc("ns1/a", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(80))))
	b := svc("ns1/b", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(80)), tcp("alt", 81, intstr.FromInt32(81))))
	ip := netip.MustParseAddr("10.96.0.10")
	tr := syncedTracker(t, service.Config{}, b, a)
	if p, _ := tr.Current().Lookup(service.TCP, ip, 80); p == nil || p.Name.Name != "a" {
		t.Fatalf("lower name must win the conflict, got %v", p)
	}
	if p, _ := tr.Current().Lookup(service.TCP, ip, 81); p == nil || p.Name.Name != "b" {
		t.Fatalf("the unconflicted port of b is served, got %v", p)
	}
	tr.OnServiceDelete(a)
	if p, _ := tr.Current().Lookup(service.TCP, ip, 80); p == nil || p.Name.Name != "b" {
		t.Fatalf("the loser takes over, got %v", p)
	}
	tr.OnServiceDelete(b)
	if _, v := tr.Current().Lookup(service.TCP, ip, 80); v != service.NotService {
		t.Fatalf("after both deleted: %v", v)
	}
}

func TestTrackerStats(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr, err := service.NewTracker(service.Config{NodeName: "node1", Clock: clk, OnSync: rec.onSync})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	local := svc("ns1/local", "10.96.0.20", ports(tcp("http", 80, intstr.FromInt32(80))), itpLocal)
	tr.OnServiceAdd(local)
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnEndpointSliceAdd(slice("ns1/local-1", "local", discoveryv1.AddressTypeIPv4,
		eports(eport("http", v1.ProtocolTCP, 80)), ep("10.0.0.9", onNode("node2"))))
	tr.OnEndpointSliceAdd(slice("ns1/nolabel", "", discoveryv1.AddressTypeIPv4, nil))
	tr.OnSynced()

	// The slice says it changed at t=1s; the table goes live at t=3s.
	clk.Advance(3 * time.Second)
	s := webEndpoints("web-1", "10.0.0.1")
	s.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: epoch.Add(time.Second).Format(time.RFC3339Nano)}
	tr.OnEndpointSliceAdd(s)
	// Without the annotation, the receive time (t=5s) counts: 0 s latency.
	clk.Advance(2 * time.Second)
	tr.OnEndpointSliceAdd(webEndpoints("web-2", "10.0.0.2"))

	st := tr.Stats()
	if st.Syncs != 3 || st.ServiceChanges != 2 || st.EndpointChanges != 3 || st.IgnoredEndpointSlices != 1 {
		t.Errorf("counters: %+v", st)
	}
	if st.NoLocalEndpoints.Internal != 1 {
		t.Errorf("NoLocalEndpoints.Internal = %d, want 1", st.NoLocalEndpoints.Internal)
	}
	if !st.LastSyncTime.Equal(epoch.Add(5 * time.Second)) {
		t.Errorf("LastSyncTime = %v", st.LastSyncTime)
	}
	if diff := cmp.Diff([]time.Duration{2 * time.Second}, rec.changes[1].NetworkProgrammingLatencies); diff != "" {
		t.Errorf("latency samples (-want +got):\n%s", diff)
	}
	h := st.NetworkProgrammingLatency
	if h.Count != 2 || h.Sum != 2 {
		t.Errorf("latency histogram: count %d sum %v", h.Count, h.Sum)
	}
	// 0 s and 2 s: the 0.25 bucket holds one, the 2 s bucket both.
	if h.Buckets[0] != 1 || h.Buckets[len(h.Buckets)-1] != 2 {
		t.Errorf("latency buckets: %v", h.Buckets[:4])
	}
	if st.SyncDuration.Count != 3 {
		t.Errorf("sync histogram count %d", st.SyncDuration.Count)
	}
}

func TestTrackerCloseStopsTimer(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var rec syncRecorder
	tr := newTracker(t, clk, time.Second, &rec)
	tr.OnSynced()
	tr.OnServiceAdd(webService("10.96.0.10"))
	if clk.Pending() != 1 {
		t.Fatalf("no timer armed")
	}
	tr.Close()
	clk.Advance(time.Hour)
	if len(rec.tables) != 1 || clk.Pending() != 0 {
		t.Fatalf("built after Close: %d tables", len(rec.tables))
	}
}

func TestNewTrackerRejectsNegativePeriod(t *testing.T) {
	if _, err := service.NewTracker(service.Config{MinSyncPeriod: -1}); err == nil {
		t.Fatal("negative MinSyncPeriod accepted")
	}
	if c := service.DefaultConfig(); c.MinSyncPeriod != time.Second || c.Clock == nil {
		t.Fatalf("DefaultConfig = %+v", c)
	}
}

// TestTrackerIncrementalMatchesFresh applies a random sequence of events
// to one tracker (incremental builds) and checks after each step that its
// table answers exactly like a tracker built from scratch from the same
// objects. The seed is logged; USERPROXY_SEED reproduces a run.
func TestTrackerIncrementalMatchesFresh(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("USERPROXY_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("seed %d (set USERPROXY_SEED to reproduce)", seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	clk := service.NewManualClock(epoch)
	inc, err := service.NewTracker(service.Config{NodeName: "n0", Zone: "z0", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer inc.Close()
	inc.OnSynced()

	services := map[string]*v1.Service{}
	slices := map[string]*discoveryv1.EndpointSlice{}
	randService := func(name string) *v1.Service {
		// Few IPs, so that services collide now and then.
		ip := fmt.Sprintf("10.96.0.%d", rng.IntN(6))
		ps := ports(tcp("http", 80, intstr.FromInt32(8080)))
		if rng.IntN(2) == 0 {
			ps = append(ps, udp("dns", 53, intstr.FromInt32(53)))
		}
		s := svc("ns/"+name, ip, ps)
		switch rng.IntN(5) {
		case 0:
			itpLocal(s)
		case 1:
			clientIP(int32(rng.IntN(100)))(s)
		case 2:
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", nil
		}
		// External destinations from small pools, so that they collide
		// too (an externalIP of one service is an LB IP of another).
		extIP := func() string { return fmt.Sprintf("192.168.0.%d", rng.IntN(4)) }
		switch rng.IntN(4) {
		case 0:
			svcType(v1.ServiceTypeNodePort)(s)
			for i := range s.Spec.Ports {
				s.Spec.Ports[i].NodePort = int32(30000 + rng.IntN(3))
			}
		case 1:
			svcType(v1.ServiceTypeLoadBalancer)(s)
			ingress(extIP(), "")(s)
			if rng.IntN(2) == 0 {
				ingress(extIP(), v1.LoadBalancerIPModeProxy)(s)
			}
		}
		if rng.IntN(3) == 0 {
			externalIPs(extIP())(s)
		}
		if rng.IntN(2) == 0 {
			etpLocal(s)
		}
		return s
	}
	randSlice := func(name, svcName string) *discoveryv1.EndpointSlice {
		var eps []discoveryv1.Endpoint
		for range rng.IntN(4) {
			e := ep(fmt.Sprintf("10.0.0.%d", rng.IntN(8)), onNode(fmt.Sprintf("n%d", rng.IntN(2))))
			switch rng.IntN(4) {
			case 0:
				notReady(&e)
			case 1:
				terminating(rng.IntN(2) == 0)(&e)
			}
			if rng.IntN(3) == 0 {
				zoneHints(fmt.Sprintf("z%d", rng.IntN(2)))(&e)
			}
			eps = append(eps, e)
		}
		return slice("ns/"+name, svcName, discoveryv1.AddressTypeIPv4,
			eports(eport("http", v1.ProtocolTCP, 8080), eport("dns", v1.ProtocolUDP, 53)), eps...)
	}

	for step := range 300 {
		svcName := fmt.Sprintf("s%d", rng.IntN(5))
		sliceName := fmt.Sprintf("%s-%d", svcName, rng.IntN(2))
		switch rng.IntN(4) {
		case 0:
			s := randService(svcName)
			if old, ok := services[svcName]; ok {
				inc.OnServiceUpdate(old, s)
			} else {
				inc.OnServiceAdd(s)
			}
			services[svcName] = s
		case 1:
			if old, ok := services[svcName]; ok {
				inc.OnServiceDelete(old)
				delete(services, svcName)
			}
		case 2:
			s := randSlice(sliceName, svcName)
			if old, ok := slices[sliceName]; ok {
				inc.OnEndpointSliceUpdate(old, s)
			} else {
				inc.OnEndpointSliceAdd(s)
			}
			slices[sliceName] = s
		case 3:
			if old, ok := slices[sliceName]; ok {
				inc.OnEndpointSliceDelete(old)
				delete(slices, sliceName)
			}
		}
		var objs []any
		for _, s := range services {
			objs = append(objs, s)
		}
		for _, s := range slices {
			objs = append(objs, s)
		}
		fresh := syncedTracker(t, service.Config{NodeName: "n0", Zone: "z0"}, objs...)
		if diff := cmp.Diff(tableView(fresh.Current()), tableView(inc.Current())); diff != "" {
			t.Fatalf("step %d: incremental table differs from a fresh build (-fresh +incremental):\n%s", step, diff)
		}
		if f, i := fresh.Stats().NoLocalEndpoints, inc.Stats().NoLocalEndpoints; f != i {
			t.Fatalf("step %d: NoLocalEndpoints fresh %+v, incremental %+v", step, f, i)
		}
	}
}

// tableView renders what a table answers for every address and port the
// random test uses, plus its port list.
func tableView(tbl *service.Table) []string {
	var out []string
	for i := range 7 {
		ip := netip.MustParseAddr(fmt.Sprintf("10.96.0.%d", i))
		for _, pp := range []struct {
			proto service.Protocol
			port  uint16
		}{{service.TCP, 80}, {service.UDP, 53}, {service.TCP, 53}} {
			p, v := tbl.Lookup(pp.proto, ip, pp.port)
			line := fmt.Sprintf("%s %s:%d %v", pp.proto, ip, pp.port, v)
			if p != nil {
				line += fmt.Sprintf(" %s %v %v local=%v", p.Name, p.EndpointKeys, p.Affinity, p.InternalTrafficPolicyLocal)
			}
			out = append(out, line)
		}
	}
	for i := range 5 {
		ip := netip.MustParseAddr(fmt.Sprintf("192.168.0.%d", i))
		for _, pp := range []struct {
			proto service.Protocol
			port  uint16
		}{{service.TCP, 80}, {service.UDP, 53}} {
			p, v := tbl.LookupExternal(pp.proto, ip, pp.port)
			line := fmt.Sprintf("external %s %s:%d %v", pp.proto, ip, pp.port, v)
			if p != nil {
				line += fmt.Sprintf(" %s %v", p.Name, p.ExternalEndpointKeys)
			}
			out = append(out, line)
		}
	}
	for np := uint16(30000); np < 30004; np++ {
		for _, proto := range []service.Protocol{service.TCP, service.UDP} {
			p, v := tbl.LookupNodePort(proto, service.IPv4, np)
			line := fmt.Sprintf("nodeport %s %d %v", proto, np, v)
			if p != nil {
				line += fmt.Sprintf(" %s %v", p.Name, p.ExternalEndpointKeys)
			}
			out = append(out, line)
		}
	}
	out = append(out, fmt.Sprintf("external addrs %v", tbl.ExternalAddrs()))
	for _, p := range tbl.Ports() {
		out = append(out, fmt.Sprintf("port %s %s %s %v %v", p.Name, p.Protocol, p.ClusterIP, p.Verdict, p.ExternalVerdict))
	}
	out = append(out, fmt.Sprintf("len %d services %d skipped %d", tbl.Len(), tbl.Services(), len(tbl.Skipped())))
	return out
}

func TestTablePortsAndService(t *testing.T) {
	tr := syncedTracker(t, service.Config{},
		svc("ns2/b", "10.96.0.2,fd00::2", ports(tcp("http", 80, intstr.FromInt32(80)), udp("dns", 53, intstr.FromInt32(53)))),
		svc("ns1/a", "10.96.0.1", ports(tcp("", 80, intstr.FromInt32(80)))),
	)
	tbl := tr.Current()
	var got []string
	for _, p := range tbl.Ports() {
		got = append(got, fmt.Sprintf("%s %s %s %s:%d", p.Name, p.Protocol, p.Family, p.ClusterIP, p.Port))
	}
	want := []string{
		"ns1/a TCP IPv4 10.96.0.1:80",
		"ns2/b:dns UDP IPv4 10.96.0.2:53",
		"ns2/b:dns UDP IPv6 fd00::2:53",
		"ns2/b:http TCP IPv4 10.96.0.2:80",
		"ns2/b:http TCP IPv6 fd00::2:80",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Ports (-want +got):\n%s", diff)
	}
	if tbl.Len() != 5 || tbl.Services() != 2 {
		t.Errorf("Len %d Services %d", tbl.Len(), tbl.Services())
	}
	b := tbl.Service(service.ServiceName{Namespace: "ns2", Name: "b"})
	if len(b) != 4 || b[0].Family != service.IPv4 || b[0].Name.Port != "http" || b[3].Family != service.IPv6 {
		t.Errorf("Service(ns2/b) = %v", b)
	}
	if diff := cmp.Diff([]netip.Addr{netip.MustParseAddr("10.96.0.2"), netip.MustParseAddr("fd00::2")}, b[3].ClusterIPs, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Errorf("ClusterIPs (-want +got):\n%s", diff)
	}
	// Ports returns the caller's own slice.
	ps := tbl.Ports()
	ps[0] = nil
	if tbl.Ports()[0] == nil {
		t.Error("Ports shares its slice")
	}
	var nilTable *service.Table
	if nilTable.Len() != 0 || nilTable.Ports() != nil || nilTable.Skipped() != nil || nilTable.Generation() != 0 {
		t.Error("nil table is not empty")
	}
}

// TestTablePortsOrderIncremental grows and shrinks a table one service at a
// time, so that the chunked Ports order is split, cut and merged many times,
// and checks it after every build against a full sort.
func TestTablePortsOrderIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	clk := service.NewManualClock(epoch)
	tr, err := service.NewTracker(service.Config{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.OnSynced()
	live := map[int]*v1.Service{}
	for step := range 2000 {
		i := rng.IntN(800)
		if s, ok := live[i]; ok && rng.IntN(3) == 0 {
			tr.OnServiceDelete(s)
			delete(live, i)
		} else {
			s := svc(fmt.Sprintf("ns%d/svc-%d", i%7, i), fmt.Sprintf("10.96.%d.%d", i/250, i%250), ports(tcp("http", 80, intstr.FromInt32(80))))
			if rng.IntN(2) == 0 {
				s.Spec.Ports = append(s.Spec.Ports, udp("dns", 53, intstr.FromInt32(53)))
			}
			tr.OnServiceAdd(s)
			live[i] = s
		}
		got := tr.Current().Ports()
		if len(got) != tr.Current().Len() {
			t.Fatalf("step %d: Ports has %d, Len %d", step, len(got), tr.Current().Len())
		}
		keys := make([]string, len(got))
		for i, p := range got {
			keys[i] = p.Name.Namespace + "\x00" + p.Name.Name + "\x00" + p.Name.Port + "\x00" + p.Protocol.String()
		}
		if !slices.IsSorted(keys) {
			t.Fatalf("step %d: Ports out of order", step)
		}
		want := 0
		for _, s := range live {
			want += len(s.Spec.Ports)
		}
		if len(got) != want {
			t.Fatalf("step %d: %d ports, want %d", step, len(got), want)
		}
	}
}

// TestTrackerParallelBuild builds a table large enough for the parallel
// path in one go, and the same objects one event at a time (sequential
// path), and expects the same table.
func TestTrackerParallelBuild(t *testing.T) {
	svcs, sls := benchObjects(3000, 3)
	sls[7].Endpoints[1].Conditions.Ready = ptr(false)
	big := syncedTracker(t, service.Config{NodeName: "node-1"}) // synced empty, then one build per event
	feed(big, svcs, sls)
	bulk, err := service.NewTracker(service.Config{NodeName: "node-1", Clock: service.NewManualClock(epoch)})
	if err != nil {
		t.Fatal(err)
	}
	defer bulk.Close()
	feed(bulk, svcs, sls)
	bulk.OnSynced() // one build of 3000 services

	render := func(tbl *service.Table) []string {
		var out []string
		for _, p := range tbl.Ports() {
			out = append(out, fmt.Sprintf("%s %s %v %v", p.Name, p.ClusterIP, p.Verdict, p.EndpointKeys))
		}
		return out
	}
	if diff := cmp.Diff(render(big.Current()), render(bulk.Current())); diff != "" {
		t.Errorf("one-by-one vs bulk (-one-by-one +bulk):\n%s", diff)
	}
	if bulk.Current().Len() != 3000 {
		t.Errorf("Len = %d", bulk.Current().Len())
	}
}

// TestTrackerSchedulerAnnotation: the userproxy.io/scheduler annotations
// reach every Port of the Service; a scheduler CheckScheduler refuses skips
// the whole Service with the error as the reason; changing the annotation
// is a changed port.
func TestTrackerSchedulerAnnotation(t *testing.T) {
	sched := func(name, flags string) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Annotations = map[string]string{service.AnnotationScheduler: name, service.AnnotationSchedulerFlags: flags}
		}
	}
	check := func(name, flags string) error {
		if name != "mh" && name != "rr" {
			return fmt.Errorf("scheduler %q: unknown", name)
		}
		return nil
	}
	var changed []service.PortName
	tr := syncedTracker(t, service.Config{CheckScheduler: check, OnSync: func(_ *service.Table, c service.Changes) {
		for _, p := range c.Ports {
			changed = append(changed, p.Name)
		}
	}},
		svc("ns1/mh", "10.96.0.5", ports(tcp("a", 80, intstr.FromInt32(80)), udp("b", 53, intstr.FromInt32(53))), sched("mh", "mh-port")),
		svc("ns1/bad", "10.96.0.6", ports(tcp("a", 80, intstr.FromInt32(80))), sched("fastest", "")),
		svc("ns1/plain", "10.96.0.7", ports(tcp("a", 80, intstr.FromInt32(80)))),
	)
	for _, p := range tr.Current().Service(service.ServiceName{Namespace: "ns1", Name: "mh"}) {
		if p.Scheduler != (service.Scheduler{Name: "mh", Flags: "mh-port"}) {
			t.Errorf("%v: scheduler %+v", p.Name, p.Scheduler)
		}
	}
	if p := tr.Current().Service(service.ServiceName{Namespace: "ns1", Name: "plain"}); len(p) != 1 || p[0].Scheduler != (service.Scheduler{}) {
		t.Errorf("plain: %+v", p)
	}
	want := []service.Skipped{{Service: service.ServiceName{Namespace: "ns1", Name: "bad"},
		Reason: `annotation userproxy.io/scheduler: scheduler "fastest": unknown`}}
	if diff := cmp.Diff(want, tr.Current().Skipped()); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	changed = nil
	tr.OnServiceUpdate(nil, svc("ns1/plain", "10.96.0.7", ports(tcp("a", 80, intstr.FromInt32(80))), sched("rr", "")))
	if want := []service.PortName{{Namespace: "ns1", Name: "plain", Port: "a"}}; !cmp.Equal(want, changed) {
		t.Errorf("changes after annotating: %v, want %v", changed, want)
	}
}

// TestTrackerStatsPerFamily: the inputs of kube-proxy's ip_family labels
// (pkg/proxy/metrics/metrics.go: network_programming_duration_seconds and
// sync_proxy_rules_no_local_endpoints_total carry ip_family) and of its two
// pending gauges (sync_proxy_rules_service_changes_pending and
// ..._endpoint_changes_pending).
func TestTrackerStatsPerFamily(t *testing.T) {
	clk := service.NewManualClock(epoch)
	tr, err := service.NewTracker(service.Config{NodeName: "node1", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	dual := svc("ns1/dual", "10.96.0.30,fd00::30", ports(tcp("http", 80, intstr.FromInt32(80))), itpLocal)
	tr.OnServiceAdd(dual)
	tr.OnEndpointSliceAdd(slice("ns1/dual-v6", "dual", discoveryv1.AddressTypeIPv6,
		eports(eport("http", v1.ProtocolTCP, 80)), ep("fd00::9", onNode("node1"))))
	tr.OnEndpointSliceAdd(slice("ns1/dual-v4", "dual", discoveryv1.AddressTypeIPv4,
		eports(eport("http", v1.ProtocolTCP, 80)), ep("10.0.0.9", onNode("node2"))))
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1"))
	// Before the first table: one service with a Service change, two with
	// an EndpointSlice change.
	if s := tr.Stats(); s.ServiceChangesPending != 1 || s.EndpointChangesPending != 2 || s.PendingChanges != 2 {
		t.Errorf("pending: service %d endpoints %d all %d, want 1, 2, 2", s.ServiceChangesPending, s.EndpointChangesPending, s.PendingChanges)
	}
	if s := tr.Stats(); !s.LastQueuedTime.Equal(epoch) {
		t.Errorf("LastQueuedTime = %v, want %v", s.LastQueuedTime, epoch)
	}
	tr.OnSynced()

	st := tr.Stats()
	if st.ServiceChangesPending != 0 || st.EndpointChangesPending != 0 {
		t.Errorf("pending after the table: %d, %d", st.ServiceChangesPending, st.EndpointChangesPending)
	}
	// The IPv4 port has no local endpoint, the IPv6 one has.
	want := service.PerFamily[service.NoLocalEndpointsCount]{IPv4: service.NoLocalEndpointsCount{Internal: 1}}
	if diff := cmp.Diff(want, st.NoLocalEndpointsByFamily); diff != "" {
		t.Errorf("NoLocalEndpointsByFamily (-want +got):\n%s", diff)
	}
	if st.NoLocalEndpoints != (service.NoLocalEndpointsCount{Internal: 1}) {
		t.Errorf("NoLocalEndpoints = %+v", st.NoLocalEndpoints)
	}

	// An IPv6 slice change at t=1s, then a change of the dual-stack Service
	// at t=2s, each live at once.
	clk.Advance(time.Second)
	tr.OnEndpointSliceAdd(slice("ns1/dual-v6b", "dual", discoveryv1.AddressTypeIPv6,
		eports(eport("http", v1.ProtocolTCP, 80)), ep("fd00::10", onNode("node1"))))
	clk.Advance(time.Second)
	changed := dual.DeepCopy()
	changed.Spec.Ports[0].Port = 81
	tr.OnServiceUpdate(dual, changed)
	if s := tr.Stats(); !s.LastQueuedTime.Equal(epoch.Add(2 * time.Second)) {
		t.Errorf("LastQueuedTime = %v, want t=2s", s.LastQueuedTime)
	}
	clk.Advance(time.Second)
	st = tr.Stats()
	v4, v6 := st.NetworkProgrammingLatencyByFamily.IPv4, st.NetworkProgrammingLatencyByFamily.IPv6
	if v4.Count != 1 || v4.Sum != 0 || v6.Count != 2 || v6.Sum != 0 {
		// Without MinSyncPeriod each change builds at once: 0 s each.
		t.Errorf("per family: IPv4 count %d sum %v, IPv6 count %d sum %v; want 1/0 and 2/0", v4.Count, v4.Sum, v6.Count, v6.Sum)
	}
	if h := st.NetworkProgrammingLatency; h.Count != 2 {
		t.Errorf("all families: count %d, want 2 (each change once)", h.Count)
	}
	if got := st.NetworkProgrammingLatencyByFamily.Get(service.IPv6); got.Count != 2 {
		t.Errorf("Get(IPv6).Count = %d", got.Count)
	}
}

// TestTrackerHistogramBoundsKubeProxy: the bounds are those of kube-proxy's
// pkg/proxy/metrics/metrics.go, built as component-base builds them
// (ExponentialBuckets; MergeBuckets of LinearBuckets, with its leading 0).
func TestTrackerHistogramBoundsKubeProxy(t *testing.T) {
	var sync []float64
	for i, b := 0, 0.001; i < 15; i, b = i+1, b*2 {
		sync = append(sync, b)
	}
	if diff := cmp.Diff(sync, service.SyncDurationBounds); diff != "" {
		t.Errorf("SyncDurationBounds (-kube-proxy +ours):\n%s", diff)
	}
	programming := []float64{0} // MergeBuckets' first element
	for _, lin := range []struct {
		start, width float64
		n            int
	}{{0.25, 0.25, 2}, {1, 1, 59}, {60, 5, 12}, {120, 30, 7}} {
		for i := 0; i < lin.n; i++ {
			programming = append(programming, lin.start+float64(i)*lin.width)
		}
	}
	if diff := cmp.Diff(programming, service.NetworkProgrammingBounds); diff != "" {
		t.Errorf("NetworkProgrammingBounds (-kube-proxy +ours):\n%s", diff)
	}
}

// TestTrackerOldestPending: the time the oldest change not yet in a table
// arrived, as kube-proxy's QueuedUpdate records it: not before the first
// table (its proxier starts calling it once initialized), then from the
// first change after a table until the next table.
func TestTrackerOldestPending(t *testing.T) {
	clk := service.NewManualClock(epoch)
	tr, err := service.NewTracker(service.Config{MinSyncPeriod: time.Second, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	web := svc("ns1/web", "10.96.0.5", ports(tcp("a", 80, intstr.FromInt32(80))))
	tr.OnServiceAdd(web)
	if st := tr.Health(); !st.OldestPending.IsZero() {
		t.Fatalf("before the first table: %v", st.OldestPending)
	}
	tr.OnSynced()
	clk.Advance(100 * time.Millisecond)
	first := clk.Now()
	tr.OnServiceUpdate(nil, svc("ns1/web", "10.96.0.5", ports(tcp("a", 81, intstr.FromInt32(81)))))
	clk.Advance(100 * time.Millisecond)
	tr.OnServiceUpdate(nil, svc("ns1/web", "10.96.0.5", ports(tcp("a", 82, intstr.FromInt32(82)))))
	if st := tr.Health(); !st.OldestPending.Equal(first) || st.PendingChanges != 1 {
		t.Fatalf("pending: oldest %v (want %v), %d changes", st.OldestPending, first, st.PendingChanges)
	}
	clk.Advance(time.Second) // the min-sync timer builds
	if st := tr.Health(); !st.OldestPending.IsZero() || st.Syncs != 2 {
		t.Fatalf("after the build: oldest %v, %d tables", st.OldestPending, st.Syncs)
	}
}

// TestTrackerSetZone: a new zone (from the Node's label) rebuilds the table
// and zone hints select that zone's endpoints (kube-proxy topology.go).
func TestTrackerSetZone(t *testing.T) {
	tr := syncedTracker(t, service.Config{NodeName: "node-a"},
		svc("ns1/web", "10.96.0.5", ports(tcp("http", 80, intstr.FromInt32(80)))),
		slice("ns1/web-1", "web", discoveryv1.AddressTypeIPv4, eports(eport("http", v1.ProtocolTCP, 80)),
			ep("10.1.2.3", inZone("zone-a"), zoneHints("zone-a")),
			ep("10.1.2.4", inZone("zone-b"), zoneHints("zone-b"))),
	)
	keys := func() []string {
		p, _ := tr.Current().Lookup(service.TCP, netip.MustParseAddr("10.96.0.5"), 80)
		return p.EndpointKeys
	}
	if got := keys(); len(got) != 2 {
		t.Fatalf("no zone: %v, want both", got)
	}
	tr.SetZone("zone-b")
	if got := keys(); !cmp.Equal(got, []string{"10.1.2.4:80"}) || tr.Zone() != "zone-b" {
		t.Fatalf("zone-b: %v", got)
	}
	tr.SetZone("zone-a")
	if got := keys(); !cmp.Equal(got, []string{"10.1.2.3:80"}) {
		t.Fatalf("zone-a: %v", got)
	}
}

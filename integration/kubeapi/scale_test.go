package kubeapi_test

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

// scaleServices x scaleEndpoints: the size of the scale test.
const (
	scaleServices  = 1000
	scaleEndpoints = 10
	scaleWriters   = 8 // concurrent writers, as a controller-manager's workers
)

// scaleSlice returns service i's EndpointSlice: scaleEndpoints addresses of
// its own, stamped with the trigger time the Tracker measures from.
func scaleSlice(ns string, i int, trigger time.Time) *discoveryv1.EndpointSlice {
	name := fmt.Sprintf("svc-%04d", i)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-1",
			Labels:      controllerLabels(name, false),
			Annotations: map[string]string{v1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(v1.ProtocolTCP), Port: ptr(int32(8080))}},
	}
	for j := range scaleEndpoints {
		n := i*scaleEndpoints + j
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{netip.AddrFrom4([4]byte{10, 200, byte(n / 250), byte(n%250 + 1)}).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
		})
	}
	return es
}

// TestScale writes 1,000 Services x 10 endpoints through the API server
// while a Source runs with kube-proxy's default min-sync-period (1 s), and
// measures each service's network programming duration: from just before
// its EndpointSlice is written to the first table in which its port
// forwards to all 10 endpoints. Then a second Source starts from nothing and
// lists the lot (2,000 objects) into its first table.
func TestScale(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	ns := newNamespace(t, cs)

	var (
		mu      sync.Mutex
		written = map[string]time.Time{} // service -> its slice's write began
		live    = map[string]time.Time{} // service -> its port forwarded to all endpoints
	)
	onSync := func(tb *service.Table, ch service.Changes) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, pc := range ch.Ports {
			if pc.New == nil || pc.Name.Namespace != ns || pc.New.Verdict != service.Forward || len(pc.New.EndpointKeys) != scaleEndpoints {
				continue
			}
			if _, ok := live[pc.Name.Name]; !ok {
				live[pc.Name.Name] = now
			}
		}
	}
	p := startSource(t, sourceClient(t, c, ""), service.DefaultMinSyncPeriod, onSync)
	if _, err := p.waitView(ns, view{}, time.Minute); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	err := parallel(scaleServices, scaleWriters, func(i int) error {
		name := fmt.Sprintf("svc-%04d", i)
		svc := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{
				{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			}},
		}
		if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("service %s: %w", name, err)
		}
		now := time.Now()
		mu.Lock()
		written[name] = now
		mu.Unlock()
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, scaleSlice(ns, i, now), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("slice of %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wrote := time.Since(start)

	deadline := time.After(3 * time.Minute) // failsafe
	for done := false; !done; {
		mu.Lock()
		done = len(live) == scaleServices
		n := len(live)
		mu.Unlock()
		if done {
			break
		}
		select {
		case <-p.changed:
		case <-deadline:
			t.Fatalf("after 3 minutes %d of %d services are live", n, scaleServices)
		}
	}
	converged := time.Since(start)

	// Every port, as the datapath looks it up.
	tb := p.tracker.Current()
	forwarding := 0
	for _, port := range tb.Ports() {
		if port.Name.Namespace != ns {
			continue
		}
		got, v := tb.Lookup(service.TCP, port.ClusterIP, 80)
		if v == service.Forward && got == port && len(got.EndpointKeys) == scaleEndpoints {
			forwarding++
		}
	}
	if forwarding != scaleServices {
		t.Errorf("%d service ports forward to %d endpoints, want %d", forwarding, scaleEndpoints, scaleServices)
	}

	mu.Lock()
	var lat []time.Duration
	for name, w := range written {
		lat = append(lat, live[name].Sub(w))
	}
	mu.Unlock()
	slices.Sort(lat)
	st := p.tracker.Stats()
	t.Logf("%d services x %d endpoints written in %v (%.0f objects/s), all live %v after the first write; %d tables built",
		scaleServices, scaleEndpoints, wrote.Round(time.Millisecond), float64(2*scaleServices)/wrote.Seconds(),
		converged.Round(time.Millisecond), st.Syncs)
	t.Logf("network programming duration (slice written -> table live, min-sync-period %v): p50 %v, p90 %v, p99 %v, max %v",
		service.DefaultMinSyncPeriod, percentile(lat, 0.5).Round(time.Millisecond), percentile(lat, 0.9).Round(time.Millisecond),
		percentile(lat, 0.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	if h := st.NetworkProgrammingLatency; h.Count < scaleServices {
		t.Errorf("the Tracker measured %d network programming samples, want at least %d (one per slice trigger time)", h.Count, scaleServices)
	} else {
		t.Logf("the Tracker's own network_programming_duration_seconds: %d samples, mean %.3fs", h.Count, h.Sum/float64(h.Count))
	}
	t.Logf("last table build took %v", st.LastSyncDuration)

	// A second proxy starting now lists all of it at once.
	start = time.Now()
	p2 := startSource(t, sourceClient(t, c, ""), service.DefaultMinSyncPeriod, nil)
	want := viewOf(tb, ns)
	if _, err := p2.waitView(ns, want, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("a new Source listed %d Services and %d EndpointSlices into its first table in %v",
		scaleServices, scaleServices, time.Since(start).Round(time.Millisecond))
}

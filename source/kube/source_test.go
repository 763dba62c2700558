package kube_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a service.Handler recording calls as lines, in front of a
// real Tracker.
type recorder struct {
	*service.Tracker
	mu     sync.Mutex
	events []string
	notify chan struct{}
}

func newRecorder(t *testing.T) *recorder {
	tr, err := service.NewTracker(service.Config{Clock: service.NewManualClock(time.Unix(0, 0))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return &recorder{Tracker: tr, notify: make(chan struct{}, 1000)}
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
	r.notify <- struct{}{}
}

// wait returns once the lines in want have all arrived (in any order, as
// the two informers run concurrently); other lines are returned too. The
// deadline is a failsafe for a hung test, not a timing assertion.
func (r *recorder) wait(t *testing.T, want ...string) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		have := slices.Clone(r.events)
		r.mu.Unlock()
		all := true
		for _, w := range want {
			if !slices.Contains(have, w) {
				all = false
			}
		}
		if all {
			r.mu.Lock()
			r.events = nil
			r.mu.Unlock()
			return have
		}
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatalf("waited for %v, have %v", want, have)
		}
	}
}

func (r *recorder) OnServiceAdd(s *v1.Service) {
	r.Tracker.OnServiceAdd(s)
	r.add("add Service " + s.Name)
}
func (r *recorder) OnServiceUpdate(o, s *v1.Service) {
	r.Tracker.OnServiceUpdate(o, s)
	r.add("update Service " + s.Name)
}
func (r *recorder) OnServiceDelete(s *v1.Service) {
	r.Tracker.OnServiceDelete(s)
	r.add("delete Service " + s.Name)
}
func (r *recorder) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) {
	r.Tracker.OnEndpointSliceAdd(s)
	r.add("add EndpointSlice " + s.Name)
}
func (r *recorder) OnEndpointSliceUpdate(o, s *discoveryv1.EndpointSlice) {
	r.Tracker.OnEndpointSliceUpdate(o, s)
	r.add("update EndpointSlice " + s.Name)
}
func (r *recorder) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) {
	r.Tracker.OnEndpointSliceDelete(s)
	r.add("delete EndpointSlice " + s.Name)
}
func (r *recorder) OnSynced() {
	r.Tracker.OnSynced()
	r.add("synced")
}

func (r *recorder) lookup(dst string) []string {
	ap := netip.MustParseAddrPort(dst)
	p, v := r.Current().Lookup(service.TCP, ap.Addr(), ap.Port())
	if p == nil || v != service.Forward {
		return []string{v.String()}
	}
	return p.EndpointKeys
}

func svc(name, ip string, labels map[string]string) *v1.Service {
	return &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: name, Labels: labels},
		Spec: v1.ServiceSpec{
			ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}},
		},
	}
}

func slice(name, svcName string, labels map[string]string, addrs ...string) *discoveryv1.EndpointSlice {
	l := map[string]string{discoveryv1.LabelServiceName: svcName}
	for k, v := range labels {
		l[k] = v
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "ns1", Name: name, Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(v1.ProtocolTCP)}},
	}
	for _, a := range addrs {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// start runs a Source until the test ends.
func start(t *testing.T, src *kube.Source) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// controllerLabels are the labels the EndpointSlice controller puts on a
// slice of a Service with labels svcLabels (k8s.io/endpointslice utils.go
// setEndpointSliceLabels): the Service's own labels, the managed-by label,
// and service.kubernetes.io/headless when the Service is headless.
func controllerLabels(svcLabels map[string]string, headless bool) map[string]string {
	l := map[string]string{discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
	for k, v := range svcLabels {
		l[k] = v
	}
	if headless {
		l[v1.IsHeadlessService] = ""
	}
	return l
}

func TestSyncAddUpdateDelete(t *testing.T) {
	otherProxy := map[string]string{"service.kubernetes.io/service-proxy-name": "foo"}
	client := fake.NewClientset(
		svc("web", "10.96.0.10", nil),
		slice("web-1", "web", controllerLabels(nil, false), "10.0.0.1"),
		// A headless service and its slice: watched, for cluster DNS, and
		// not proxied.
		svc("db", v1.ClusterIPNone, nil),
		slice("db-1", "db", controllerLabels(nil, true), "10.0.0.9"),
		// Another proxy's service is not watched (kube-proxy's
		// labelSelectorNoProxyName); its slice, which carries the label too,
		// is, as kube-proxy watches it, and serves nothing.
		svc("other-proxy", "10.96.0.11", otherProxy),
		slice("other-proxy-1", "other-proxy", controllerLabels(otherProxy, false), "10.0.0.11"),
	)
	var selectors sync.Map
	client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		selectors.Store(a.GetResource().Resource, a.(k8stesting.ListAction).GetListRestrictions().Labels.String())
		return false, nil, nil
	})
	rec := newRecorder(t)
	src := kube.New(client, rec, zap.NewNop())
	start(t, src)

	initial := []string{"add Service web", "add EndpointSlice web-1", "add Service db", "add EndpointSlice db-1",
		"add EndpointSlice other-proxy-1", "synced"}
	got := rec.wait(t, initial...)
	if got[len(got)-1] != "synced" || len(got) != len(initial) {
		t.Fatalf("initial events %v: want %v, synced last", got, initial)
	}
	if !src.Synced() || !src.Stats().Connected {
		t.Errorf("stats after sync: %+v", src.Stats())
	}
	for res, selector := range map[string]string{"services": kube.ServiceSelector, "endpointslices": kube.EndpointSliceSelector} {
		want, err := labels.Parse(selector)
		if err != nil {
			t.Fatal(err)
		}
		sel, _ := selectors.Load(res)
		if sel != want.String() {
			t.Errorf("%s listed with selector %q, want %q", res, sel, want)
		}
	}
	if diff := cmp.Diff([]string{"10.0.0.1:8080"}, rec.lookup("10.96.0.10:80")); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"NotService"}, rec.lookup("10.96.0.11:80")); diff != "" {
		t.Errorf("another proxy's service in the table (-want +got):\n%s", diff)
	}
	// The headless service: its endpoint in the DNS view, nothing proxied.
	dns, ok := rec.Current().DNSService("ns1", "db")
	if !ok || len(dns.Endpoints) != 1 || dns.Endpoints[0].Addr != netip.MustParseAddr("10.0.0.9") {
		t.Errorf("DNS view of the headless service: %+v, %v; want its endpoint 10.0.0.9", dns, ok)
	}
	if diff := cmp.Diff([]string{"NotService"}, rec.lookup("10.0.0.9:8080")); diff != "" {
		t.Errorf("headless endpoint in the table (-want +got):\n%s", diff)
	}
	wantSkipped := []service.Skipped{{Service: service.ServiceName{Namespace: "ns1", Name: "db"}, Reason: service.ReasonHeadless}}
	if diff := cmp.Diff(wantSkipped, rec.Current().Skipped()); diff != "" {
		t.Errorf("Skipped (-want +got):\n%s", diff)
	}

	ctx := context.Background()
	slices := client.DiscoveryV1().EndpointSlices("ns1")
	services := client.CoreV1().Services("ns1")

	// add
	if _, err := services.Create(ctx, svc("api", "10.96.0.12", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := slices.Create(ctx, slice("api-1", "api", nil, "10.0.0.5"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "add Service api", "add EndpointSlice api-1")
	if diff := cmp.Diff([]string{"10.0.0.5:8080"}, rec.lookup("10.96.0.12:80")); diff != "" {
		t.Errorf("table after add (-want +got):\n%s", diff)
	}

	// update
	if _, err := slices.Update(ctx, slice("web-1", "web", nil, "10.0.0.1", "10.0.0.2"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "update EndpointSlice web-1")
	if diff := cmp.Diff([]string{"10.0.0.1:8080", "10.0.0.2:8080"}, rec.lookup("10.96.0.10:80")); diff != "" {
		t.Errorf("table after update (-want +got):\n%s", diff)
	}

	// delete
	if err := services.Delete(ctx, "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "delete Service api")
	if diff := cmp.Diff([]string{"NotService"}, rec.lookup("10.96.0.12:80")); diff != "" {
		t.Errorf("table after delete (-want +got):\n%s", diff)
	}
}

// TestDisconnect cuts the API server off (every list and watch fails and
// open watches close), checks that the table keeps serving and that the
// outage is logged once however many retries fail, then reconnects and
// checks that changes flow again.
func TestDisconnect(t *testing.T) {
	client := fake.NewClientset(svc("web", "10.96.0.10", nil), slice("web-1", "web", nil, "10.0.0.1"))
	var down atomic.Bool
	outage := errors.New("dial tcp 127.0.0.1:6443: connect: no route to host")
	var mu sync.Mutex
	var watchers []watch.Interface
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, nil, outage
		}
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), a.(k8stesting.WatchActionImpl).ListOptions)
		if err != nil {
			return true, nil, err
		}
		mu.Lock()
		watchers = append(watchers, w)
		mu.Unlock()
		return true, w, nil
	})
	client.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, outage
		}
		return false, nil, nil
	})

	core, logs := observer.New(zapcore.InfoLevel)
	rec := newRecorder(t)
	src := kube.New(client, rec, zap.New(core))
	start(t, src)
	rec.wait(t, "synced")
	before := rec.Current()

	// Cut: fail new calls, close the open watches.
	down.Store(true)
	mu.Lock()
	for _, w := range watchers {
		w.Stop()
	}
	watchers = nil
	mu.Unlock()
	waitFor(t, func() bool { return src.Stats().Errors >= 4 })

	st := src.Stats()
	if st.Connected || st.Outages != 1 || st.DisconnectedSince.IsZero() || !strings.Contains(st.LastError, "no route to host") {
		t.Errorf("stats during the outage: %+v", st)
	}
	if err := src.LastError(); !errors.Is(err, outage) {
		t.Errorf("LastError during the outage = %v", err)
	}
	if n := logs.FilterMessageSnippet("unreachable").Len(); n != 1 {
		t.Errorf("outage logged %d times after %d failed calls, want once", n, st.Errors)
	}
	if rec.Current() != before {
		t.Error("the table changed during the outage")
	}
	if diff := cmp.Diff([]string{"10.0.0.1:8080"}, rec.lookup("10.96.0.10:80")); diff != "" {
		t.Errorf("table during the outage (-want +got):\n%s", diff)
	}
	// Changes made while cut off arrive after reconnection.
	if err := client.Tracker().Update(discoveryv1.SchemeGroupVersion.WithResource("endpointslices"),
		slice("web-1", "web", nil, "10.0.0.1", "10.0.0.3"), "ns1"); err != nil {
		t.Fatal(err)
	}

	down.Store(false)
	rec.wait(t, "update EndpointSlice web-1")
	waitFor(t, func() bool { return src.Stats().Connected })
	if n := logs.FilterMessageSnippet("reachable again").Len(); n != 1 {
		t.Errorf("recovery logged %d times, want once", n)
	}
	if src.LastError() != nil {
		t.Errorf("LastError after recovery: %v", src.LastError())
	}
	if diff := cmp.Diff([]string{"10.0.0.1:8080", "10.0.0.3:8080"}, rec.lookup("10.96.0.10:80")); diff != "" {
		t.Errorf("table after recovery (-want +got):\n%s", diff)
	}
	if _, err := client.CoreV1().Services("ns1").Create(context.Background(), svc("api", "10.96.0.12", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, "add Service api")
}

// TestEmptyWatchIsAnOutage: once its retries of a connection that is
// accepted and then reset run out (a load balancer in front of a stopped API
// server), client-go's Watch returns an empty, closed watch and no error.
// That must count as a failed call; a watch that stays open counts as an
// answer again.
func TestEmptyWatchIsAnOutage(t *testing.T) {
	client := fake.NewClientset(svc("web", "10.96.0.10", nil), slice("web-1", "web", nil, "10.0.0.1"))
	var down atomic.Bool
	var mu sync.Mutex
	var watchers []watch.Interface
	client.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if down.Load() {
			return true, watch.NewEmptyWatch(), nil
		}
		w, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace(), a.(k8stesting.WatchActionImpl).ListOptions)
		if err != nil {
			return true, nil, err
		}
		mu.Lock()
		watchers = append(watchers, w)
		mu.Unlock()
		return true, w, nil
	})
	rec := newRecorder(t)
	src := kube.New(client, rec, nil)
	start(t, src)
	rec.wait(t, "synced")
	// A quiet, open watch is an answer: no error after it settled.
	time.Sleep(1500 * time.Millisecond)
	if err := src.LastError(); err != nil || !src.Stats().Connected {
		t.Fatalf("with open watches: LastError %v, stats %+v", err, src.Stats())
	}

	down.Store(true)
	mu.Lock()
	for _, w := range watchers {
		w.Stop()
	}
	watchers = nil
	mu.Unlock()
	waitFor(t, func() bool {
		err := src.LastError()
		return err != nil && strings.Contains(err.Error(), "closed at once without an event")
	})
	if st := src.Stats(); st.Outages == 0 {
		t.Errorf("no outage counted: %+v", st)
	}

	down.Store(false)
	waitFor(t, func() bool { return src.LastError() == nil && src.Stats().Connected })
}

// TestRunStopsBeforeSync: a Source that never syncs (the API server is
// down from the start) stops cleanly and never calls OnSynced.
func TestRunStopsBeforeSync(t *testing.T) {
	client := fake.NewClientset()
	client.PrependReactor("list", "*", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	rec := newRecorder(t)
	src := kube.New(client, rec, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	waitFor(t, func() bool { return src.Stats().Errors >= 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if src.Synced() || rec.Current() != nil {
		t.Error("synced without an API server")
	}
}

func TestNewClient(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if _, err := kube.NewClient(""); err == nil || !strings.Contains(err.Error(), "in-cluster") {
		t.Errorf("NewClient(\"\") outside a cluster: %v", err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	const kc = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: ctx
  context: {cluster: c, user: u}
current-context: ctx
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := kube.RESTConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.QPS != 5 || cfg.UserAgent != "userproxy" {
		t.Errorf("config: host %q qps %v agent %q", cfg.Host, cfg.QPS, cfg.UserAgent)
	}
	if _, err := kube.NewClient(path); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.NewClient(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing kubeconfig was accepted")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

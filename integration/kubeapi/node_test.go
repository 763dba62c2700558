package kubeapi_test

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// This node's Node from the real API server (issue 17), wired as run wires
// it: its topology.kubernetes.io/zone label sets the zone topology hints
// select by, and the cluster autoscaler's taint makes kube-proxy's /healthz
// say nodeEligible false (503), /livez staying 200.
func TestNodeZoneAndEligibility(t *testing.T) {
	_, cs := startCluster(t)
	ctx := ctxT(t)
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-z", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}
	if _, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ns := newNamespace(t, cs)
	p := startSource(t, cs, 0, nil)
	health := admin.NewProxierHealth(p.tracker, nil, true, 0, nil)
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- kube.WatchNode(wctx, cs, "node-z", nil, func(st kube.NodeState) {
			health.SetNodeEligible(st.Eligible)
			p.tracker.SetZone(st.Zone)
		})
	}()
	t.Cleanup(func() { cancel(); <-done })

	svc, err := cs.CoreV1().Services(ns).Create(ctx, newService(ns, "web"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	es := newSlice(ns, "web-1", "web", discoveryv1.AddressTypeIPv4, eps("10.1.0.1", "10.1.0.2")...)
	for i, zone := range []string{"zone-a", "zone-b"} {
		es.Endpoints[i].Zone = ptr(zone)
		es.Endpoints[i].Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	keysNow := func() string {
		tbl := p.tracker.Current()
		if tbl == nil {
			return ""
		}
		for _, port := range tbl.Service(service.ServiceName{Namespace: ns, Name: "web"}) {
			if port.Port == 80 && port.ClusterIP.String() == svc.Spec.ClusterIP {
				return strings.Join(port.EndpointKeys, ",")
			}
		}
		return ""
	}
	waitKeys := func(want string) {
		t.Helper()
		if _, ok := waitFor(30*time.Second, func() bool { return keysNow() == want }); !ok {
			t.Fatalf("endpoints %q, want %q (zone %q)", keysNow(), want, p.tracker.Zone())
		}
	}
	waitKeys("10.1.0.1:8080") // the Node says zone-a: the zone-a hint wins

	// The Node moves to zone-b: the other endpoint.
	n, err := cs.CoreV1().Nodes().Get(ctx, "node-z", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[v1.LabelTopologyZone] = "zone-b"
	if n, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKeys("10.1.0.2:8080")

	srv := httptest.NewServer(health.Handler())
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/healthz"); code != 200 || !strings.Contains(body, `"nodeEligible":true`) {
		t.Fatalf("before the taint: %d %s", code, body)
	}
	// The cluster autoscaler is about to delete the node.
	n.Spec.Taints = []v1.Taint{{Key: kube.ToBeDeletedTaint, Value: "1701234567", Effect: v1.TaintEffectNoSchedule}}
	if _, err := cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took, ok := waitFor(30*time.Second, func() bool { code, _ := get("/healthz"); return code == 503 })
	if !ok {
		code, body := get("/healthz")
		t.Fatalf("after the taint: %d %s", code, body)
	}
	code, body := get("/healthz")
	if !strings.Contains(body, `"nodeEligible":false`) {
		t.Fatalf("after the taint: %d %s", code, body)
	}
	if code, _ := get("/livez"); code != 200 {
		t.Fatalf("/livez after the taint: %d", code)
	}
	t.Logf("tainted: /healthz %d %s after %v", code, body, took.Round(time.Millisecond))
}

package kube_test

import (
	"context"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/userproxy/userproxy/source/kube"
)

// The Node's state as kube-proxy reads it (pkg/proxy/healthcheck/proxy_health.go
// SyncNode): eligible unless being deleted or tainted by the cluster
// autoscaler; the zone from topology.kubernetes.io/zone.
func TestNodeStateOf(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name    string
		node    v1.Node
		deleted bool
		want    kube.NodeState
	}{
		{"plain", v1.Node{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}, false, kube.NodeState{Zone: "zone-a", Eligible: true}},
		{"being deleted", v1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now}}, false, kube.NodeState{}},
		{"gone", v1.Node{}, true, kube.NodeState{}},
		{"autoscaler taint", v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: kube.ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}}}, false, kube.NodeState{}},
		{"another taint", v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: "example.com/x", Effect: v1.TaintEffectNoSchedule}}}}, false, kube.NodeState{Eligible: true}},
	} {
		if got := kube.NodeStateOf(&tc.node, tc.deleted); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// WatchNode follows this node only: its label and taint changes arrive,
// another node's do not.
func TestWatchNodeFollowsItsNode(t *testing.T) {
	mine := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}
	other := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b", Labels: map[string]string{v1.LabelTopologyZone: "zone-b"}}}
	client := fake.NewClientset(mine, other)
	var mu sync.Mutex
	var got []kube.NodeState
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = kube.WatchNode(ctx, client, "node-a", nil, func(s kube.NodeState) { mu.Lock(); got = append(got, s); mu.Unlock() })
	}()
	defer func() { cancel(); <-done }()
	wait := func(n int) []kube.NodeState {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			g := append([]kube.NodeState(nil), got...)
			mu.Unlock()
			if len(g) >= n {
				return g
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d node states, want %d: %+v", len(g), n, g)
			}
		}
	}
	if g := wait(1); g[0] != (kube.NodeState{Zone: "zone-a", Eligible: true}) {
		t.Fatalf("first state %+v", g[0])
	}
	tainted := mine.DeepCopy()
	tainted.Labels[v1.LabelTopologyZone] = "zone-c"
	tainted.Spec.Taints = []v1.Taint{{Key: kube.ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
	if _, err := client.CoreV1().Nodes().Update(ctx, tainted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if g := wait(2); g[1] != (kube.NodeState{Zone: "zone-c"}) {
		t.Fatalf("after the taint: %+v", g[1])
	}
	// Another node changes, then this one: only this one's state arrives
	// (the fake clientset ignores field selectors, so the other node's
	// event does reach the informer, and WatchNode must drop it).
	moved := other.DeepCopy()
	moved.Labels[v1.LabelTopologyZone] = "zone-z"
	if _, err := client.CoreV1().Nodes().Update(ctx, moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	again := tainted.DeepCopy()
	again.Labels[v1.LabelTopologyZone] = "zone-d"
	if _, err := client.CoreV1().Nodes().Update(ctx, again, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	g := wait(3)
	for _, st := range g {
		if st.Zone == "zone-b" || st.Zone == "zone-z" {
			t.Fatalf("another node's state arrived: %+v", g)
		}
	}
	if g[2].Zone != "zone-d" {
		t.Fatalf("third state %+v, want zone-d", g[2])
	}
}

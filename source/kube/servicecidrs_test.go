package kube_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/userproxy/userproxy/source/kube"
)

func serviceCIDR(name string, cidrs ...string) *networkingv1.ServiceCIDR {
	return &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
}

// TestWatchServiceCIDRs: the union of every ServiceCIDR's spec.cidrs,
// sorted and without duplicates, on start and after each change that
// changes it (kube-proxy's ServiceCIDRConfig, pkg/proxy/config).
func TestWatchServiceCIDRs(t *testing.T) {
	client := fake.NewClientset(serviceCIDR("kubernetes", "10.96.0.0/12", "fd00:96::/112"))
	var mu sync.Mutex
	var got [][]netip.Prefix
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- kube.WatchServiceCIDRs(ctx, client, nil, func(c []netip.Prefix) { mu.Lock(); got = append(got, c); mu.Unlock() })
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchServiceCIDRs: %v", err)
		}
	}()
	wait := func(want ...string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			var last []netip.Prefix
			if len(got) > 0 {
				last = got[len(got)-1]
			}
			n := len(got)
			mu.Unlock()
			var w []netip.Prefix
			for _, s := range want {
				w = append(w, netip.MustParsePrefix(s))
			}
			if n > 0 && slices.Equal(last, w) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("service CIDRs %v, want %v", last, w)
			}
		}
	}
	wait("10.96.0.0/12", "fd00:96::/112")
	if _, err := client.NetworkingV1().ServiceCIDRs().Create(ctx, serviceCIDR("k3s", "10.43.0.0/16", "10.96.0.0/12"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("10.43.0.0/16", "10.96.0.0/12", "fd00:96::/112")
	mu.Lock()
	calls := len(got)
	mu.Unlock()
	// A change that leaves the union as it was is not reported.
	relabelled := serviceCIDR("k3s", "10.43.0.0/16", "10.96.0.0/12")
	relabelled.Labels = map[string]string{"a": "b"}
	if _, err := client.NetworkingV1().ServiceCIDRs().Update(ctx, relabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.NetworkingV1().ServiceCIDRs().Delete(ctx, "kubernetes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("10.43.0.0/16", "10.96.0.0/12")
	mu.Lock()
	if len(got) != calls+1 {
		t.Errorf("%d reports after an update that changed nothing and a delete, want 1", len(got)-calls)
	}
	mu.Unlock()
}

// TestWatchServiceCIDRsUnavailable: an API server without the resource, or
// an identity that may not list it, is reported at once, not retried.
func TestWatchServiceCIDRsUnavailable(t *testing.T) {
	gr := schema.GroupResource{Group: "networking.k8s.io", Resource: "servicecidrs"}
	for name, refusal := range map[string]error{
		"forbidden": apierrors.NewForbidden(gr, "", errors.New("RBAC: no list")),
		"not found": apierrors.NewNotFound(gr, ""),
	} {
		client := fake.NewClientset()
		client.PrependReactor("list", "servicecidrs", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, refusal })
		err := kube.WatchServiceCIDRs(context.Background(), client, nil, func([]netip.Prefix) { t.Errorf("%s: set called", name) })
		if !errors.Is(err, kube.ErrServiceCIDRsUnavailable) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

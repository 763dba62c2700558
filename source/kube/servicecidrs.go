package kube

// The cluster's ServiceCIDR objects (networking.k8s.io/v1), which kube-proxy
// watches when MultiCIDRServiceAllocator is on (cmd/kube-proxy/app
// server.go, pkg/proxy/config ServiceCIDRConfig) and which say where the
// API server allocates ClusterIPs:
//
//  1. WatchServiceCIDRs first lists them once. An API server without the
//     resource (404) or an identity without list on it (403: kube-proxy's
//     ClusterRole system:node-proxier has it only with the feature gate on)
//     is told to the caller (ErrServiceCIDRsUnavailable) and not watched:
//     the routes then follow the flags alone.
//  2. Otherwise one informer watches them all; after every add, update and
//     delete, set gets the union of every object's spec.cidrs, sorted and
//     without duplicates, when it differs from the last one sent. As
//     kube-proxy, an object being deleted still counts: its ClusterIPs
//     stay allocated until it is gone.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"go.uber.org/zap"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ErrServiceCIDRsUnavailable is WatchServiceCIDRs' answer when the API
// server has no ServiceCIDRs or refuses to list them (step 1).
var ErrServiceCIDRsUnavailable = errors.New("the API server's ServiceCIDRs cannot be listed")

// ServiceCIDRsOf is the union of the objects' spec.cidrs, sorted, without
// duplicates; a CIDR that does not parse (the API server validates them)
// is left out.
func ServiceCIDRsOf(objs []*networkingv1.ServiceCIDR) []netip.Prefix {
	var out []netip.Prefix
	for _, o := range objs {
		for _, c := range o.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out)
}

// WatchServiceCIDRs calls set with the cluster's service CIDRs (step 2)
// until ctx is done, then returns nil. It returns at once, wrapping
// ErrServiceCIDRsUnavailable, when the first list says the resource is
// missing or forbidden; any other error of that list is left to the
// informer, which retries.
func WatchServiceCIDRs(ctx context.Context, client kubernetes.Interface, logger *zap.Logger, set func([]netip.Prefix)) error {
	if logger == nil {
		logger = zap.NewNop()
	}
	_, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsMethodNotSupported(err) {
		return fmt.Errorf("%w: %w", ErrServiceCIDRsUnavailable, err)
	}
	ctx = klog.NewContext(ctx, klogToZap(logger))
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return client.NetworkingV1().ServiceCIDRs().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return client.NetworkingV1().ServiceCIDRs().Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&networkingv1.ServiceCIDR{}, cache.SharedIndexInformerOptions{ResyncPeriod: 0})
	var last []netip.Prefix
	sent := false
	report := func(any) {
		var objs []*networkingv1.ServiceCIDR
		for _, o := range inf.GetStore().List() {
			if sc, ok := o.(*networkingv1.ServiceCIDR); ok {
				objs = append(objs, sc)
			}
		}
		cidrs := ServiceCIDRsOf(objs)
		if sent && slices.Equal(cidrs, last) {
			return
		}
		last, sent = cidrs, true
		logger.Info("service CIDRs of the cluster", zap.Stringers("cidrs", cidrs))
		set(cidrs)
	}
	// One handler: the informer calls it from one goroutine, in order.
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    report,
		UpdateFunc: func(_, obj any) { report(obj) },
		DeleteFunc: report,
	}); err != nil {
		return fmt.Errorf("servicecidr informer: %w", err)
	}
	inf.RunWithContext(ctx)
	return nil
}

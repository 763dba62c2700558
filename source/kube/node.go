package kube

// This node's Node object, as kube-proxy watches it (cmd/kube-proxy/app
// server.go, NodeEligibleHandler and the topology label; pkg/proxy/healthcheck
// proxy_health.go SyncNode):
//
//  1. WatchNode runs one informer on the Node named name only (a field
//     selector on metadata.name: RBAC get, list, watch on nodes).
//  2. Every add, update and delete becomes a NodeState: the node's zone
//     (its topology.kubernetes.io/zone label, for topology hints) and
//     whether it is eligible for traffic (not being deleted, not tainted
//     ToBeDeletedByClusterAutoscaler: /healthz's nodeEligible). A deleted
//     Node is not eligible.

import (
	"context"
	"fmt"

	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfields "k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a node it is
// about to delete (kube-proxy's healthcheck.ToBeDeletedTaint).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// NodeState is what the proxy reads of its Node.
type NodeState struct {
	// Zone is the topology.kubernetes.io/zone label ("" when unset).
	Zone string
	// Eligible is false while the Node is being deleted, is gone, or
	// carries ToBeDeletedTaint.
	Eligible bool
}

// NodeStateOf returns node's state; deleted says the Node is gone.
func NodeStateOf(node *v1.Node, deleted bool) NodeState {
	st := NodeState{Zone: node.Labels[v1.LabelTopologyZone], Eligible: !deleted && node.DeletionTimestamp.IsZero()}
	for _, taint := range node.Spec.Taints {
		if taint.Key == ToBeDeletedTaint {
			st.Eligible = false
		}
	}
	return st
}

// WatchNode calls on with the state of the Node named name at every change
// (step 2), until ctx is done. It returns when ctx is done, or at once when
// the informer cannot be set up.
func WatchNode(ctx context.Context, client kubernetes.Interface, name string, logger *zap.Logger, on func(NodeState)) error {
	if logger == nil {
		logger = zap.NewNop()
	}
	ctx = klog.NewContext(ctx, klogToZap(logger))
	selector := k8sfields.OneTermEqualSelector(metav1.ObjectNameField, name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return client.CoreV1().Nodes().List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return client.CoreV1().Nodes().Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), &v1.Node{}, cache.SharedIndexInformerOptions{ResyncPeriod: 0})
	report := func(obj any, deleted bool) {
		if n, ok := tombstone(obj).(*v1.Node); ok && n.Name == name {
			st := NodeStateOf(n, deleted)
			logger.Debug("node", zap.String("node", name), zap.String("zone", st.Zone), zap.Bool("eligible", st.Eligible), zap.Bool("deleted", deleted))
			on(st)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { report(obj, false) },
		UpdateFunc: func(_, obj any) { report(obj, false) },
		DeleteFunc: func(obj any) { report(obj, true) },
	}); err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	inf.RunWithContext(ctx)
	return nil
}

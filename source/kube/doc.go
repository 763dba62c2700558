// Package kube watches Services and EndpointSlices on a Kubernetes API server
// with client-go shared informers, filtered as kube-proxy filters them
// (Selector), and delivers them to a service.Handler; OnSynced comes once
// both caches have synced. While the API server is unreachable it keeps
// retrying, delivers nothing (so the last table keeps serving), and logs the
// outage once when it starts and once when it ends.
//
// Callers: cmd (`userproxy run --kubeconfig PATH`, or in cluster), with a
// client from NewClient; tests pass client-go's fake clientset.
//
// client-go's own log lines go to the Source's logger at debug level through
// the informers' context; code outside the informers that logs with klog's
// global logger is cmd's to route (klog.SetLogger).
//
// It may import service and nothing else of userproxy.
package kube

// Package kube watches Services and EndpointSlices on a Kubernetes API server
// with client-go shared informers, and delivers them to a service.Handler;
// OnSynced comes once both caches have synced. Services handed to another
// proxy are not watched, as kube-proxy does not watch them
// (ServiceSelector); headless Services and their EndpointSlices, which
// kube-proxy does not watch either, are, for cluster DNS
// (EndpointSliceSelector), and the Tracker does not proxy them. While the API server is unreachable it keeps
// retrying, delivers nothing (so the last table keeps serving), and logs the
// outage once when it starts and once when it ends.
//
// It also owns the way to pods the host cannot route to: PortForwarder
// (portforward.go) carries TCP flows through the API server's
// pods/portforward with client-go's port-forward dialers, one tunnel per
// pod, for proxy's --dial-via apiserver|auto (it is a proxy.PodDialer,
// without importing proxy).
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

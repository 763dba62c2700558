// Package kube watches Services and EndpointSlices on a Kubernetes API server
// with client-go shared informers, filtered as kube-proxy filters them, and
// delivers them to a service.Tracker.
//
// It may import service and nothing else of userproxy.
package kube

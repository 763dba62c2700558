// Package service turns Kubernetes Services and EndpointSlices into an
// immutable Table of service ports with their usable endpoints, in the order
// and with the selection rules of kube-proxy, and coalesces changes into new
// tables (Tracker).
//
// Callers: source (feeds objects into a Tracker), proxy (looks up flows),
// admin (lists services).
//
// It is pure: it imports only k8s.io/api and k8s.io/apimachinery types to
// convert them, and no other userproxy package; no client-go, no logging.
package service

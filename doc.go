// Package userproxy is the root of the userproxy module: a userspace Kubernetes
// Service proxy with kube-proxy iptables-mode semantics, built on a TUN device
// and gVisor's netstack instead of kernel netfilter.
//
// The root package holds no code of its own; it keeps the repository-wide
// tests (package documentation and import directions, see layout_test.go).
// The map of packages is in DESIGN.md section 1 and docs/internals.md.
package userproxy

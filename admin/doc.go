// Package admin serves the operator's HTTP endpoints: /healthz, /livez,
// /metrics (Prometheus, from the Stats snapshots of the pure packages),
// /debug/conntrack, /debug/services and /debug/rules.
//
// Callers: cmd.
//
// It may import proxy, conntrack and service of userproxy.
package admin

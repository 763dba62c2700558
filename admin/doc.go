// Package admin serves the operator's HTTP endpoints: /healthz, /livez,
// /metrics (Prometheus, from the Stats snapshots of the pure packages),
// /debug/conntrack, /debug/services, /debug/rules and /debug/dns, and has
// the client calls the CLI makes to a running proxy. The text of
// /debug/rules is package rules' (its printer knows no HTTP); admin picks
// the options from the query.
//
// Callers: cmd.
//
// It may import proxy, conntrack, service, balancer, clusterdns and rules of
// userproxy. It must not import netstack (GateStats mirrors netstack.Stats
// instead) nor gVisor.
package admin

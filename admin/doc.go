// Package admin serves the operator's HTTP endpoints: /healthz, /livez,
// /metrics (Prometheus, from the Stats snapshots of the pure packages),
// /debug/conntrack, /debug/services, /debug/rules and /debug/dns. It also
// prints the iptables rules kube-proxy would write for a service table
// (WriteRules), and has the client calls the CLI makes to a running proxy.
//
// Callers: cmd.
//
// It may import proxy, conntrack, service, balancer and clusterdns of
// userproxy. It must not import netstack (GateStats mirrors netstack.Stats
// instead) nor gVisor.
package admin

// Package proxy is the glue of the datapath: for a new flow it looks up the
// service port in the current service.Table, asks the balancer for an
// endpoint, dials it first, and splices the client to it; it relays UDP
// sessions, answers admission for the gate, and cleans up conntrack and
// affinity state when endpoints change.
//
// Callers: cmd (wiring) and admin (stats).
//
// It may import netstack, service, balancer and conntrack of userproxy, and
// never gVisor directly.
package proxy

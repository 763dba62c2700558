// Package proxy is the glue of the datapath: for a new flow it looks up the
// service port in the current service.Table, asks the balancer for an
// endpoint, dials it first, and splices the client to it; it relays UDP
// sessions (once bound, a session's client datagrams are written to the
// endpoint socket by the gate itself: netstack's UDP bypass), answers admission for the gate, and cleans up conntrack and
// affinity state when endpoints change. Flows to an address registered
// with SetLocal that no service port claims are handed to a LocalHandler
// in-process (cluster DNS at the DNS service IP).
//
// Callers: cmd (wiring) and admin (stats).
//
// It may import netstack, service, balancer and conntrack of userproxy, and
// never gVisor directly; local servers reach it only through the
// LocalHandler interface (it does not import clusterdns).
package proxy

// Package rules prints what the kernel-side tools of a kube-proxy node
// would show for our service table, so that the proxy can be held against
// such a node line for line: the iptables-save (or iptables-restore) lines
// kube-proxy's iptables mode writes (Write).
//
// Callers: admin serves it (/debug/rules); cmd prints it (`userproxy
// rules`, offline from a config too).
//
// It is pure: plain values in, text to an io.Writer out. It may import
// service and balancer of userproxy; it must not import proxy, nor
// net/http, netstack or gVisor.
package rules

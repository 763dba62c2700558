// Package rules prints what the kernel-side tools of a kube-proxy node
// would show for our service table, so that the proxy can be held against
// such a node line for line: the iptables-save (or iptables-restore) lines
// kube-proxy's iptables mode writes (Write: ClusterIPs in iptables.go;
// NodePorts, external IPs, load-balancer IPs and --nodeport-addresses in
// external.go), and the `ipvsadm -Ln` table of its IPVS mode (WriteIPVS,
// ipvsadm.go).
//
// Callers: admin serves both (/debug/rules, /debug/ipvs); cmd prints them
// (`userproxy rules`, offline from a config too, and `userproxy ipvs`).
//
// It is pure: plain values in, text to an io.Writer out. It may import
// service and balancer of userproxy; it must not import proxy (WriteIPVS
// takes its own input types, which admin fills from proxy's snapshot), nor
// net/http, netstack or gVisor.
package rules

// Command userproxy is the userspace Kubernetes Service proxy's binary: flag
// parsing, the logger, the wiring of the packages, and the subcommands run,
// setup, conntrack, rules, ipvs, demo and version (DESIGN.md section 5).
//
// run also wires cluster DNS (clusterdns) into the proxy as the local
// server at the DNS service IP, and registers it with systemd-resolved for
// the TUN on Linux (hostdns_linux.go; elsewhere it logs the lines to add).
// It may import any userproxy package.
package main

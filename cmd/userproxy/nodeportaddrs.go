package main

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// defaultNodePortAddresses serves NodePorts on loopback only: `curl
// localhost:NODEPORT` works on a laptop, and nothing is exposed to its
// network. kube-proxy's default is every local address; a node agent sets
// the node's (examples/kubernetes).
const defaultNodePortAddresses = "127.0.0.0/8,::1/128"

// nodePortAddrs resolves --nodeport-addresses (kube-proxy's syntax: a
// comma-separated list of CIDRs, or "primary" for the node's primary
// address of each family) to the host's own addresses it covers.
func nodePortAddrs(spec string) ([]netip.Addr, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, nil
	}
	var cidrs []netip.Prefix
	var primary bool
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "primary" {
			primary = true
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("--nodeport-addresses: %q: want CIDRs or \"primary\": %w", part, err)
		}
		cidrs = append(cidrs, p.Masked())
	}
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("--nodeport-addresses: reading this host's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || p.Addr().IsLinkLocalUnicast() {
			continue
		}
		addr := p.Addr().Unmap()
		if slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(addr) }) && !slices.Contains(out, addr) {
			out = append(out, addr)
		}
	}
	if primary {
		prim, err := primaryAddrs()
		if err != nil {
			return nil, fmt.Errorf("--nodeport-addresses primary: %w", err)
		}
		for _, a := range prim {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	if len(out) == 0 {
		return nil, fmt.Errorf("--nodeport-addresses %q covers none of this host's addresses", spec)
	}
	return out, nil
}

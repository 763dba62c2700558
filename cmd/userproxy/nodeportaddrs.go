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

// parseNodePortAddresses parses --nodeport-addresses, kube-proxy's syntax:
// a comma-separated list of CIDRs (host bits dropped, as kube-proxy's
// sloppy parsing does) and the keywords "primary", "localhost" (127.0.0.0/8
// and ::1/128) and "all" (every address), as kube-proxy v1.37 expands them
// (cmd/kube-proxy/app/server.go expandNodePortAddressKeywords).
func parseNodePortAddresses(spec string) (cidrs []netip.Prefix, primary bool, err error) {
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		switch part {
		case "":
			continue
		case "primary":
			primary = true
			continue
		case "localhost":
			cidrs = append(cidrs, netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"))
			continue
		case "all":
			cidrs = append(cidrs, netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0"))
			continue
		}
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, false, fmt.Errorf("--nodeport-addresses: %q: want CIDRs or \"primary\", \"localhost\", \"all\": %w", part, err)
		}
		cidrs = append(cidrs, p.Masked())
	}
	return cidrs, primary, nil
}

// nodePortAddrs resolves --nodeport-addresses to the host's own addresses
// it covers ("primary": the node's primary address of each family).
func nodePortAddrs(spec string) ([]netip.Addr, error) {
	cidrs, primary, err := parseNodePortAddresses(spec)
	if err != nil || (len(cidrs) == 0 && !primary) {
		return nil, err
	}
	host, err := interfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("--nodeport-addresses: reading this host's addresses: %w", err)
	}
	var out []netip.Addr
	for _, addr := range host {
		if !addr.IsLinkLocalUnicast() && slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(addr) }) && !slices.Contains(out, addr) {
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

// interfaceAddrs lists this host's interface addresses, as kube-proxy's
// NodePortAddresses.GetNodeIPs reads them (net.InterfaceAddrs).
func interfaceAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range addrs {
		var ip net.IP
		switch v := a.(type) {
		case *net.IPNet:
			ip = v.IP
		case *net.IPAddr:
			ip = v.IP
		default:
			continue
		}
		if addr, ok := netip.AddrFromSlice(ip); ok {
			out = append(out, addr.Unmap())
		}
	}
	return out, nil
}

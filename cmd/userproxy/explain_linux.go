//go:build linux

package main

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// describeRoute says where this host routes dst (the first step of a
// flow: into the proxy's TUN, or elsewhere) and returns client, or the
// route's source address when client is "".
func describeRoute(dst netip.Addr, tun, client string) (string, string) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return fmt.Sprintf("this host has no route to %s (%v): connections fail before any proxy sees them", dst, err), client
	}
	r := routes[0]
	if src, ok := netip.AddrFromSlice(r.Src); ok && client == "" && src.IsValid() {
		client = src.Unmap().String()
	}
	dev := fmt.Sprintf("interface %d", r.LinkIndex)
	if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
		dev = l.Attrs().Name
	}
	if r.Type == unix.RTN_LOCAL { // an address of this host
		return fmt.Sprintf("%s is an address of this host (the kernel's local table): connections to it never reach the TUN; see /readyz for what to do", dst), client
	}
	if dev != tun {
		return fmt.Sprintf("this host routes %s through %s, not the proxy's TUN %s: connections go there, not to the proxy (is it another proxy's TUN? --tun-name names this one)", dst, dev, tun), client
	}
	return fmt.Sprintf("this host routes %s into %s, the proxy's TUN", dst, tun), client
}

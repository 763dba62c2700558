package main

import (
	"net/netip"
	"testing"
)

// TestBSDRouteArgs: route(8) gets a host route for a single address and a
// network route otherwise, in the address's family (macOS's path; the
// command itself runs only there).
func TestBSDRouteArgs(t *testing.T) {
	for _, c := range []struct{ dst, family, kind, target string }{
		{"10.96.0.0/12", "-inet", "-net", "10.96.0.0/12"},
		{"203.0.113.10/32", "-inet", "-host", "203.0.113.10"},
		{"fd00:96::/112", "-inet6", "-net", "fd00:96::/112"},
		{"2001:db8::1/128", "-inet6", "-host", "2001:db8::1"},
	} {
		f, k, tg := bsdArgs(netip.MustParsePrefix(c.dst))
		if f != c.family || k != c.kind || tg != c.target {
			t.Errorf("%s: %s %s %s, want %s %s %s", c.dst, f, k, tg, c.family, c.kind, c.target)
		}
	}
}

package main

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// fakeRoutes is a routing table: routes present, and addresses whose add
// fails with denied.
type fakeRoutes struct {
	have   map[netip.Prefix]bool
	denied map[netip.Prefix]bool
}

var errDenied = errors.New("operation not permitted")

func (f *fakeRoutes) add(p netip.Prefix) error {
	switch {
	case f.denied[p]:
		return errDenied
	case f.have[p]:
		return errRouteExists
	}
	f.have[p] = true
	return nil
}

func (f *fakeRoutes) del(p netip.Prefix) error { delete(f.have, p); return nil }

func (f *fakeRoutes) list() []string {
	var out []string
	for p := range f.have {
		out = append(out, p.String())
	}
	slices.Sort(out)
	return out
}

func TestExtRoutes(t *testing.T) {
	mp := netip.MustParsePrefix
	ma := netip.MustParseAddr
	f := &fakeRoutes{have: map[netip.Prefix]bool{mp("203.0.113.9/32"): true}, denied: map[netip.Prefix]bool{mp("198.51.100.7/32"): true}}
	r := newExtRoutes(f, "upx0", []netip.Prefix{mp("10.96.0.0/12")}, zap.NewNop())
	// An address in the service CIDR needs no route; someone else's route
	// is used as is; a refused one is listed.
	r.Sync([]netip.Addr{ma("10.96.0.50"), ma("203.0.113.1"), ma("2001:db8::1"), ma("203.0.113.9"), ma("198.51.100.7")})
	want := []string{"2001:db8::1/128", "203.0.113.1/32", "203.0.113.9/32"}
	if got := f.list(); !slices.Equal(got, want) {
		t.Fatalf("routes %v, want %v", got, want)
	}
	if got := r.Unrouted(); len(got) != 1 || got[0] != ma("198.51.100.7") {
		t.Fatalf("unrouted %v", got)
	}
	if n := r.notes(); len(n) != 1 || !strings.Contains(n[0], "198.51.100.7 is not routed") || !strings.Contains(n[0], "dev upx0") {
		t.Fatalf("notes %q", n)
	}
	// The LB IP leaves; the foreign route stays though its address left too.
	r.Sync([]netip.Addr{ma("2001:db8::1")})
	if got, want := f.list(), []string{"2001:db8::1/128", "203.0.113.9/32"}; !slices.Equal(got, want) {
		t.Fatalf("after removal: routes %v, want %v", got, want)
	}
	if len(r.Unrouted()) != 0 {
		t.Fatalf("unrouted after the address left: %v", r.Unrouted())
	}
	// Exit removes only run's routes.
	r.Close()
	if got, want := f.list(), []string{"203.0.113.9/32"}; !slices.Equal(got, want) {
		t.Fatalf("after Close: routes %v, want %v", got, want)
	}
}

// TestExtRoutesServiceCIDRs: the cluster's service CIDRs (its ServiceCIDR
// objects) are routed while the cluster has them, except inside a
// --service-cidr; someone else's route is left alone; a refused one is a
// note, and so is one too wide to route; external addresses inside them
// lose their host route; Close takes back what was added.
func TestExtRoutesServiceCIDRs(t *testing.T) {
	mp := netip.MustParsePrefix
	ma := netip.MustParseAddr
	f := &fakeRoutes{have: map[netip.Prefix]bool{mp("10.200.0.0/16"): true}, denied: map[netip.Prefix]bool{mp("10.201.0.0/16"): true}}
	r := newExtRoutes(f, "upx0", []netip.Prefix{mp("10.96.0.0/12")}, zap.NewNop())
	r.Sync([]netip.Addr{ma("10.43.0.99")})
	if got := f.list(); !slices.Equal(got, []string{"10.200.0.0/16", "10.43.0.99/32"}) {
		t.Fatalf("routes before the cluster's CIDRs: %v", got)
	}
	all := r.SetServiceCIDRs([]netip.Prefix{mp("10.43.0.0/16"), mp("10.96.0.0/16"), mp("10.200.0.0/16"), mp("10.201.0.0/16")})
	if want := []netip.Prefix{mp("10.96.0.0/12"), mp("10.43.0.0/16"), mp("10.200.0.0/16"), mp("10.201.0.0/16")}; !slices.Equal(all, want) {
		t.Errorf("routed CIDRs %v, want %v", all, want)
	}
	// 10.96.0.0/16 is inside 10.96.0.0/12; 10.43.0.99 inside 10.43.0.0/16.
	if got := f.list(); !slices.Equal(got, []string{"10.200.0.0/16", "10.43.0.0/16"}) {
		t.Fatalf("routes with the cluster's CIDRs: %v", got)
	}
	if n := r.notes(); len(n) != 1 || !strings.Contains(n[0], "10.201.0.0/16 is not routed") {
		t.Fatalf("notes %q", n)
	}
	r.SetServiceCIDRs([]netip.Prefix{mp("10.96.0.0/16")})
	if got := f.list(); !slices.Equal(got, []string{"10.200.0.0/16", "10.43.0.99/32"}) {
		t.Fatalf("routes once the cluster dropped them: %v", got)
	}
	if n := r.notes(); len(n) != 0 {
		t.Fatalf("notes %q", n)
	}
	// A cluster CIDR wide enough to take the host's other traffic (the API
	// server validates no size) is noted, never routed.
	all = r.SetServiceCIDRs([]netip.Prefix{mp("0.0.0.0/0"), mp("fd00::/48"), mp("10.43.0.0/16")})
	if want := []netip.Prefix{mp("10.96.0.0/12"), mp("10.43.0.0/16")}; !slices.Equal(all, want) {
		t.Errorf("routed CIDRs with wide ones %v, want %v", all, want)
	}
	if got := f.list(); !slices.Equal(got, []string{"10.200.0.0/16", "10.43.0.0/16"}) {
		t.Fatalf("routes with wide cluster CIDRs: %v", got)
	}
	if n := r.notes(); len(n) != 2 || !strings.Contains(n[0], "0.0.0.0/0") || !strings.Contains(n[1], "fd00::/48") || !strings.Contains(n[0], "other traffic") {
		t.Fatalf("notes %q", n)
	}
	r.SetServiceCIDRs([]netip.Prefix{mp("10.44.0.0/16")})
	r.Close()
	if got := f.list(); !slices.Equal(got, []string{"10.200.0.0/16"}) {
		t.Fatalf("routes after Close: %v", got)
	}
}

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

package main

import (
	"net/netip"
	"testing"

	"go.uber.org/zap"
)

func TestLocalSources(t *testing.T) {
	l := newLocalSources([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, zap.NewNop())
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1", true}, // loopback is on every host
		{"10.244.3.7", true},
		{"10.245.0.1", false},
		{"203.0.113.200", false},
	} {
		if got := l.local(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("local(%s) = %v, want %v", tc.addr, got, tc.want)
		}
	}
}

package main

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestNodePortAddrs(t *testing.T) {
	got, err := nodePortAddrs(defaultNodePortAddresses)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, netip.MustParseAddr("127.0.0.1")) {
		t.Fatalf("default: %v, want 127.0.0.1 among them", got)
	}
	for _, a := range got {
		if !a.IsLoopback() {
			t.Fatalf("default covers %v, which is not loopback", a)
		}
	}
	if _, err := nodePortAddrs("10.0.0.0/33"); err == nil || !strings.Contains(err.Error(), "--nodeport-addresses") {
		t.Fatalf("bad CIDR: %v", err)
	}
	if _, err := nodePortAddrs("198.51.100.0/24"); err == nil || !strings.Contains(err.Error(), "covers none") {
		t.Fatalf("a CIDR with no local address: %v", err)
	}
}

package conntrack

import "testing"

// TestICMPEchoNotInvalid: an ICMP echo request to a service address, in
// either family and either direction, is dropped (Invalid verdict, reason
// unsupported_icmp) but is not the kernel's INVALID state: it is counted in
// Unsupported under its protocol, and InvalidTotal (kube-proxy's
// ct_state_invalid_dropped_packets_total) stays at zero. An echo reply, which
// could only join a flow we do not have, stays INVALID, as in the kernel.
func TestICMPEchoNotInvalid(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	pkts := []struct {
		pkt   []byte
		dir   Direction
		proto Protocol
	}{
		{icmpInfo(client4.Addr(), service4.Addr(), 8), Original, ICMP},
		{icmpInfo(client6.Addr(), service6.Addr(), 128), Original, ICMPv6},
		{icmpInfo(service4.Addr(), client4.Addr(), 8), Reply, ICMP},
	}
	for _, p := range pkts {
		r := tab.Classify(p.pkt, p.dir)
		if r.Verdict != Invalid || r.Reason != ReasonUnsupportedICMP || !r.Reason.Unsupported() {
			t.Fatalf("%v echo: %v/%v, want invalid/unsupported_icmp", p.proto, r.Verdict, r.Reason)
		}
	}
	s := tab.Stats()
	if s.InvalidTotal != 0 || s.Invalid[ReasonUnsupportedICMP] != 0 {
		t.Errorf("echo requests counted as INVALID: InvalidTotal %d", s.InvalidTotal)
	}
	if s.Unsupported[ICMP] != 2 || s.Unsupported[ICMPv6] != 1 || s.UnsupportedTotal != 3 {
		t.Errorf("Unsupported icmp %d icmpv6 %d total %d, want 2, 1, 3", s.Unsupported[ICMP], s.Unsupported[ICMPv6], s.UnsupportedTotal)
	}

	r := tab.Classify(icmpInfo(client4.Addr(), service4.Addr(), 0), Original)
	if r.Verdict != Invalid || r.Reason != ReasonICMPNoFlow {
		t.Fatalf("echo reply: %v/%v, want invalid/icmp_no_flow", r.Verdict, r.Reason)
	}
	if s := tab.Stats(); s.InvalidTotal != 1 || s.UnsupportedTotal != 3 {
		t.Errorf("after an echo reply: InvalidTotal %d, UnsupportedTotal %d; want 1, 3", s.InvalidTotal, s.UnsupportedTotal)
	}
}

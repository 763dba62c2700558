package conntrack

import (
	"net/netip"
	"testing"
)

// recorder is a Counter that keeps IPVS's two counts for one flow, the way
// balancer.Conns does for an endpoint, and fails on a call out of order.
type recorder struct {
	t                testing.TB
	active, inactive int
	removed          int
}

func (r *recorder) Established(on bool) {
	switch {
	case r.removed > 0:
		r.t.Errorf("Established(%v) after Removed", on)
	case on && r.active == 1, !on && r.active == 0:
		r.t.Errorf("Established(%v) with active=%d", on, r.active)
	case on:
		r.active, r.inactive = 1, 0
	default:
		r.active, r.inactive = 0, 1
	}
}

func (r *recorder) Removed(established bool) {
	r.removed++
	if established != (r.active == 1) {
		r.t.Errorf("Removed(%v) with active=%d", established, r.active)
	}
	r.active, r.inactive = 0, 0
}

// TestCounterFollowsEstablished: a bound Counter moves the flow to active
// on ESTABLISHED and back when it leaves it (ip_vs_proto_tcp.c,
// set_tcp_state), and is told Removed exactly once, with the state the flow
// was counted in, whichever way the entry leaves.
func TestCounterFollowsEstablished(t *testing.T) {
	tests := []struct {
		name string
		// bindAfter steps of the handshake run before Bind.
		bindAfter int
		steps     []step
		// activeAfter is the active count after each of steps.
		activeAfter []int
		remove      func(tab *Table, f *flow, clk *ManualClock)
	}{
		{name: "bound in SYN_SENT, closed by FINs", bindAfter: 1,
			steps:       []step{{Reply, flagSYN | flagACK}, {Original, flagACK}, {Original, flagFIN | flagACK}, {Reply, flagFIN | flagACK}, {Original, flagACK}},
			activeAfter: []int{0, 1, 0, 0, 0},
			remove:      func(tab *Table, f *flow, _ *ManualClock) { tab.Delete(Filter{}) }},
		{name: "bound when ESTABLISHED already", bindAfter: 3,
			steps: []step{}, activeAfter: []int{},
			remove: func(tab *Table, f *flow, _ *ManualClock) { tab.Delete(Filter{}) }},
		{name: "reset while ESTABLISHED", bindAfter: 3,
			steps: []step{{Original, flagRST}}, activeAfter: []int{0},
			remove: func(tab *Table, f *flow, clk *ManualClock) { clk.Advance(DefaultTimeouts().TCPClose); tab.Sweep() }},
		{name: "expires while ESTABLISHED", bindAfter: 3,
			steps: []step{}, activeAfter: []int{},
			remove: func(tab *Table, f *flow, clk *ManualClock) {
				clk.Advance(DefaultTimeouts().TCPEstablished)
				tab.Sweep()
			}},
		{name: "flushed while ESTABLISHED", bindAfter: 1,
			steps: []step{{Reply, flagSYN | flagACK}, {Original, flagACK}}, activeAfter: []int{0, 1},
			remove: func(tab *Table, f *flow, _ *ManualClock) { tab.DeleteFlow(f.tuple(), nil) }},
	}
	handshake := []step{{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab, clk := newTestTable(t, nil)
			f := newFlow(t, tab, clk, client4, service4)
			for _, s := range handshake[:tc.bindAfter] {
				f.mustSend(s.dir, s.flags, 0)
			}
			rec := &recorder{t: t, inactive: 1} // counted by the owner before Bind
			if !tab.Bind(f.tuple(), &Binding{Endpoint: pod4, Counter: rec}) {
				t.Fatal("Bind found no entry")
			}
			if want := b2i(tc.bindAfter == 3); rec.active != want {
				t.Fatalf("after Bind: active %d, want %d", rec.active, want)
			}
			for i, s := range tc.steps {
				f.mustSend(s.dir, s.flags, 0)
				if rec.active != tc.activeAfter[i] {
					t.Fatalf("after step %d (%v %s): active %d, want %d", i, s.dir, flagNames(s.flags), rec.active, tc.activeAfter[i])
				}
			}
			tc.remove(tab, f, clk)
			if rec.removed != 1 || tab.Len() != 0 {
				t.Fatalf("Removed called %d times, %d entries left", rec.removed, tab.Len())
			}
		})
	}
}

// TestCounterUDPAndRebind: a UDP flow is never established; a second Bind
// hands the first Counter its Removed; a failed Bind leaves the Counter
// alone (its owner uncounts it).
func TestCounterUDPAndRebind(t *testing.T) {
	tab, _ := newTestTable(t, nil)
	client := netip.AddrPortFrom(client4.Addr(), 4000)
	r := tab.Classify(udpPacket(client, service4, 10, ipOpts{}), Original)
	if err := tab.Confirm(&r); err != nil {
		t.Fatal(err)
	}
	tuple := MakeTuple(UDP, client, service4)
	first, second := &recorder{t: t, inactive: 1}, &recorder{t: t, inactive: 1}
	if !tab.Bind(tuple, &Binding{Endpoint: pod4, Counter: first}) || !tab.Bind(tuple, &Binding{Endpoint: pod4, Counter: second}) {
		t.Fatal("Bind failed")
	}
	if first.removed != 1 || second.removed != 0 {
		t.Fatalf("after rebind: first removed %d, second %d", first.removed, second.removed)
	}
	tab.Classify(udpPacket(service4, client, 10, ipOpts{}), Reply)
	tab.Delete(Filter{Protocol: UDP})
	if second.removed != 1 || second.active != 0 {
		t.Fatalf("second: removed %d, active %d", second.removed, second.active)
	}
	orphan := &recorder{t: t, inactive: 1}
	if tab.Bind(tuple, &Binding{Counter: orphan}) || orphan.removed != 0 {
		t.Fatalf("Bind on a gone entry: removed %d", orphan.removed)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

package balancer

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var (
	clientA = netip.MustParseAddr("10.1.0.1")
	clientB = netip.MustParseAddr("10.1.0.2")
	clientC = netip.MustParseAddr("10.1.0.3")
	clientD = netip.MustParseAddr("10.1.0.4")
	client6 = netip.MustParseAddr("fd00::1")
)

var keys3 = []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}

func newTestAffinity(timeout time.Duration, size int) (*Affinity, *manualClock) {
	c := newManualClock()
	return NewAffinity(AffinityConfig{Timeout: timeout, ListSize: size, Clock: c}), c
}

func clientsOf(a *Affinity, key string) []netip.Addr {
	var out []netip.Addr
	for _, ca := range a.Clients(key) {
		out = append(out, ca.Addr)
	}
	return out
}

// xt_recent --rcheck --seconds T: a stamp as old as T still matches
// (time_after(now-T, stamp) is false), one nanosecond older does not.
func TestAffinityHitWithinTimeoutMissAfter(t *testing.T) {
	a, clk := newTestAffinity(10*time.Second, 0)
	a.Set(keys3[1], clientA)
	clk.Advance(10 * time.Second)
	if i, ok := a.Check(keys3, clientA); !ok || i != 1 {
		t.Fatalf("at T: Check = %d, %v; want 1, true", i, ok)
	}
	clk.Advance(time.Nanosecond)
	if i, ok := a.Check(keys3, clientA); ok {
		t.Fatalf("after T: Check = %d, true; want a miss", i)
	}
}

func TestAffinityDefaults(t *testing.T) {
	a := NewAffinity(AffinityConfig{Clock: newManualClock()})
	if a.Timeout() != 10800*time.Second {
		t.Errorf("default timeout %v, want 10800s", a.Timeout())
	}
	if a.listSize != 100 {
		t.Errorf("default list size %d, want ip_list_tot 100", a.listSize)
	}
}

// A check never refreshes: a client checked (and hit) at T/2 has still expired
// at T+1, because only --set moves the stamp.
func TestAffinityCheckDoesNotRefresh(t *testing.T) {
	a, clk := newTestAffinity(10*time.Second, 0)
	a.Set(keys3[0], clientA)
	clk.Advance(5 * time.Second)
	if _, ok := a.Check(keys3, clientA); !ok {
		t.Fatal("miss within T")
	}
	clk.Advance(5*time.Second + time.Nanosecond)
	if _, ok := a.Check(keys3, clientA); ok {
		t.Fatal("hit after T: the check refreshed the stamp")
	}
}

// Every new connection refreshes the stamp of the chosen endpoint (--set in
// the KUBE-SEP chain), so a client that keeps connecting every T/2 keeps its
// endpoint indefinitely.
func TestPickerRefreshesOnEveryConnection(t *testing.T) {
	clk := newManualClock()
	p := NewPicker(NewLottery(3), newPCG(testSeed(t, 7)), NewAffinity(AffinityConfig{Timeout: 10 * time.Second, Clock: clk}))
	first, by := p.Pick(keys3, clientA)
	if by {
		t.Fatal("first connection decided by affinity")
	}
	for i := range 10 {
		clk.Advance(6 * time.Second)
		got, by := p.Pick(keys3, clientA)
		if got != first || !by {
			t.Fatalf("connection %d at +%ds: Pick = %d, %v; want %d, true", i+2, 6*(i+1), got, by, first)
		}
	}
	if ages := a(p).Clients(keys3[first]); len(ages) != 1 || ages[0].Age != 0 {
		t.Fatalf("list of chosen endpoint = %+v, want clientA with age 0", ages)
	}
}

func a(p *Picker) *Affinity { return p.Affinity() }

// The lists are checked in endpoint order: when a client is fresh in two lists
// (possible after the chosen endpoint's rule changed), the first one wins; a
// stale entry in an earlier list is skipped.
func TestAffinityCheckOrder(t *testing.T) {
	aff, clk := newTestAffinity(10*time.Second, 0)
	aff.Set(keys3[0], clientA)
	clk.Advance(11 * time.Second)
	aff.Set(keys3[2], clientA)
	if i, ok := aff.Check(keys3, clientA); !ok || i != 2 {
		t.Fatalf("stale in 0, fresh in 2: Check = %d, %v; want 2, true", i, ok)
	}
	aff.Set(keys3[1], clientA)
	if i, ok := aff.Check(keys3, clientA); !ok || i != 1 {
		t.Fatalf("fresh in 1 and 2: Check = %d, %v; want 1, true", i, ok)
	}
}

// A full list (ip_list_tot) evicts its least recently set entry; a refresh
// moves an entry to the most recent end (recent_entry_update's list_move_tail).
func TestAffinityListSizeEvictionOrder(t *testing.T) {
	aff, clk := newTestAffinity(time.Hour, 3)
	k := keys3[0]
	for _, c := range []netip.Addr{clientA, clientB, clientC} {
		aff.Set(k, c)
		clk.Advance(time.Second)
	}
	aff.Set(k, clientA) // refresh: B is now the least recently set
	aff.Set(k, clientD) // full: evicts B
	if diff := cmp.Diff([]netip.Addr{clientC, clientA, clientD}, clientsOf(aff, k), cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
		t.Fatalf("list after eviction (-want +got):\n%s", diff)
	}
	if _, ok := aff.Check([]string{k}, clientB); ok {
		t.Fatal("evicted client still hits")
	}
}

// --reap removes at most one entry per check, the least recently set, and only
// if it is stale; and only when the checking client is in the list at all
// (recent_mt returns before reaping when the source is absent).
func TestAffinityReapOneStaleEntryPerCheck(t *testing.T) {
	aff, clk := newTestAffinity(10*time.Second, 0)
	k := keys3[0]
	aff.Set(k, clientA)
	aff.Set(k, clientB)
	clk.Advance(20 * time.Second)
	aff.Set(k, clientC)
	eq := cmp.Comparer(func(x, y netip.Addr) bool { return x == y })

	// A client not in the list: no reap.
	aff.Check([]string{k}, clientD)
	if diff := cmp.Diff([]netip.Addr{clientA, clientB, clientC}, clientsOf(aff, k), eq); diff != "" {
		t.Fatalf("absent client reaped (-want +got):\n%s", diff)
	}
	// C checks: A (stale, head) goes; B (stale) stays.
	if _, ok := aff.Check([]string{k}, clientC); !ok {
		t.Fatal("fresh client missed")
	}
	if diff := cmp.Diff([]netip.Addr{clientB, clientC}, clientsOf(aff, k), eq); diff != "" {
		t.Fatalf("after one check (-want +got):\n%s", diff)
	}
	// Next check: B goes.
	aff.Check([]string{k}, clientC)
	if diff := cmp.Diff([]netip.Addr{clientC}, clientsOf(aff, k), eq); diff != "" {
		t.Fatalf("after two checks (-want +got):\n%s", diff)
	}
	// The head is fresh: nothing more goes.
	aff.Check([]string{k}, clientC)
	if got := clientsOf(aff, k); len(got) != 1 {
		t.Fatalf("fresh head reaped: %v", got)
	}
}

// A stale client's own check can reap itself when it is the head.
func TestAffinityReapSelf(t *testing.T) {
	aff, clk := newTestAffinity(10*time.Second, 0)
	aff.Set(keys3[0], clientA)
	clk.Advance(11 * time.Second)
	if _, ok := aff.Check(keys3, clientA); ok {
		t.Fatal("stale hit")
	}
	if got := clientsOf(aff, keys3[0]); len(got) != 0 {
		t.Fatalf("stale head not reaped: %v", got)
	}
}

// When an endpoint leaves, its list goes with its chain: if it comes back, the
// client's old stamp does not count.
func TestAffinityEndpointRemovalClearsList(t *testing.T) {
	aff, _ := newTestAffinity(time.Hour, 0)
	aff.Set(keys3[1], clientA)
	aff.Set(keys3[2], clientB)
	aff.Retain([]string{keys3[0], keys3[2]})
	if _, ok := aff.Check(keys3, clientA); ok {
		t.Fatal("client of a removed endpoint still hits after the endpoint returned")
	}
	if i, ok := aff.Check(keys3, clientB); !ok || i != 2 {
		t.Fatalf("client of a kept endpoint: Check = %d, %v; want 2, true", i, ok)
	}
	aff.Forget(keys3[2])
	if _, ok := aff.Check(keys3, clientB); ok {
		t.Fatal("Forget kept the list")
	}
}

// Lists are per service port (the list name is the KUBE-SEP chain, which
// hashes the service port name): two services with the same endpoint never
// share a client's affinity.
func TestAffinityServicesNeverShareLists(t *testing.T) {
	clk := newManualClock()
	l := NewLottery(3)
	web := NewPicker(l, newPCG(1), NewAffinity(AffinityConfig{Timeout: time.Hour, Clock: clk}))
	api := NewPicker(l, newPCG(2), NewAffinity(AffinityConfig{Timeout: time.Hour, Clock: clk}))
	web.Pick(keys3, clientA)
	if _, ok := api.Affinity().Check(keys3, clientA); ok {
		t.Fatal("a pick on one service created affinity on another")
	}
	if _, by := api.Pick(keys3, clientA); by {
		t.Fatal("second service's first pick decided by affinity")
	}
}

// Affinity is by address only; IPv6 clients work like IPv4 ones, and one
// client does not see another's stamp.
func TestAffinityKeyedBySourceAddress(t *testing.T) {
	aff, _ := newTestAffinity(time.Hour, 0)
	aff.Set(keys3[0], client6)
	if i, ok := aff.Check(keys3, client6); !ok || i != 0 {
		t.Fatalf("IPv6 client: Check = %d, %v", i, ok)
	}
	if _, ok := aff.Check(keys3, clientA); ok {
		t.Fatal("another client hit")
	}
}

func TestPickerWithoutAffinity(t *testing.T) {
	p := NewPicker(NewLottery(3), &scripted{t: t, vals: []uint32{Threshold(3), Threshold(2) - 1}}, nil)
	if i, by := p.Pick(keys3, clientA); i != 1 || by {
		t.Fatalf("Pick = %d, %v; want 1, false", i, by)
	}
	if i, by := p.Pick(nil, clientA); i != -1 || by {
		t.Fatalf("Pick(no endpoints) = %d, %v; want -1, false", i, by)
	}
}

// With affinity, a miss runs the lottery and sets the chosen endpoint's list;
// the next connection is decided by affinity and draws no random value.
func TestPickerAffinityThenLottery(t *testing.T) {
	src := &scripted{t: t, vals: []uint32{Threshold(3), Threshold(2)}}
	p := NewPicker(NewLottery(3), src, NewAffinity(AffinityConfig{Clock: newManualClock()}))
	if i, by := p.Pick(keys3, clientA); i != 2 || by {
		t.Fatalf("first Pick = %d, %v; want 2 by lottery", i, by)
	}
	if i, by := p.Pick(keys3, clientA); i != 2 || !by {
		t.Fatalf("second Pick = %d, %v; want 2 by affinity (and no draw)", i, by)
	}
}

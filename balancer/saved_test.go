package balancer

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// addrEq compares addresses for cmp.Diff.
var addrEq = cmp.Comparer(func(x, y netip.Addr) bool { return x == y })

// otherClock is the next process's clock: another origin, years away, so
// that an instant copied across instead of an age would show.
func otherClock() *manualClock {
	return &manualClock{now: time.Date(2031, 6, 1, 12, 0, 0, 0, time.UTC)}
}

// A pin moves with what is left of it: rows of (set ages in the old
// process, the new timeout and list size) -> what the new one holds and
// when each pin runs out there.
func TestAffinitySaveRestore(t *testing.T) {
	const T = 10 * time.Second
	tests := []struct {
		name string
		// sets are the --sets in the old process, oldest first, at 1 s
		// apart; save runs 1 s after the last.
		sets      []netip.Addr
		newT      time.Duration
		newSize   int
		wantOrder []netip.Addr // the restored list, least recently set first
		restored  int
		dropped   int
	}{
		{"every pin moves, in order", []netip.Addr{clientA, clientB, clientC}, T, 0, []netip.Addr{clientA, clientB, clientC}, 3, 0},
		// Ages 3, 2, 1 s: a 2 s timeout keeps the two younger ones.
		{"a shorter timeout drops what it has expired", []netip.Addr{clientA, clientB, clientC}, 2 * time.Second, 0, []netip.Addr{clientB, clientC}, 2, 1},
		{"a smaller list keeps the most recently set", []netip.Addr{clientA, clientB, clientC}, T, 2, []netip.Addr{clientB, clientC}, 2, 1},
		{"IPv6 clients too", []netip.Addr{client6}, T, 0, []netip.Addr{client6}, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old, clk := newTestAffinity(T, 0)
			for _, c := range tc.sets {
				old.Set(keys3[1], c)
				clk.Advance(time.Second)
			}
			saved := old.Save()
			nclk := otherClock()
			a := NewAffinity(AffinityConfig{Timeout: tc.newT, ListSize: tc.newSize, Clock: nclk})
			restored, dropped, err := a.Restore(saved)
			if err != nil || restored != tc.restored || dropped != tc.dropped {
				t.Fatalf("Restore = %d, %d, %v; want %d, %d, nil", restored, dropped, err, tc.restored, tc.dropped)
			}
			if diff := cmp.Diff(tc.wantOrder, clientsOf(a, keys3[1]), addrEq); diff != "" {
				t.Fatalf("restored list (-want +got):\n%s", diff)
			}
			// Each pin holds exactly as long as it had left: age a
			// restored, it matches until the timeout, not a moment longer.
			for _, ca := range a.Clients(keys3[1]) {
				probe := NewAffinity(AffinityConfig{Timeout: tc.newT, Clock: nclk})
				if _, _, err := probe.Restore([]SavedList{{Endpoint: keys3[1], Clients: []ClientAge{ca}}}); err != nil {
					t.Fatal(err)
				}
				left := tc.newT - ca.Age
				at := *nclk
				nclk.Advance(left)
				if i, ok := probe.Check(keys3, ca.Addr); !ok || i != 1 {
					t.Errorf("%v with %v left: no hit at its end", ca.Addr, left)
				}
				nclk.Advance(time.Nanosecond)
				if _, ok := probe.Check(keys3, ca.Addr); ok {
					t.Errorf("%v with %v left: still a hit after it", ca.Addr, left)
				}
				*nclk = at
			}
		})
	}
}

// A client pinned before the handover is sent to its endpoint after it;
// the new clock runs behind the old one, which must not matter.
func TestAffinityPinSurvivesClockMovedBack(t *testing.T) {
	old, clk := newTestAffinity(time.Minute, 0)
	old.Set(keys3[2], clientA)
	clk.Advance(20 * time.Second)
	back := &manualClock{now: time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := NewAffinity(AffinityConfig{Timeout: time.Minute, Clock: back})
	if _, _, err := a.Restore(old.Save()); err != nil {
		t.Fatal(err)
	}
	back.Advance(40 * time.Second)
	if i, ok := a.Check(keys3, clientA); !ok || i != 2 {
		t.Fatalf("Check after 40 s of the 40 left = %d, %v; want 2, true", i, ok)
	}
	back.Advance(time.Nanosecond)
	if _, ok := a.Check(keys3, clientA); ok {
		t.Fatal("the pin outlived its timeout")
	}
}

// What the new process set itself is newer than anything saved before it
// and stays; a saved entry newer than one here replaces it in its place.
func TestAffinityRestoreMerges(t *testing.T) {
	a, clk := newTestAffinity(time.Minute, 0)
	clk.Advance(time.Hour)
	a.Set(keys3[0], clientA) // set now: age 0
	clk.Advance(10 * time.Second)
	a.Set(keys3[0], clientB) // set now; clientA is 10 s old
	restored, dropped, err := a.Restore([]SavedList{{Endpoint: keys3[0], Clients: []ClientAge{
		{Addr: clientC, Age: 30 * time.Second},
		{Addr: clientA, Age: 5 * time.Second}, // newer than the one here
		{Addr: clientB, Age: 5 * time.Second}, // older than the one here
	}}})
	if err != nil || restored != 2 || dropped != 1 {
		t.Fatalf("Restore = %d, %d, %v; want 2, 1, nil", restored, dropped, err)
	}
	want := []ClientAge{{clientC, 30 * time.Second}, {clientA, 5 * time.Second}, {clientB, 0}}
	if diff := cmp.Diff(want, a.Clients(keys3[0]), addrEq); diff != "" {
		t.Fatalf("list (-want +got):\n%s", diff)
	}
}

func TestAffinityRestoreRefusesGarbage(t *testing.T) {
	ok := ClientAge{Addr: clientA, Age: time.Second}
	tests := []struct {
		name  string
		lists []SavedList
	}{
		{"no endpoint key", []SavedList{{Clients: []ClientAge{ok}}}},
		{"a list twice", []SavedList{{Endpoint: keys3[0], Clients: []ClientAge{ok}}, {Endpoint: keys3[0]}}},
		{"a client twice", []SavedList{{Endpoint: keys3[0], Clients: []ClientAge{ok, ok}}}},
		{"no address", []SavedList{{Endpoint: keys3[0], Clients: []ClientAge{{Age: time.Second}}}}},
		{"a negative age", []SavedList{{Endpoint: keys3[0], Clients: []ClientAge{{Addr: clientB, Age: -time.Second}}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, _ := newTestAffinity(time.Minute, 0)
			lists := append([]SavedList{{Endpoint: keys3[2], Clients: []ClientAge{ok}}}, tc.lists...)
			if _, _, err := a.Restore(lists); !errors.Is(err, ErrBadSaved) {
				t.Fatalf("Restore error %v, want ErrBadSaved", err)
			}
			if got := a.Save(); len(got) != 0 {
				t.Fatalf("a refused restore applied %v", got)
			}
		})
	}
}

// Templates move with their timers: rows of (the template's history in the
// old process, the new timeout) -> restored, and how long it lives on.
func TestPersistenceSaveRestore(t *testing.T) {
	const T = 10 * time.Second
	eps := testEndpoints(3)
	client := netip.MustParseAddr("10.1.0.9")
	tests := []struct {
		name string
		// The old process: the connection is made at 0 and released
		// at release (never when negative); the save is at save.
		release, save time.Duration
		newT          time.Duration
		adopt         bool // the new process counts the moved connection
		restored      bool
		lives         time.Duration // after the restore, when restored and not adopted
	}{
		{"released: T after its last use", 2 * time.Second, 3 * time.Second, T, false, true, 7 * time.Second},
		{"released and expired: not restored", 2 * time.Second, 11 * time.Second, T, false, false, 0},
		{"a shorter timeout clamps it", 2 * time.Second, 3 * time.Second, 5 * time.Second, false, true, 2 * time.Second},
		{"a shorter timeout has expired it", 2 * time.Second, 6 * time.Second, 5 * time.Second, false, false, 0},
		// Its connections end with the old process as far as the new
		// one knows, inside T: it lives to T after its use.
		{"held within T", -1, 4 * time.Second, T, false, true, 6 * time.Second},
		// Past T with connections, the timer fires every 60 s from T
		// (at 10 s, 70 s, ...); with none left at 15 s it expires at 70 s.
		{"held past T: to the next 60 s firing", -1, 15 * time.Second, T, false, true, 55 * time.Second},
		// Counted again (Adopt), it lives as long as the connection does.
		{"held past T and adopted", -1, 15 * time.Second, T, true, true, time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newManualClock()
			old := NewPersistence(PersistenceConfig{Timeout: T, Clock: clk})
			_, tmpl, _ := old.Pick(client, eps, func() int { return 1 })
			if tc.release >= 0 {
				clk.Advance(tc.release)
				tmpl.Release()
				clk.Advance(tc.save - tc.release)
			} else {
				clk.Advance(tc.save)
			}
			saved := old.Save()
			nclk := otherClock()
			p := NewPersistence(PersistenceConfig{Timeout: tc.newT, Clock: nclk})
			restored, dropped, err := p.Restore(saved)
			if err != nil {
				t.Fatal(err)
			}
			// An expired template is left out by Save, or dropped by Restore.
			if (restored == 1) != tc.restored || restored+dropped != len(saved) {
				t.Fatalf("Restore of %d = %d restored, %d dropped; want restored %v", len(saved), restored, dropped, tc.restored)
			}
			if !tc.restored {
				if _, ok := p.Peek(client, eps); ok {
					t.Fatal("an expired template was restored")
				}
				return
			}
			if tc.adopt {
				if p.Adopt(client, eps[2].Addr) != nil {
					t.Fatal("Adopt to another destination found a template")
				}
				if p.Adopt(client, eps[1].Addr) == nil {
					t.Fatal("Adopt found no template")
				}
			}
			nclk.Advance(tc.lives - time.Nanosecond)
			if i, ok := p.Peek(client, eps); !ok || i != 1 {
				t.Fatalf("just before its end: Peek = %d, %v; want 1, true", i, ok)
			}
			nclk.Advance(time.Nanosecond)
			if _, ok := p.Peek(client, eps); ok != tc.adopt {
				t.Fatalf("at its end: alive %v, want %v", ok, tc.adopt)
			}
		})
	}
}

// A restored template pins its client as one made here would: the
// scheduler is not asked, and the use counts.
func TestPersistenceRestoredTemplatePins(t *testing.T) {
	eps := testEndpoints(3)
	client := netip.MustParseAddr("10.1.0.9")
	p := NewPersistence(PersistenceConfig{Timeout: time.Minute, Clock: otherClock()})
	if _, _, err := p.Restore([]SavedTemplate{{Client: client, Dest: eps[2].Addr, Idle: time.Second, Released: time.Second}}); err != nil {
		t.Fatal(err)
	}
	i, tmpl, byTmpl := p.Pick(client, eps, func() int { t.Fatal("the scheduler was asked"); return 0 })
	if i != 2 || tmpl == nil || !byTmpl {
		t.Fatalf("Pick = %d, %v, %v; want 2 by the template", i, tmpl, byTmpl)
	}
	tmpl.Release()
}

// At most MaxTemplates: the most recently used are the ones kept.
func TestPersistenceRestoreBounded(t *testing.T) {
	eps := testEndpoints(1)
	var saved []SavedTemplate
	for i := range 5 {
		c := netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 1)})
		idle := time.Duration(5-i) * time.Second // the later, the more recent
		saved = append(saved, SavedTemplate{Client: c, Dest: eps[0].Addr, Idle: idle, Released: idle})
	}
	p := NewPersistence(PersistenceConfig{Timeout: time.Minute, MaxTemplates: 2, Clock: otherClock()})
	restored, dropped, err := p.Restore(saved)
	if err != nil || restored != 2 || dropped != 3 || p.Len() != 2 {
		t.Fatalf("Restore = %d, %d, %v with %d held; want 2, 3, nil, 2", restored, dropped, err, p.Len())
	}
	for i, s := range saved {
		if _, ok := p.Peek(s.Client, eps); ok != (i >= 3) {
			t.Errorf("template %d (idle %v) kept %v", i, s.Idle, ok)
		}
	}
}

func TestPersistenceRestoreRefusesGarbage(t *testing.T) {
	dest := netip.MustParseAddrPort("10.0.0.1:80")
	c := netip.MustParseAddr("10.1.0.1")
	good := SavedTemplate{Client: netip.MustParseAddr("10.1.0.2"), Dest: dest, Idle: time.Second, Released: time.Second}
	tests := []struct {
		name string
		t    SavedTemplate
	}{
		{"no client", SavedTemplate{Dest: dest}},
		{"no destination", SavedTemplate{Client: c}},
		{"a client twice", good},
		{"the same client mapped to IPv6", SavedTemplate{Client: netip.AddrFrom16(good.Client.As16()), Dest: dest}},
		{"a negative idle time", SavedTemplate{Client: c, Dest: dest, Idle: -1}},
		{"released before its last use", SavedTemplate{Client: c, Dest: dest, Idle: time.Second, Released: 2 * time.Second}},
		{"released while it controls connections", SavedTemplate{Client: c, Dest: dest, Idle: time.Second, Controls: 1, Released: time.Second}},
		{"negative connections", SavedTemplate{Client: c, Dest: dest, Controls: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPersistence(PersistenceConfig{Clock: newManualClock()})
			if _, _, err := p.Restore([]SavedTemplate{good, tc.t}); !errors.Is(err, ErrBadSaved) {
				t.Fatalf("Restore error %v, want ErrBadSaved", err)
			}
			if p.Len() != 0 {
				t.Fatal("a refused restore applied templates")
			}
		})
	}
}

// rr and wrr go on where they were: the picks after a Save -> Restore are
// the picks the old scheduler would have made, and across a list change
// they are what the old one would have made after that change.
func TestSchedulerSaveRestore(t *testing.T) {
	tests := []struct {
		name   string
		sched  string
		before []Endpoint // the old process's list
		picks  int        // picks made there before the save
		after  []Endpoint // the new process's list
		same   bool       // the new list is the old one, unchanged
		want   []int      // the first picks expected
	}{
		{"rr, the same list", "rr", testEndpoints(4), 2, testEndpoints(4), true, []int{2, 3, 0}},
		// 0 (cw 4), 0 1 (cw 3), 0 (cw 2) picked: B and C are next.
		{"wrr, the same list mid-pass", "wrr", weighted(4, 3, 2), 4, weighted(4, 3, 2), true, []int{1, 2, 0, 1}},
		{"wrr, the same list at the head", "wrr", weighted(4, 3, 2), 0, weighted(4, 3, 2), true, []int{0, 0, 1}},
		// The cursor was on 10.0.0.2 (index 1), which left: it goes back
		// to 10.0.0.1, so 10.0.0.3 (now index 1) is next.
		{"rr, the cursor's endpoint left", "rr", testEndpoints(3), 2, []Endpoint{testEndpoints(3)[0], testEndpoints(3)[2]}, false, []int{1, 0, 1}},
		// A change sends wrr back to the head, and cw = 2 after those
		// four picks stays (mw is 4): A and B at 2 and at 1, A at 4.
		{"wrr, a list change", "wrr", weighted(4, 3, 2), 4, weighted(4, 3), false, []int{0, 1, 0, 1, 0, 0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := mustScheduler(t, tc.sched, "")
			picks(old, tc.before, anyFlow, tc.picks)
			v, ok := SaveScheduler(old)
			if !ok {
				t.Fatal("no position saved")
			}
			s := mustScheduler(t, tc.sched, "")
			if err := RestoreScheduler(s, v, tc.after); err != nil {
				t.Fatal(err)
			}
			got := picks(s, tc.after, anyFlow, 12)
			if diff := cmp.Diff(tc.want, got[:len(tc.want)]); diff != "" {
				t.Errorf("picks after the restore (-want +got):\n%s", diff)
			}
			// The old scheduler, handed the same list (or the list
			// changed as the new one's), picks the same way.
			ref := tc.after
			if tc.same {
				ref = tc.before
			}
			if diff := cmp.Diff(picks(old, ref, anyFlow, 12), got); diff != "" {
				t.Errorf("the old scheduler going on and the restored one (-old +restored):\n%s", diff)
			}
		})
	}
}

func TestSchedulerRestoreRefusesGarbage(t *testing.T) {
	eps := testEndpoints(2)
	plain := plainList(eps)
	tests := []struct {
		name  string
		sched string
		v     SavedScheduler
	}{
		{"another scheduler's position", "rr", SavedScheduler{Name: "wrr", Endpoints: plain, Cursor: 0, Weight: 1}},
		{"a scheduler with none", "lc", SavedScheduler{Name: "lc", Endpoints: plain, Cursor: -1}},
		{"a cursor past the list", "rr", SavedScheduler{Name: "rr", Endpoints: plain, Cursor: 2}},
		{"a cursor before the head", "rr", SavedScheduler{Name: "rr", Endpoints: plain, Cursor: -2}},
		{"an endpoint twice", "rr", SavedScheduler{Name: "rr", Endpoints: []Endpoint{plain[0], plain[0]}, Cursor: 0}},
		{"a negative weight", "rr", SavedScheduler{Name: "rr", Endpoints: []Endpoint{{Addr: plain[0].Addr, Weight: -1}}, Cursor: 0}},
		{"rr with a weight", "rr", SavedScheduler{Name: "rr", Endpoints: plain, Cursor: 0, Weight: 1}},
		{"wrr above its largest weight", "wrr", SavedScheduler{Name: "wrr", Endpoints: plain, Cursor: 0, Weight: 2}},
		{"wrr at weight 0", "wrr", SavedScheduler{Name: "wrr", Endpoints: plain, Cursor: 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := mustScheduler(t, tc.sched, "")
			if err := RestoreScheduler(s, tc.v, eps); !errors.Is(err, ErrBadSaved) {
				t.Fatalf("RestoreScheduler error %v, want ErrBadSaved", err)
			}
		})
	}
	for _, name := range []string{"random", "lc", "wlc", "sed", "nq", "sh", "dh", "mh"} {
		if _, ok := SaveScheduler(mustScheduler(t, name, "")); ok {
			t.Errorf("%s saved a position; it keeps none", name)
		}
	}
}

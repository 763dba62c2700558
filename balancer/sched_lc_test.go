package balancer

import "testing"

// load is one endpoint of a least-connection case: weight, active and
// inactive connections.
type load struct {
	w    int32
	a, i int
}

func loaded(ls ...load) []Endpoint {
	eps := testEndpoints(len(ls))
	for k, l := range ls {
		eps[k].Weight = l.w
		eps[k].Conns = counted(l.a, l.i)
	}
	return eps
}

type lcCase struct {
	why   string
	loads []load
	want  int
}

func runLCCases(t *testing.T, name string, cases []lcCase) {
	t.Helper()
	s := mustScheduler(t, name, "")
	for _, c := range cases {
		t.Run(c.why, func(t *testing.T) {
			eps := loaded(c.loads...)
			if got := s.Pick(eps, anyFlow); got != c.want {
				t.Errorf("%s over %v = %d, want %d", name, c.loads, got, c.want)
			}
		})
	}
}

// ip_vs_lc.c: the least ip_vs_dest_conn_overhead (active*256 + inactive),
// weight 0 skipped, the first of equals winning (the loop replaces its
// candidate only when doh < loh).
func TestLCPicks(t *testing.T) {
	runLCCases(t, "lc", []lcCase{
		{"all idle: the first", []load{{1, 0, 0}, {1, 0, 0}, {1, 0, 0}}, 0},
		// Overheads 256, 255, 256.
		{"one active outweighs 255 inactive", []load{{1, 1, 0}, {1, 0, 255}, {1, 0, 256}}, 1},
		// Overheads 5, 3, 3.
		{"tie: the first of the least", []load{{1, 0, 5}, {1, 0, 3}, {1, 0, 3}}, 1},
		// Overheads 256, (skipped), 300.
		{"weight 0 skipped though idle", []load{{1, 1, 0}, {0, 0, 0}, {1, 0, 300}}, 0},
		// lc reads no weight but zero: overheads 10 and 11.
		{"weights ignored", []load{{1, 0, 10}, {100, 0, 11}}, 0},
		{"only weight 0 idle", []load{{0, 0, 0}, {1, 2, 0}}, 1},
	})
}

// ip_vs_wlc.c: the least overhead/weight, compared as loh*w > doh*wleast;
// the first endpoint with a weight above 0 is the first candidate, and a
// later one replaces it only when strictly less loaded.
func TestWLCPicks(t *testing.T) {
	runLCCases(t, "wlc", []lcCase{
		// 256/1 against 512/2: 256*2 > 512*1 is false, a tie.
		{"tie after weighting: the first", []load{{1, 1, 0}, {2, 2, 0}}, 0},
		// 256/1 against 512/3: 256*3 = 768 > 512*1.
		{"heavier weight takes more", []load{{1, 1, 0}, {3, 2, 0}}, 1},
		// The first candidate is index 1 (loh 256); index 2 has 0:
		// 256*1 > 0*1.
		{"first candidate after weight 0", []load{{0, 0, 0}, {1, 1, 0}, {1, 0, 0}}, 2},
		// A later weight 0 gives loh*0 = 0 > doh*w, never true.
		{"later weight 0 never wins", []load{{1, 1, 0}, {0, 0, 0}}, 0},
		// Inactive counts: overheads 2 and 1.
		{"inactive counts", []load{{1, 0, 2}, {1, 0, 1}}, 1},
		{"all idle: the first", []load{{1, 0, 0}, {5, 0, 0}}, 0},
	})
}

// ip_vs_sed.c: wlc's loop with the expected overhead active + 1.
func TestSEDPicks(t *testing.T) {
	runLCCases(t, "sed", []lcCase{
		// Inactive connections do not count: 1 against 2 (wlc would
		// compare 1000 with 256 and pick index 1).
		{"inactive ignored", []load{{1, 0, 1000}, {1, 1, 0}}, 0},
		// Both idle: 1*2 > 1*1, the faster one (wlc: 0*2 > 0*1 is
		// false, the first).
		{"idle: the heavier weight", []load{{1, 0, 0}, {2, 0, 0}}, 1},
		// (1+1)/1 against (4+1)/3: 2*3 = 6 > 5*1.
		{"expected delay", []load{{1, 1, 0}, {3, 4, 0}}, 1},
		// (2+1)/1 against (5+1)/2: 3*2 > 6*1 is false, a tie.
		{"tie: the first", []load{{1, 2, 0}, {2, 5, 0}}, 0},
		{"weight 0 first", []load{{0, 0, 0}, {1, 3, 0}, {1, 2, 0}}, 2},
	})
	// The contrast with wlc, on the same counts.
	eps := loaded(load{1, 0, 1000}, load{1, 1, 0})
	if got := mustScheduler(t, "wlc", "").Pick(eps, anyFlow); got != 1 {
		t.Errorf("wlc over 1000 inactive vs 1 active = %d, want 1", got)
	}
}

// ip_vs_nq.c: the first endpoint in list order with no active connection
// (weight above 0) at once, whatever its inactive ones; else sed's choice.
func TestNQPicks(t *testing.T) {
	runLCCases(t, "nq", []lcCase{
		{"first idle wins", []load{{1, 1, 0}, {1, 0, 50}, {10, 0, 0}}, 1},
		// (2+1)/1 against (3+1)/2: 3*2 = 6 > 4*1.
		{"none idle: expected delay", []load{{1, 2, 0}, {2, 3, 0}}, 1},
		{"idle weight 0 skipped", []load{{0, 0, 0}, {1, 1, 0}}, 1},
		{"none idle, tie: the first", []load{{1, 1, 0}, {1, 1, 0}}, 0},
		// An idle slow endpoint beats a busy fast one. sed would
		// keep index 0: (1+1)/5 against (0+1)/1, 2*1 > 1*5 is false.
		{"idle before heavier", []load{{5, 1, 0}, {1, 0, 0}}, 1},
	})
	eps := loaded(load{5, 1, 0}, load{1, 0, 0})
	if got := mustScheduler(t, "sed", "").Pick(eps, anyFlow); got != 0 {
		t.Errorf("sed over a busy weight 5 and an idle weight 1 = %d, want 0", got)
	}
}

// The least-connection schedulers keep no cursor: the same counts give the
// same pick, and the pick follows the counts as connections come and go.
func TestLeastConnectionFollowsCounts(t *testing.T) {
	for _, name := range []string{"lc", "wlc", "sed", "nq"} {
		t.Run(name, func(t *testing.T) {
			s := mustScheduler(t, name, "")
			eps := testEndpoints(3)
			// 30 long-lived connections, each established before the
			// next: 10 each, in order 0, 1, 2, 0, 1, 2, ...
			for k := range 30 {
				i := s.Pick(eps, anyFlow)
				if i != k%3 {
					t.Fatalf("connection %d went to %d, want %d", k, i, k%3)
				}
				eps[i].Conns.Open()
				eps[i].Conns.Activate()
			}
			for i := range eps {
				if a, _ := eps[i].Conns.Load(); a != 10 {
					t.Errorf("endpoint %d has %d active, want 10", i, a)
				}
			}
			// Endpoint 1 loses three: it gets the next three.
			for range 3 {
				eps[1].Conns.Close(true)
			}
			for k := range 3 {
				if got := s.Pick(eps, anyFlow); got != 1 {
					t.Fatalf("pick %d after endpoint 1 lost three = %d, want 1", k, got)
				}
				eps[1].Conns.Open()
				eps[1].Conns.Activate()
			}
		})
	}
}

// heavier compares h1*w2 with h2*w1 exactly, where 64-bit products would
// overflow.
func TestHeavierDoesNotOverflow(t *testing.T) {
	const big = 1 << 40
	if !heavier(big, 1<<31, big, 1<<31-1) {
		t.Error("2^71 > 2^71 - 2^40 not seen")
	}
	if heavier(big, 1<<31-1, big, 1<<31) {
		t.Error("2^71 - 2^40 > 2^71 seen")
	}
	if heavier(3, 2, 6, 1) || !heavier(3, 3, 6, 1) || heavier(-5, 1, 0, 1) {
		t.Error("small cases wrong")
	}
}

package balancer

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// ip_vs_rr.c: the cursor starts at the list head (ip_vs_rr_init_svc), so the
// first pick is the first endpoint, and each pick goes on from the last.
func TestRROrder(t *testing.T) {
	s := mustScheduler(t, "rr", "")
	eps := testEndpoints(3)
	want := []int{0, 1, 2, 0, 1, 2, 0}
	if diff := cmp.Diff(want, picks(s, eps, anyFlow, len(want))); diff != "" {
		t.Errorf("picks (-want +got):\n%s", diff)
	}
}

// Property: over k*n picks from any cursor position, rr gives each of n
// endpoints exactly k, whatever came before.
func TestRRGivesEachExactlyK(t *testing.T) {
	seed := testSeed(t, 18)
	r := rand.New(rand.NewPCG(seed, seed))
	for n := 1; n <= 20; n++ {
		s := mustScheduler(t, "rr", "")
		eps := testEndpoints(n)
		picks(s, eps, anyFlow, r.IntN(3*n)) // any starting cursor
		for k := 1; k <= 5; k++ {
			count := make([]int, n)
			for _, i := range picks(s, eps, anyFlow, k*n) {
				count[i]++
			}
			for i, c := range count {
				if c != k {
					t.Fatalf("n=%d k=%d: endpoint %d got %d picks, want %d (all: %v)", n, k, i, c, k, count)
				}
			}
		}
	}
}

// Weight 0 quiesces: the walk passes over it (the HIT test is weight > 0).
func TestRRSkipsWeightZero(t *testing.T) {
	s := mustScheduler(t, "rr", "")
	want := []int{0, 2, 0, 2}
	if diff := cmp.Diff(want, picks(s, weighted(1, 0, 1), anyFlow, 4)); diff != "" {
		t.Errorf("picks (-want +got):\n%s", diff)
	}
	// rr knows no other weights: 5 and 1 alternate.
	if diff := cmp.Diff([]int{0, 1, 0, 1}, picks(mustScheduler(t, "rr", ""), weighted(5, 1), anyFlow, 4)); diff != "" {
		t.Errorf("weights 5,1 (-want +got):\n%s", diff)
	}
}

// The cursor across list changes, as ip_vs_rr_del_dest moves it
// ("sched_data = p->next->prev": back to the destination before the deleted
// one) and adding leaves it. Endpoints are named by their last octet.
func TestRRCursorAcrossListChanges(t *testing.T) {
	ep := func(last byte) Endpoint {
		return Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, last}), 80), Weight: 1}
	}
	list := func(lasts ...byte) []Endpoint {
		var out []Endpoint
		for _, l := range lasts {
			out = append(out, ep(l))
		}
		return out
	}
	names := func(eps []Endpoint, idx []int) []byte {
		var out []byte
		for _, i := range idx {
			out = append(out, eps[i].Addr.Addr().As4()[3])
		}
		return out
	}
	cases := []struct {
		name   string
		before []byte
		warm   int // picks before the change
		after  []byte
		want   []byte // the next picks
	}{
		// Cursor on 2; 2 leaves: the cursor is back on 1, so 3 is next.
		{"cursor leaves", []byte{1, 2, 3, 4}, 2, []byte{1, 3, 4}, []byte{3, 4, 1}},
		// Cursor on 3; 2 and 3 leave: back to 1, then 4.
		{"cursor and predecessor leave", []byte{1, 2, 3, 4}, 3, []byte{1, 4}, []byte{4, 1, 4}},
		// Cursor on the first; it leaves: back to the head.
		{"first leaves", []byte{1, 2, 3}, 1, []byte{2, 3}, []byte{2, 3, 2}},
		// Cursor on 1; another endpoint leaves: the cursor stays.
		{"other leaves", []byte{1, 2, 3}, 1, []byte{1, 3}, []byte{3, 1, 3}},
		// Cursor on 2; 5 joins at the end: it comes after 3.
		{"join at end", []byte{1, 2, 3}, 2, []byte{1, 2, 3, 5}, []byte{3, 5, 1}},
		// Cursor on 1; 2 joins right after it: it is next.
		{"join after cursor", []byte{1, 3}, 1, []byte{1, 2, 3}, []byte{2, 3, 1}},
		// Everything leaves, then a new list: the cursor is at the head.
		{"all leave", []byte{1, 2}, 1, []byte{7, 8}, []byte{7, 8, 7}},
		// No pick yet: the head.
		{"untouched", []byte{1, 2}, 0, []byte{2, 3}, []byte{2, 3, 2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := mustScheduler(t, "rr", "")
			before, after := list(c.before...), list(c.after...)
			picks(s, before, anyFlow, c.warm)
			got := names(after, picks(s, after, anyFlow, len(c.want)))
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("picks after the change (-want +got):\n%s", diff)
			}
		})
	}
}

// With nothing to pick the cursor stays where it was.
func TestRRCursorStaysWhenNothingAvailable(t *testing.T) {
	s := mustScheduler(t, "rr", "")
	eps := testEndpoints(3)
	picks(s, eps, anyFlow, 2) // cursor on 1
	quiet := weighted(0, 0, 0)
	if got := s.Pick(quiet, anyFlow); got != -1 {
		t.Fatalf("Pick = %d, want -1", got)
	}
	if got := s.Pick(eps, anyFlow); got != 2 {
		t.Errorf("after the quiet list, Pick = %d, want 2 (the cursor stayed on 1)", got)
	}
}

// ip_vs_wrr.c with weights 4, 3, 2: gcd di = 1, mw = 4. The passes pick the
// endpoints with weight >= cw for cw = 4, 3, 2, 1, then again from 4:
//
//	cw=4: A; cw=3: A B; cw=2: A B C; cw=1: A B C
//
// nine picks per cycle, 4:3:2.
func TestWRRSequence(t *testing.T) {
	cases := []struct {
		weights []int32
		want    []int
	}{
		{[]int32{4, 3, 2}, []int{0, 0, 1, 0, 1, 2, 0, 1, 2, 0, 0, 1, 0, 1, 2, 0, 1, 2}},
		// di = gcd(4, 2) = 2 and mw = 4 - (2 - 1) = 3: cw = 3 picks A;
		// cw = 1 picks A and B; cw = -1 restarts at 3.
		{[]int32{4, 2}, []int{0, 0, 1, 0, 0, 1}},
		// Weight 0 is never >= cw (cw >= 1): di = 1, mw = 2; cw = 2 picks
		// A, cw = 1 picks A and C.
		{[]int32{2, 0, 1}, []int{0, 0, 2, 0, 0, 2}},
		// All weights 1: rr's order.
		{[]int32{1, 1, 1}, []int{0, 1, 2, 0, 1, 2}},
		// One endpoint.
		{[]int32{3}, []int{0, 0, 0}},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.weights), func(t *testing.T) {
			s := mustScheduler(t, "wrr", "")
			got := picks(s, weighted(c.weights...), anyFlow, len(c.want))
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("picks (-want +got):\n%s", diff)
			}
		})
	}
}

// Property: from a fresh start, k cycles of wrr give endpoint i exactly
// k * w_i / gcd picks; with every weight 1, that is rr's k each.
func TestWRRCyclesAreProportional(t *testing.T) {
	seed := testSeed(t, 18)
	r := rand.New(rand.NewPCG(seed, seed))
	for trial := range 200 {
		n := 1 + r.IntN(8)
		g := int32(1 + r.IntN(3))
		weights := make([]int32, n)
		for i := range weights {
			weights[i] = g * int32(r.IntN(6)) // some 0
		}
		weights[r.IntN(n)] = g * int32(1+r.IntN(5))
		// d is the gcd of the weights above 0 (a multiple of g), and
		// a cycle is sum(w / d) picks.
		var d int64
		for _, w := range weights {
			if w > 0 {
				d = gcd(int64(w), d)
			}
		}
		var sum int32
		for _, w := range weights {
			sum += w / int32(d)
		}
		s := mustScheduler(t, "wrr", "")
		eps := weighted(weights...)
		const k = 3
		count := make([]int32, n)
		for _, i := range picks(s, eps, anyFlow, k*int(sum)) {
			count[i]++
		}
		for i := range weights {
			if want := k * weights[i] / int32(d); count[i] != want {
				t.Fatalf("trial %d, weights %v: endpoint %d got %d picks, want %d (all %v)", trial, weights, i, count[i], want, count)
			}
		}
	}
}

// ip_vs_wrr_dest_changed: any change puts the cursor back at the head (rr
// would go on), and keeps cw but brings it into range.
func TestWRRListChange(t *testing.T) {
	// All weights 1: after A, B the list changes, and wrr starts again at
	// A where rr goes on with C.
	s := mustScheduler(t, "wrr", "")
	picks(s, testEndpoints(3), anyFlow, 2)
	if got := s.Pick(testEndpoints(4), anyFlow); got != 0 {
		t.Errorf("wrr after a change picks %d, want 0 (cursor back at the head)", got)
	}
	r := mustScheduler(t, "rr", "")
	picks(r, testEndpoints(3), anyFlow, 2)
	if got := r.Pick(testEndpoints(4), anyFlow); got != 2 {
		t.Errorf("rr after a change picks %d, want 2 (cursor kept)", got)
	}

	// Weights 4, 3, 2 for four picks (A A B A) leave cw = 2. The new
	// weights 4, 2 give di = 2 and mw = 3; cw = 2 is in range, and di > 1
	// makes it (2/2)*2 + 1 = 3. From the head: cw = 3 picks A; cw = 1
	// picks A, B.
	s = mustScheduler(t, "wrr", "")
	picks(s, weighted(4, 3, 2), anyFlow, 4)
	got := picks(s, weighted(4, 2), anyFlow, 6)
	if diff := cmp.Diff([]int{0, 0, 1, 0, 0, 1}, got); diff != "" {
		t.Errorf("after the change (-want +got):\n%s", diff)
	}

	// cw above the new mw starts again at mw: weights 4, 3, 2 picked once
	// leave cw = 4; new weights 2, 1 have mw = 2.
	s = mustScheduler(t, "wrr", "")
	picks(s, weighted(4, 3, 2), anyFlow, 1)
	got = picks(s, weighted(2, 1), anyFlow, 6)
	if diff := cmp.Diff([]int{0, 0, 1, 0, 0, 1}, got); diff != "" {
		t.Errorf("after the change to 2,1 (-want +got):\n%s", diff)
	}
}

// Every pick of rr and wrr lands in the list, also while the list changes
// at random under them.
func TestRRWRRChurn(t *testing.T) {
	seed := testSeed(t, 18)
	r := rand.New(rand.NewPCG(seed, seed))
	pool := testEndpoints(12)
	for _, name := range []string{"rr", "wrr"} {
		s := mustScheduler(t, name, "")
		for range 2000 {
			var eps []Endpoint
			for _, e := range pool {
				if r.IntN(2) == 0 {
					e.Weight = int32(r.IntN(4))
					eps = append(eps, e)
				}
			}
			live := slices.ContainsFunc(eps, func(e Endpoint) bool { return e.Weight > 0 })
			for range 1 + r.IntN(5) {
				i := s.Pick(eps, anyFlow)
				if live && (i < 0 || i >= len(eps) || eps[i].Weight == 0) {
					t.Fatalf("%s: Pick = %d over %v", name, i, eps)
				}
				if !live && i != -1 {
					t.Fatalf("%s: Pick = %d with no weight above 0", name, i)
				}
			}
		}
	}
}

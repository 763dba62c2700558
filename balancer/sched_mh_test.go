package balancer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

// IP_VS_MH_TAB_SIZE with CONFIG_IP_VS_MH_TAB_INDEX at its default 12:
// primes[12 - 8] = 4093 (ip_vs_mh.c; net/netfilter/ipvs/Kconfig).
func TestMHTableSize(t *testing.T) {
	if mhTabSize != 4093 || mhTabBits != 6 {
		t.Errorf("table size %d, bits %d; want 4093, 6", mhTabSize, mhTabBits)
	}
}

func mhLookup(t testing.TB, flags SchedFlags, eps []Endpoint) []int32 {
	t.Helper()
	tab, err := newMH(flags).table(eps)
	if err != nil {
		t.Fatal(err)
	}
	return tab.lookup
}

func slotCounts(lookup []int32, n int) []int {
	count := make([]int, n)
	for _, d := range lookup {
		count[d]++
	}
	return count
}

// mhEndpoints6 is testEndpoints over IPv6 addresses.
func mhEndpoints6(n int) []Endpoint {
	eps := testEndpoints(n)
	for i := range eps {
		eps[i].Addr = netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i + 1)}), 8080)
	}
	return eps
}

// For n = 1..10 endpoints of weight 1 every slot names one of them, and the
// shares are as ip_vs_mh_populate makes them: it goes round the list, one
// slot per endpoint per round, until the 4093rd slot, so with 4093 = q*n + r
// the first r endpoints hold q+1 slots and the others q.
func TestMHTableWellFormed(t *testing.T) {
	for _, family := range []struct {
		name string
		eps  func(int) []Endpoint
	}{{"IPv4", testEndpoints}, {"IPv6", mhEndpoints6}} {
		for n := 1; n <= 10; n++ {
			lookup := mhLookup(t, 0, family.eps(n))
			if len(lookup) != int(mhTabSize) {
				t.Fatalf("%s n=%d: %d slots", family.name, n, len(lookup))
			}
			for c, d := range lookup {
				if d < 0 || int(d) >= n {
					t.Fatalf("%s n=%d: slot %d holds %d", family.name, n, c, d)
				}
			}
			count := slotCounts(lookup, n)
			q, r := int(mhTabSize)/n, int(mhTabSize)%n
			for i, c := range count {
				if want := q + boolInt(i < r); c != want {
					t.Errorf("%s n=%d: endpoint %d holds %d slots, want %d", family.name, n, i, c, want)
				}
			}
			t.Logf("%s n=%d: slots %v", family.name, n, count)
		}
	}
}

// Weights become turns per round (ip_vs_mh_permutate, ip_vs_mh_shift_weight):
// (weight / gcd) >> rshift, at least 1 for a weight above 0.
func TestMHWeights(t *testing.T) {
	cases := []struct {
		weights []int32
		want    []int
	}{
		// Turns 2, 1, 1: rounds of 4 slots; 4093 = 4*1023 + 1, the
		// last slot going to the first endpoint.
		{[]int32{2, 1, 1}, []int{2047, 1023, 1023}},
		// gcd 2: turns 2, 1; 4093 = 3*1364 + 1.
		{[]int32{4, 2}, []int{2729, 1364}},
		{[]int32{100, 50}, []int{2729, 1364}},
		// gcd 1, max 1000: fls(1000) = 10, rshift = 10 - 6 = 4; turns
		// 1000 >> 4 = 62 and 1 >> 4 = 0, made 1. Rounds of 63: after 64
		// rounds 4032 slots are taken, and the first endpoint takes the
		// last 61: 64*62 + 61 = 4029.
		{[]int32{1000, 1}, []int{4029, 64}},
		// Weight 0 from the start: no turns, no slot.
		{[]int32{1, 0, 1}, []int{2047, 0, 2046}},
	}
	for _, c := range cases {
		got := slotCounts(mhLookup(t, 0, weighted(c.weights...)), len(c.weights))
		if !slices.Equal(got, c.want) {
			t.Errorf("weights %v: slots %v, want %v", c.weights, got, c.want)
		}
	}
}

// randomClients returns n client addresses from a seeded source.
func randomClients(seed uint64, n int) []netip.AddrPort {
	r := rand.New(rand.NewPCG(seed, seed))
	out := make([]netip.AddrPort, n)
	for i := range out {
		var a [4]byte
		v := r.Uint32()
		a[0], a[1], a[2], a[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
		out[i] = netip.AddrPortFrom(netip.AddrFrom4(a), uint16(r.Uint32()))
	}
	return out
}

// choices returns, per client, the address of the endpoint s picks.
func choices(s Scheduler, eps []Endpoint, clients []netip.AddrPort) []netip.AddrPort {
	out := make([]netip.AddrPort, len(clients))
	for i, c := range clients {
		if d := s.Pick(eps, Flow{Client: c}); d >= 0 {
			out[i] = eps[d].Addr
		}
	}
	return out
}

// Maglev's point: when one of n endpoints leaves, its own clients must move
// (about 1/n of all) and few others do. Measured on 100,000 clients for
// every n = 2..10 and every endpoint leaving; the bound asserted is that at
// most 1/n + 2% of all clients move. The worst figures are logged.
func TestMHDisruptionWhenOneLeaves(t *testing.T) {
	const sample = 100000
	clients := randomClients(testSeed(t, 18), sample)
	for n := 2; n <= 10; n++ {
		all := testEndpoints(n)
		before := choices(newMH(0), all, clients)
		worst, worstOthers := 0.0, 0.0
		for gone := range n {
			rest := slices.Delete(slices.Clone(all), gone, gone+1)
			after := choices(newMH(0), rest, clients)
			moved, others := 0, 0
			for i := range clients {
				if before[i] == after[i] {
					continue
				}
				moved++
				if before[i] != all[gone].Addr {
					others++
				}
			}
			frac := float64(moved) / sample
			worst = max(worst, frac)
			worstOthers = max(worstOthers, float64(others)/sample)
			if bound := 1/float64(n) + 0.02; frac > bound {
				t.Errorf("n=%d, endpoint %d leaves: %.4f of clients move, more than 1/n + 0.02 = %.4f", n, gone, frac, bound)
			}
		}
		t.Logf("n=%2d: one leaves: at most %.4f of clients move (1/n = %.4f); clients of staying endpoints that move: at most %.4f",
			n, worst, 1/float64(n), worstOthers)
	}
}

// The same when one endpoint joins: about 1/(n+1) move, to the newcomer.
func TestMHDisruptionWhenOneJoins(t *testing.T) {
	const sample = 100000
	clients := randomClients(testSeed(t, 19), sample)
	for n := 1; n <= 9; n++ {
		grown := testEndpoints(n + 1)
		// The newcomer sorts anywhere; try it in each position.
		worst := 0.0
		for at := range n + 1 {
			old := slices.Delete(slices.Clone(grown), at, at+1)
			before := choices(newMH(0), old, clients)
			after := choices(newMH(0), grown, clients)
			moved := 0
			for i := range clients {
				if before[i] != after[i] {
					moved++
				}
			}
			frac := float64(moved) / sample
			worst = max(worst, frac)
			if bound := 1/float64(n+1) + 0.02; frac > bound {
				t.Errorf("n=%d, one joins at %d: %.4f of clients move, more than 1/(n+1) + 0.02 = %.4f", n, at, frac, bound)
			}
		}
		t.Logf("n=%d -> %d: at most %.4f of clients move (1/(n+1) = %.4f)", n, n+1, worst, 1/float64(n+1))
	}
}

// A weight set to 0 keeps the endpoint's last_weight and so its slots
// (__ip_vs_update_dest): nobody else's clients move. Its own get no
// destination, or with mh-fallback another endpoint.
func TestMHQuiesce(t *testing.T) {
	clients := randomClients(testSeed(t, 20), 20000)
	eps := testEndpoints(5)
	quiet := slices.Clone(eps)
	quiet[2].Weight = 0
	for _, fallback := range []bool{false, true} {
		var flags SchedFlags
		if fallback {
			flags = SchedFlag1
		}
		s := newMH(flags)
		before := choices(s, eps, clients)
		tabBefore, _ := s.table(eps)
		after := choices(s, quiet, clients)
		tabAfter, _ := s.table(quiet)
		if !slices.Equal(tabBefore.lookup, tabAfter.lookup) {
			t.Errorf("fallback=%v: quiescing an endpoint changed the table", fallback)
		}
		for i := range clients {
			switch {
			case before[i] != eps[2].Addr && after[i] != before[i]:
				t.Fatalf("fallback=%v: client %s moved from %s to %s", fallback, clients[i], before[i], after[i])
			case before[i] == eps[2].Addr && !fallback && after[i].IsValid():
				t.Fatalf("client %s of the quiesced endpoint got %s without fallback", clients[i], after[i])
			case before[i] == eps[2].Addr && fallback && (!after[i].IsValid() || after[i] == eps[2].Addr):
				t.Fatalf("client %s of the quiesced endpoint got %v with fallback", clients[i], after[i])
			}
		}
	}
	// An endpoint that joins with weight 0 has no last_weight above 0 and
	// takes no slot; nor does one that leaves and comes back at 0.
	s := newMH(0)
	s.table(eps)
	tab, _ := s.table(quiet)
	if got := slotCounts(tab.lookup, 5)[2]; got == 0 {
		t.Fatalf("the quiesced endpoint lost its slots")
	}
	s.table(slices.Delete(slices.Clone(eps), 2, 3))
	tab, _ = s.table(quiet)
	if got := slotCounts(tab.lookup, 5)[2]; got != 0 {
		t.Errorf("an endpoint added at weight 0 holds %d slots", got)
	}
}

// mh-port hashes the client's port too; without it, every port of one
// client goes to the same endpoint.
func TestMHPort(t *testing.T) {
	eps := testEndpoints(5)
	client := netip.MustParseAddr("10.1.0.1")
	seen := map[bool]map[int]bool{false: {}, true: {}}
	for _, port := range []bool{false, true} {
		var flags SchedFlags
		if port {
			flags = SchedFlag2
		}
		s := newMH(flags)
		for p := range uint16(200) {
			seen[port][s.Pick(eps, Flow{Client: netip.AddrPortFrom(client, 1024+p)})] = true
		}
	}
	if len(seen[false]) != 1 {
		t.Errorf("without mh-port, 200 ports of one client went to %d endpoints", len(seen[false]))
	}
	if len(seen[true]) != len(eps) {
		t.Errorf("with mh-port, 200 ports of one client went to %d of %d endpoints", len(seen[true]), len(eps))
	}
}

// The table depends on the list only (with no weight 0 in play), not on the
// lists before it.
func TestMHTableIndependentOfHistory(t *testing.T) {
	all := testEndpoints(8)
	s := newMH(0)
	for _, l := range [][]Endpoint{all[:3], all[2:7], all, all[1:]} {
		s.table(l)
	}
	target := slices.Clone(all[:6])
	got, _ := s.table(target)
	if want := mhLookup(t, 0, target); !slices.Equal(got.lookup, want) {
		t.Error("the table after other lists differs from a fresh one")
	}
}

// ip_vs_mh_reassign refuses more destinations than slots; exactly as many
// gives each one slot.
func TestMHTooManyEndpoints(t *testing.T) {
	eps := testEndpoints(int(mhTabSize) + 1)
	s := newMH(0)
	if err := s.Update(eps); !errors.Is(err, ErrTooManyEndpoints) {
		t.Fatalf("Update(%d endpoints) = %v, want ErrTooManyEndpoints", len(eps), err)
	}
	if got := s.Pick(eps, anyFlow); got != -1 {
		t.Errorf("Pick over a refused list = %d, want -1", got)
	}
	if err := s.Update(eps); !errors.Is(err, ErrTooManyEndpoints) {
		t.Errorf("second Update of the refused list = %v, want ErrTooManyEndpoints", err)
	}
	full := eps[:mhTabSize]
	if err := s.Update(full); err != nil {
		t.Fatal(err)
	}
	for i, c := range slotCounts(mhLookup(t, 0, full), len(full)) {
		if c != 1 {
			t.Fatalf("%d endpoints: endpoint %d holds %d slots", len(full), i, c)
		}
	}
}

func ExampleSchedulerConfig_New() {
	cfg, _ := ParseScheduler("mh", "")
	s := cfg.New(nil)
	eps := make([]Endpoint, 4)
	for i := range eps {
		eps[i] = Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(i + 1)}), 8080), Weight: 1}
	}
	f := Flow{Client: netip.MustParseAddrPort("10.1.0.1:40000")}
	first := eps[s.Pick(eps, f)].Addr
	// The same client, on another node with the same list, or after a
	// restart: the same endpoint, as long as it stays.
	fmt.Println(first == eps[cfg.New(nil).Pick(eps, f)].Addr)
	// Output: true
}

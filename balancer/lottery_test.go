package balancer

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"testing"

	"github.com/userproxy/userproxy/internal/stats"
)

// The strings kube-proxy writes after --probability (proxier.go,
// computeProbability) for the first of n remaining endpoints.
func TestProbabilityStringVectors(t *testing.T) {
	want := map[int]string{
		1:      "1.0000000000",
		2:      "0.5000000000",
		3:      "0.3333333333",
		10:     "0.1000000000",
		100:    "0.0100000000",
		1000:   "0.0010000000",
		10000:  "0.0001000000",
		100000: "0.0000100000",
		100001: "0.0000099999",
	}
	for n, w := range want {
		if got := ProbabilityString(n); got != w {
			t.Errorf("ProbabilityString(%d) = %q, want %q", n, got, w)
		}
	}
}

// ProbabilityString must print exactly what fmt.Sprintf("%0.10f", 1.0/float64(n))
// prints, and the printed value must strictly decrease for n = 2..100000, so
// that no two rules of one chain share a probability.
func TestProbabilityStringMatchesSprintfAndDecreases(t *testing.T) {
	prev := math.Inf(1)
	for n := 1; n <= 100001; n++ {
		s := ProbabilityString(n)
		if w := fmt.Sprintf("%0.10f", 1.0/float64(n)); s != w {
			t.Fatalf("n=%d: %q, Sprintf gives %q", n, s, w)
		}
		if n < 2 || n > 100000 {
			continue
		}
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatal(err)
		}
		if !(v < prev) {
			t.Fatalf("n=%d: printed probability %s does not decrease (previous %v)", n, s, prev)
		}
		prev = v
	}
}

// iptables stores lround(P * 2^31) (libxt_statistic.c); these are the values
// it would load into the kernel for the printed strings.
func TestThresholdVectors(t *testing.T) {
	want := map[int]uint32{
		1:      1 << 31,
		2:      1073741824,
		3:      715827883,
		5:      429496730,
		10:     214748365,
		100:    21474836,
		1000:   2147484,
		100000: 21475,
		// "0.0000099999" rounds to the same threshold as "0.0000100000".
		100001: 21475,
	}
	for n, w := range want {
		if got := Threshold(n); got != w {
			t.Errorf("Threshold(%d) = %d, want %d", n, got, w)
		}
	}
}

// The kernel's comparison, step by step: rule i sees a fresh value, masks it to
// 31 bits, and fires when it is below the threshold of 1/(n-i); the last rule
// is unconditional (xt_statistic.c, statistic_mt).
func TestPickFollowsKernelComparison(t *testing.T) {
	t3, t2 := Threshold(3), Threshold(2)
	cases := []struct {
		name string
		n    int
		vals []uint32
		want int
	}{
		{"one endpoint draws nothing", 1, nil, 0},
		{"first rule fires just below threshold", 3, []uint32{t3 - 1}, 0},
		{"first rule misses at threshold", 3, []uint32{t3, t2 - 1}, 1},
		{"both miss, last is unconditional", 3, []uint32{t3, t2}, 2},
		{"bit 31 is masked off", 3, []uint32{0x80000000 | (t3 - 1)}, 0},
		{"bit 31 masked, then miss", 3, []uint32{0x80000000 | t3, 0xFFFFFFFF}, 2},
		{"two endpoints, zero fires", 2, []uint32{0}, 0},
		{"two endpoints, 2^30 misses", 2, []uint32{1 << 30}, 1},
	}
	l := NewLottery(4)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := &scripted{t: t, vals: c.vals}
			if got := l.Pick(c.n, src); got != c.want {
				t.Errorf("Pick(%d) = %d, want %d", c.n, got, c.want)
			}
			if len(src.vals) != 0 {
				t.Errorf("%d values left undrawn: the cascade evaluated fewer rules than the kernel", len(src.vals))
			}
		})
	}
	if got := l.Pick(0, &scripted{t: t}); got != -1 {
		t.Errorf("Pick(0) = %d, want -1", got)
	}
}

// The probability of each endpoint implied by the thresholds, computed exactly
// (not sampled), is 1/n within 1e-9 for every n up to 1000.
func TestExactProbabilitiesAreUniform(t *testing.T) {
	l := NewLottery(1)
	for n := 1; n <= 1000; n++ {
		ps := l.Probabilities(n)
		var sum float64
		for i, p := range ps {
			if d := math.Abs(p - 1/float64(n)); d > 1e-9 {
				t.Fatalf("n=%d endpoint %d: probability %.15f differs from 1/n by %.3g", n, i, p, d)
			}
			sum += p
		}
		if math.Abs(sum-1) > 1e-12 {
			t.Fatalf("n=%d: probabilities sum to %v", n, sum)
		}
	}
}

// biased returns 0 (which makes any rule fire) in about one draw in fifty.
type biased struct{ inner Source }

func (b biased) Uint32() uint32 {
	v := b.inner.Uint32()
	if v%50 == 0 {
		return 0
	}
	return v
}

func chiSquareOfPicks(l *Lottery, n, picks int, src Source) stats.ChiSquareResult {
	counts := make([]int, n)
	for range picks {
		counts[l.Pick(n, src)]++
	}
	r, err := stats.GoodnessOfFit(counts, stats.Uniform(n))
	if err != nil {
		panic(err)
	}
	return r
}

// 10^6 picks for each n pass a chi-square test at p > 0.001 with a fair
// source, and fail it with a biased one, which shows the test can fail.
func TestLotteryChiSquare(t *testing.T) {
	const picks = 1_000_000
	seed := testSeed(t, 20261129)
	l := NewLottery(64)
	for _, n := range []int{2, 3, 5, 10, 64} {
		fair := chiSquareOfPicks(l, n, picks, newPCG(seed+uint64(n)))
		t.Logf("n=%d fair: %v", n, fair)
		if fair.P <= 0.001 {
			t.Errorf("n=%d: fair source failed the chi-square test: %v", n, fair)
		}
		bad := chiSquareOfPicks(l, n, picks, biased{newPCG(seed + uint64(n))})
		t.Logf("n=%d biased: %v", n, bad)
		if bad.P > 0.001 {
			t.Errorf("n=%d: biased source passed the chi-square test: %v", n, bad)
		}
	}
}

// Threshold growth and picks from many goroutines at once (run with -race).
func TestLotteryConcurrent(t *testing.T) {
	l := NewLottery(1)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				n := 1 + (g*2000+i)%300
				if got := l.Pick(n, RuntimeSource{}); got < 0 || got >= n {
					t.Errorf("Pick(%d) = %d", n, got)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// pcg64 is a seeded Source64: Pick then serves two rules per 64-bit draw,
// the path the production RuntimeSource takes.
type pcg64 struct{ pcg }

func (p pcg64) Uint64() uint64 { return p.r.Uint64() }

// scripted64 returns the given 64-bit values in order.
type scripted64 struct {
	t    testing.TB
	vals []uint64
}

func (s *scripted64) Uint32() uint32 { s.t.Fatal("Uint32 called on a Source64"); return 0 }

func (s *scripted64) Uint64() uint64 {
	if len(s.vals) == 0 {
		s.t.Fatal("scripted source exhausted")
	}
	v := s.vals[0]
	s.vals = s.vals[1:]
	return v
}

// With a Source64 the low half of a draw decides rule i and the high half
// rule i+1, each compared as the kernel compares one get_random_u32.
func TestPick64FollowsKernelComparison(t *testing.T) {
	t4, t3, t2 := uint64(Threshold(4)), uint64(Threshold(3)), uint64(Threshold(2))
	l := NewLottery(4)
	cases := []struct {
		name string
		n    int
		vals []uint64
		want int
	}{
		{"low half fires rule 0", 4, []uint64{t3<<32 | (t4 - 1)}, 0},
		{"high half fires rule 1", 4, []uint64{(t3-1)<<32 | t4}, 1},
		{"second draw, low half fires rule 2", 4, []uint64{t3<<32 | t4, t2 - 1}, 2},
		{"all miss: last", 4, []uint64{t3<<32 | t4, t2}, 3},
		{"bit 31 of each half is masked", 4, []uint64{(0x80000000|t3)<<32 | 0x80000000 | (t4 - 1)}, 0},
		{"two endpoints use the low half only", 2, []uint64{0xFFFFFFFF<<32 | (t2 - 1)}, 0},
		{"three endpoints: rule 1 on the high half", 3, []uint64{(t2-1)<<32 | t3}, 1},
		{"three endpoints: last", 3, []uint64{t2<<32 | t3}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := &scripted64{t: t, vals: c.vals}
			if got := l.Pick(c.n, src); got != c.want {
				t.Errorf("Pick(%d) = %d, want %d", c.n, got, c.want)
			}
			if len(src.vals) != 0 {
				t.Errorf("%d draws left: the cascade evaluated fewer rules than expected", len(src.vals))
			}
		})
	}
}

// The two-rules-per-draw path (the production RuntimeSource's) passes the
// same chi-square test as the one-draw-per-rule path.
func TestLotteryChiSquareSource64(t *testing.T) {
	const picks = 1_000_000
	seed := testSeed(t, 20261130)
	l := NewLottery(64)
	for _, n := range []int{2, 3, 5, 10, 64} {
		src := pcg64{newPCG(seed + uint64(n))}
		counts := make([]int, n)
		for range picks {
			counts[l.Pick(n, src)]++
		}
		r, err := stats.GoodnessOfFit(counts, stats.Uniform(n))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("n=%d Source64: %v", n, r)
		if r.P <= 0.001 {
			t.Errorf("n=%d: the Source64 path failed the chi-square test: %v", n, r)
		}
	}
}

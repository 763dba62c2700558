package balancer

import (
	"math"
	"strconv"
	"sync"
	"sync/atomic"
)

// How kube-proxy's iptables mode chooses among n endpoints, and how we repeat it
// bit for bit:
//
//  1. kube-proxy writes one rule per endpoint into the service's KUBE-SVC chain.
//     Rule i (0 <= i < n-1) carries `-m statistic --mode random --probability P`
//     with P = fmt.Sprintf("%0.10f", 1.0/float64(n-i)); the last rule has no
//     match and always jumps (kubernetes pkg/proxy/iptables/proxier.go,
//     computeProbability and writeServiceToEndpointRules).
//  2. iptables parses P with strtod and stores the 31-bit threshold
//     lround(P * 0x80000000) (iptables extensions/libxt_statistic.c).
//  3. For every packet that reaches rule i the kernel draws a fresh random
//     value and the rule matches when (random & 0x7FFFFFFF) < threshold
//     (linux net/netfilter/xt_statistic.c, statistic_mt).
//
// Lottery does exactly those three steps, with the thresholds precomputed.

// Source is a source of uniformly distributed 32-bit random values, the
// kernel's get_random_u32. Only the low 31 bits are used, as the kernel does.
//
// Contract: a Source passed to Lottery.Pick or held by a Picker must be safe
// for concurrent use if the caller picks from several goroutines. RuntimeSource
// is; the seeded sources of tests are wrapped in a LockedSource.
type Source interface {
	Uint32() uint32
}

// Source64 is a Source that can also draw 64 bits at once. Pick uses it to
// serve two rules with one draw.
type Source64 interface {
	Source
	Uint64() uint64
}

// mask31 is the kernel's mask on the random value in statistic_mt.
const mask31 = 0x7FFFFFFF

// ProbabilityString is the probability kube-proxy prints for the first of k
// remaining endpoints: 1/k formatted with "%0.10f" (proxier.go,
// computeProbability). For k = 3 it is "0.3333333333".
func ProbabilityString(k int) string {
	return strconv.FormatFloat(1.0/float64(k), 'f', 10, 64)
}

// Threshold is the 31-bit value the kernel compares random numbers with for a
// rule printed with probability 1/k: iptables' lround(strtod(P) * 2^31)
// (libxt_statistic.c, statistic_parse). Threshold(1) is 2^31, which every
// 31-bit value is below: a probability of one.
func Threshold(k int) uint32 {
	p, err := strconv.ParseFloat(ProbabilityString(k), 64)
	if err != nil {
		// FormatFloat output always parses; this is unreachable.
		panic("balancer: unparsable probability: " + err.Error())
	}
	// math.Round rounds half away from zero, as C's lround does.
	return uint32(math.Round(p * (1 << 31)))
}

// Lottery picks an endpoint index with kube-proxy's telescoping 1/(n-i)
// cascade. Its zero value is not usable; use NewLottery. A Lottery is safe for
// concurrent use: the threshold cache grows by copy-on-write under a mutex and
// is read with one atomic load.
type Lottery struct {
	// thresholds[k] = Threshold(k) for 0 < k < len; index 0 is unused.
	thresholds atomic.Pointer[[]uint32]
	grow       sync.Mutex
}

// NewLottery returns a Lottery with thresholds cached for up to initial
// endpoints; it grows on demand beyond that.
func NewLottery(initial int) *Lottery {
	l := &Lottery{}
	empty := []uint32{0}
	l.thresholds.Store(&empty)
	l.table(initial)
	return l
}

// table returns the cached thresholds, grown to hold index n.
func (l *Lottery) table(n int) []uint32 {
	t := *l.thresholds.Load()
	if n < len(t) {
		return t
	}
	l.grow.Lock()
	defer l.grow.Unlock()
	t = *l.thresholds.Load()
	if n < len(t) {
		return t
	}
	size := max(n+1, 2*len(t))
	grown := make([]uint32, size)
	copy(grown, t)
	for k := len(t); k < size; k++ {
		grown[k] = Threshold(k)
	}
	l.thresholds.Store(&grown)
	return grown
}

// Pick returns the index, in 0..n-1, of the endpoint the kernel would jump to
// for n endpoints, drawing one value from r for every rule evaluated, as the
// kernel does. n <= 0 returns -1 (a service without endpoints has no rules).
func (l *Lottery) Pick(n int, r Source) int {
	if n <= 0 {
		return -1
	}
	t := l.table(n)[:n+1]
	if r64, ok := r.(Source64); ok {
		return pick64(t, n, r64)
	}
	// Rule i is the first of the n-i endpoints not yet passed over.
	for i := 0; i < n-1; i++ {
		if r.Uint32()&mask31 < t[n-i] {
			return i
		}
	}
	return n - 1
}

// pick64 is Pick for a Source64: each 64-bit draw serves two rules, its low
// half first. The halves of a uniform 64-bit value are independent uniform
// 32-bit values, so the outcome has exactly the distribution of the kernel's
// one get_random_u32 per rule, at half the draws.
func pick64(t []uint32, n int, r Source64) int {
	for i := 0; i < n-1; i += 2 {
		v := r.Uint64()
		if uint32(v)&mask31 < t[n-i] {
			return i
		}
		if i+1 == n-1 {
			break
		}
		if uint32(v>>32)&mask31 < t[n-i-1] {
			return i + 1
		}
	}
	return n - 1
}

// Probabilities returns the exact probability that Pick returns each index
// for n endpoints, implied by the 31-bit thresholds (not sampled): rule i
// fires with t(n-i)/2^31 after every earlier rule failed.
func (l *Lottery) Probabilities(n int) []float64 {
	if n <= 0 {
		return nil
	}
	t := l.table(n)
	out := make([]float64, n)
	reach := 1.0 // probability that rule i is evaluated
	for i := 0; i < n-1; i++ {
		fire := float64(t[n-i]) / (1 << 31)
		out[i] = reach * fire
		reach *= 1 - fire
	}
	out[n-1] = reach
	return out
}

package balancer

import "math/bits"

// The least-connection family: lc, wlc, sed and nq. They keep no state of
// their own; each pick reads the endpoints' weights and Conns in list order,
// and the comparisons are the kernel's, strict, so that of two equally
// loaded endpoints the one earlier in the list wins (every one of these
// loops replaces its candidate only on a strictly smaller load).
//
// Loads are compared as the kernel compares them, without division:
// h1/w1 > h2/w2 as h1*w2 > h2*w1 (see heavier).

// ---- lc: linux net/netfilter/ipvs/ip_vs_lc.c ----

// lc is ip_vs_lc_schedule: the endpoint with the least overhead
// (ip_vs_dest_conn_overhead: active*256 + inactive), skipping weight 0;
// weights play no other part.
type lc struct{}

var _ Scheduler = lc{}

func (lc) Name() string                { return "lc" }
func (lc) Update(eps []Endpoint) error { return nil }

func (lc) Pick(eps []Endpoint, _ Flow) int {
	least := -1
	var loh int64
	for i := range eps {
		if weightOf(&eps[i]) == 0 {
			continue
		}
		doh := eps[i].Conns.Overhead()
		if least < 0 || doh < loh {
			least, loh = i, doh
		}
	}
	return least
}

// ---- wlc: linux net/netfilter/ipvs/ip_vs_wlc.c ----

// wlc is ip_vs_wlc_schedule: the endpoint with the least overhead/weight.
// The first endpoint with a weight above zero is the first candidate; the
// ones after it replace it when loh*w > doh*wleast. Those later ones are
// not checked for weight 0: with w = 0 the left side is 0 and never wins.
type wlc struct{}

var _ Scheduler = wlc{}

func (wlc) Name() string                { return "wlc" }
func (wlc) Update(eps []Endpoint) error { return nil }

func (wlc) Pick(eps []Endpoint, _ Flow) int {
	return leastWeighted(eps, false)
}

// ---- sed: linux net/netfilter/ipvs/ip_vs_sed.c ----

// sed is ip_vs_sed_schedule: wlc's loop with the expected overhead
// activeconns + 1 (ip_vs_sed_dest_overhead: "We only use the active
// connection number in the cost calculation here"), so that the incoming
// connection counts and an idle fast endpoint is preferred to an idle slow
// one.
type sed struct{}

var _ Scheduler = sed{}

func (sed) Name() string                { return "sed" }
func (sed) Update(eps []Endpoint) error { return nil }

func (sed) Pick(eps []Endpoint, _ Flow) int {
	return leastWeighted(eps, true)
}

// ---- nq: linux net/netfilter/ipvs/ip_vs_nq.c ----

// nq is ip_vs_nq_schedule: the first endpoint (weight above zero) with no
// active connection wins at once, whatever its inactive ones; when every
// one is busy, sed's choice.
type nq struct{}

var _ Scheduler = nq{}

func (nq) Name() string                { return "nq" }
func (nq) Update(eps []Endpoint) error { return nil }

func (nq) Pick(eps []Endpoint, _ Flow) int {
	least := -1
	var loh, lw int64
	for i := range eps {
		w := weightOf(&eps[i])
		if w == 0 {
			continue
		}
		active, _ := eps[i].Conns.Load()
		doh := int64(active) + 1
		if active == 0 {
			return i
		}
		if least < 0 || heavier(loh, w, doh, lw) {
			least, loh, lw = i, doh, w
		}
	}
	return least
}

// overhead is wlc's ip_vs_dest_conn_overhead, or with expected sed's
// ip_vs_sed_dest_overhead (activeconns + 1).
func overhead(e *Endpoint, expected bool) int64 {
	active, inactive := e.Conns.Load()
	if expected {
		return int64(active) + 1
	}
	return int64(active)<<8 + int64(inactive)
}

// leastWeighted is the loop wlc and sed share; expected chooses sed's
// overhead.
func leastWeighted(eps []Endpoint, expected bool) int {
	least := -1
	for i := range eps {
		if weightOf(&eps[i]) > 0 {
			least = i
			break
		}
	}
	if least < 0 {
		return -1
	}
	loh, lw := overhead(&eps[least], expected), weightOf(&eps[least])
	for i := least + 1; i < len(eps); i++ {
		doh, w := overhead(&eps[i], expected), weightOf(&eps[i])
		if heavier(loh, w, doh, lw) {
			least, loh, lw = i, doh, w
		}
	}
	return least
}

// heavier reports whether h1*w2 > h2*w1: whether h1/w1 is a heavier load
// than h2/w2, the kernel's division-free comparison (ip_vs_wlc.c: "The
// comparison of h1*w2 > h2*w1 is equivalent to that of h1/w1 > h2/w2 if
// every weight is larger than zero"). The products are taken in 128 bits,
// so no weight or count overflows them; a negative overhead, which only
// unbalanced Conns calls could make, counts as 0.
func heavier(h1, w2, h2, w1 int64) bool {
	hi1, lo1 := bits.Mul64(uint64(max(h1, 0)), uint64(w2))
	hi2, lo2 := bits.Mul64(uint64(max(h2, 0)), uint64(w1))
	return hi1 > hi2 || hi1 == hi2 && lo1 > lo2
}

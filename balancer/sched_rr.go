package balancer

import (
	"net/netip"
	"sync"
)

// Round robin and weighted round robin: the two schedulers that keep a
// cursor into the destination list.
//
// The kernel's cursor points at a list node: the destination picked last, or
// the list head before the first pick. Here it is an index into the list,
// with -1 for the head. Both schedulers take a lock for the whole pick, as
// the kernel takes svc->sched_lock.

// headPos is the cursor at the list head.
const headPos = -1

// ---- rr: linux net/netfilter/ipvs/ip_vs_rr.c ----

// rr is ip_vs_rr.c:
//
//   - init_service puts the cursor at the list head (ip_vs_rr_init_svc).
//   - schedule walks on from the cursor, over the head and round to the
//     cursor's own destination, which is checked last; the first destination
//     with a weight above zero is picked and becomes the cursor. When there
//     is none the cursor stays (ip_vs_rr_schedule).
//   - Adding a destination leaves the cursor alone (no add_dest hook).
//     Deleting the cursor's destination moves the cursor back to the
//     destination before it, or the head (ip_vs_rr_del_dest:
//     "sched_data = p->next->prev"), so the next pick goes on with the
//     destination that followed the deleted one.
type rr struct {
	mu  sync.Mutex
	eps []Endpoint
	cur int // index of the cursor's destination in eps, or headPos
}

var _ Scheduler = (*rr)(nil)

func newRR() *rr { return &rr{cur: headPos} }

func (s *rr) Name() string { return "rr" }

func (s *rr) Update(eps []Endpoint) error {
	s.mu.Lock()
	s.update(eps)
	s.mu.Unlock()
	return nil
}

func (s *rr) Pick(eps []Endpoint, _ Flow) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sameList(s.eps, eps) {
		s.update(eps)
	}
	n := len(s.eps)
	// From the head (cur = -1) the walk is d0..dn-1; from dk it is
	// dk+1..dn-1, then (second pass, from the head) d0..dk.
	for j := 1; j <= n; j++ {
		i := (s.cur + j) % n
		if weightOf(&s.eps[i]) > 0 {
			s.cur = i
			return i
		}
	}
	return -1
}

// update carries the cursor over to eps: onto the same destination when it
// is still there, else onto the nearest destination before it that is (the
// result of the kernel's del_dest for each destination that left), else the
// head. The caller holds mu.
func (s *rr) update(eps []Endpoint) {
	old, cur := s.eps, s.cur
	s.eps, s.cur = eps, headPos
	if cur == headPos || len(eps) == 0 {
		return
	}
	where := positions(eps)
	for i := cur; i >= 0; i-- {
		if j, ok := where[old[i].Addr]; ok {
			s.cur = j
			return
		}
	}
}

// positions returns each endpoint's index by address.
func positions(eps []Endpoint) map[netip.AddrPort]int {
	m := make(map[netip.AddrPort]int, len(eps))
	for i := range eps {
		m[eps[i].Addr] = i
	}
	return m
}

// ---- wrr: linux net/netfilter/ipvs/ip_vs_wrr.c ----

// wrr is ip_vs_wrr.c. The mark holds a cursor cl, the current weight cw, the
// largest weight mw and the step di, the greatest common divisor of the
// weights above zero. Every pass over the list picks the destinations with
// weight >= cw, and cw steps down by di from one pass to the next, from mw
// down to at most di, then starts again at mw. mw is the largest weight
// minus (di - 1), so that the last pass has cw = 1 and catches a weight that
// dropped below di (the comment at the top of ip_vs_wrr.c).
//
// Any change of the list or of a weight runs ip_vs_wrr_dest_changed: the
// cursor goes back to the head, di and mw are computed again, and cw is kept
// but brought into range: cw = mw when it is above mw or zero, else cw
// rounded down to a multiple of di, plus one, when di > 1. The kernel runs
// that once per destination added, removed or changed; Update runs it once
// for the whole change.
type wrr struct {
	mu     sync.Mutex
	eps    []Endpoint
	cl     int // cursor: index in eps, or headPos
	cw     int64
	mw     int64
	di     int64
	inited bool
}

var _ Scheduler = (*wrr)(nil)

func newWRR() *wrr { return &wrr{cl: headPos} }

func (s *wrr) Name() string { return "wrr" }

func (s *wrr) Update(eps []Endpoint) error {
	s.mu.Lock()
	s.update(eps)
	s.mu.Unlock()
	return nil
}

// update is ip_vs_wrr_init_svc for the first list (cw = mw) and
// ip_vs_wrr_dest_changed after that. The caller holds mu.
func (s *wrr) update(eps []Endpoint) {
	s.eps = eps
	s.cl = headPos
	s.di = gcdWeight(eps)
	s.mw = maxWeight(eps) - (s.di - 1)
	switch {
	case !s.inited:
		s.cw = s.mw
		s.inited = true
	case s.cw > s.mw || s.cw == 0:
		s.cw = s.mw
	case s.di > 1:
		s.cw = (s.cw/s.di)*s.di + 1
	}
}

// gcdWeight is ip_vs_wrr_gcd_weight: the gcd of the weights above zero, 1
// when there are none.
func gcdWeight(eps []Endpoint) int64 {
	var g int64
	for i := range eps {
		if w := weightOf(&eps[i]); w > 0 {
			if g > 0 {
				g = gcd(w, g)
			} else {
				g = w
			}
		}
	}
	if g == 0 {
		return 1
	}
	return g
}

// maxWeight is ip_vs_wrr_max_weight: the largest weight, 0 for none.
func maxWeight(eps []Endpoint) int64 {
	var m int64
	for i := range eps {
		m = max(m, weightOf(&eps[i]))
	}
	return m
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Pick is ip_vs_wrr_schedule, step for step.
func (s *wrr) Pick(eps []Endpoint, _ Flow) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !sameList(s.eps, eps) || !s.inited {
		s.update(eps)
	}
	// No destination has a weight above zero.
	if s.mw == 0 {
		return -1
	}
	n := len(s.eps)
	d := s.cl    // the walk's position; headPos between passes
	last := s.cl // where this pick started
	stop := -2   // the destination after which to give up; none yet
	lastPass, restarted := false, false
	for {
		// list_for_each_entry_continue: from the one after d to the end.
		for d++; d < n; d++ {
			if weightOf(&s.eps[d]) >= s.cw {
				s.cl = d
				return d
			}
			if d == stop {
				s.cl = d
				return -1
			}
		}
		d = headPos
		s.cw -= s.di
		if s.cw <= 0 {
			s.cw = s.mw
			// The kernel gives up when the pass with weight >= 1
			// has been made from the first destination: either
			// this pick already ran it (lastPass), or it started
			// at the head, so its first pass was over everything.
			if lastPass || last == headPos {
				s.cl = headPos
				return -1
			}
			restarted = true
		}
		lastPass = s.cw <= s.di
		if lastPass && restarted && last != headPos {
			// The first pass for weight >= 1 only covered the
			// destinations after last; this one covers the rest,
			// up to last.
			stop = last
		}
	}
}

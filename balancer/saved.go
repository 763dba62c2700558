package balancer

// Balancing state on its way to the next process (a handover): the
// xt_recent lists, the persistence templates and the positions of rr and
// wrr, as plain values.
//
//  1. Save copies what a pick reads. Times go as ages ("set so long ago"),
//     never as instants: two processes' clocks share no origin (conntrack's
//     saved.go does the same for its entries).
//  2. Restore reads the ages against its own clock and its own
//     configuration: what has expired under this process's timeout is not
//     restored, a shorter timeout shortens what is, and nothing grows past
//     the list size or the template bound. A value that does not hold
//     together (an address twice, a negative age, a cursor off the list) is
//     refused with an error wrapping ErrBadSaved, and nothing of it is
//     applied.
//  3. Connection counts are not saved: they belong to the flows. The flows
//     that move are counted again by the process that adopts them (Conns,
//     Persistence.Adopt); the others end with the old process.
//
// The caller keys what it saves by service port and endpoint, and drops
// what the new process's table does not have: a Restore here applies
// whatever it is given.

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// ErrBadSaved is saved balancing state that does not hold together.
var ErrBadSaved = errors.New("balancer: saved state not valid")

// ---- xt_recent affinity ----

// SavedList is one endpoint's recent list, saved.
type SavedList struct {
	// Endpoint is the list's endpoint key ("ip:port").
	Endpoint string
	// Clients are the list's entries with the age of their stamps, least
	// recently set first.
	Clients []ClientAge
}

// Save returns the lists, by endpoint key, with the entries that would
// still match a check. A stale entry is left out: it matches nothing and
// only waits to be reaped or evicted.
func (a *Affinity) Save() []SavedList {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	stale := now - a.timeout
	var out []SavedList
	for key, l := range a.lists {
		sl := SavedList{Endpoint: key}
		for e := l.head; e != nil; e = e.next {
			if e.stamp >= stale {
				sl.Clients = append(sl.Clients, ClientAge{Addr: e.addr, Age: time.Duration(now - e.stamp)})
			}
		}
		if len(sl.Clients) > 0 {
			out = append(out, sl)
		}
	}
	slices.SortFunc(out, func(x, y SavedList) int { return cmp.Compare(x.Endpoint, y.Endpoint) })
	return out
}

// Restore puts lists saved by another process's Affinity into this one,
// each entry stamped its age before now on this clock. It returns how many
// entries it restored and how many it dropped: those older than this
// Affinity's timeout, those past its list size (the least recently set go,
// as a full list evicts them), and those of a client that a list here set
// more recently.
func (a *Affinity) Restore(lists []SavedList) (restored, dropped int, err error) {
	if err := checkLists(lists); err != nil {
		return 0, 0, err
	}
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, sl := range lists {
		fresh := make([]ClientAge, 0, len(sl.Clients))
		for _, c := range sl.Clients {
			if int64(c.Age) <= a.timeout { // as check's: a stamp T old still matches
				fresh = append(fresh, c)
			}
		}
		// The most recently set first, so that a list past its size
		// keeps those.
		slices.SortStableFunc(fresh, func(x, y ClientAge) int { return cmp.Compare(x.Age, y.Age) })
		fresh = fresh[:min(len(fresh), a.listSize)]
		if len(fresh) == 0 {
			dropped += len(sl.Clients)
			continue
		}
		l := a.list(sl.Endpoint)
		for i := len(fresh) - 1; i >= 0; i-- {
			l.setAt(fresh[i].Addr, now-int64(fresh[i].Age), a.listSize)
		}
		n := 0
		for _, c := range fresh {
			if e := l.byAddr[c.Addr]; e != nil && e.stamp == now-int64(c.Age) {
				n++
			}
		}
		restored += n
		dropped += len(sl.Clients) - n
	}
	return restored, dropped, nil
}

// checkLists refuses lists that no Affinity saved.
func checkLists(lists []SavedList) error {
	keys := make(map[string]bool, len(lists))
	for _, sl := range lists {
		if sl.Endpoint == "" || keys[sl.Endpoint] {
			return fmt.Errorf("%w: a recent list named %q, or twice", ErrBadSaved, sl.Endpoint)
		}
		keys[sl.Endpoint] = true
		seen := make(map[netip.Addr]bool, len(sl.Clients))
		for _, c := range sl.Clients {
			if !c.Addr.IsValid() || seen[c.Addr] || c.Age < 0 {
				return fmt.Errorf("%w: list %s: client %v aged %v, or twice", ErrBadSaved, sl.Endpoint, c.Addr, c.Age)
			}
			seen[c.Addr] = true
		}
	}
	return nil
}

// setAt is set for a stamp from elsewhere: the entry goes where its stamp
// puts it in the order of --set rather than at the tail, and an entry here
// set later is left as it is. A full list then loses its least recently
// set entry, which may be the one just put in.
func (l *recentList) setAt(addr netip.Addr, stamp int64, limit int) {
	if e := l.byAddr[addr]; e != nil {
		if e.stamp >= stamp {
			return
		}
		l.remove(e)
	}
	after := l.tail // the last entry set no later than stamp
	for after != nil && after.stamp > stamp {
		after = after.prev
	}
	e := &recentEntry{addr: addr, stamp: stamp}
	l.byAddr[addr] = e
	l.insertAfter(e, after)
	if len(l.byAddr) > limit {
		l.remove(l.head)
	}
}

// ---- IPVS persistence ----

// SavedTemplate is one persistence template, saved.
type SavedTemplate struct {
	Client netip.Addr
	Dest   netip.AddrPort
	// Idle is the time since the template was last used.
	Idle time.Duration
	// Controls is how many connections it controlled. Released is the
	// time since the last of them ended; it is 0 while Controls is not.
	Controls int
	Released time.Duration
	// Rechecked: the template outlived its timeout while it controlled
	// connections, and its timer now runs in 60 s steps (expire_later).
	Rechecked bool
}

// Save returns the templates that have not expired, by client address.
func (p *Persistence) Save() []SavedTemplate {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	var out []SavedTemplate
	for c, t := range p.templates {
		if !t.alive(now) {
			continue
		}
		s := SavedTemplate{Client: c, Dest: t.dest, Idle: time.Duration(now - t.lastUse), Controls: int(t.controls), Rechecked: t.timeout == persistRecheck}
		if t.controls == 0 {
			s.Released = time.Duration(now - t.zeroAt)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(x, y SavedTemplate) int { return x.Client.Compare(y.Client) })
	return out
}

// Restore puts templates saved by another process's Persistence into this
// one, last used their Idle before now on this clock, with this
// Persistence's timeout unless they were rechecked. They control no
// connection here: the connections they controlled ended with that
// process, as far as this one knows, just now (ip_vs_conn_expire then
// keeps a template that outlived its timeout up to 60 s more); those that
// moved are counted again by Adopt. It returns how many it restored and
// how many it dropped: those that have expired by this timeout, those of a
// client with a live template here, and those past MaxTemplates (the least
// recently used go).
func (p *Persistence) Restore(ts []SavedTemplate) (restored, dropped int, err error) {
	seen := make(map[netip.Addr]bool, len(ts))
	for _, s := range ts {
		c := s.Client.Unmap()
		switch {
		case !c.IsValid() || !s.Dest.IsValid() || seen[c]:
			return 0, 0, fmt.Errorf("%w: a template for %v to %v, or twice", ErrBadSaved, s.Client, s.Dest)
		case s.Idle < 0 || s.Controls < 0 || s.Released < 0 || s.Released > s.Idle || (s.Controls > 0 && s.Released != 0):
			return 0, 0, fmt.Errorf("%w: template for %v: idle %v, %d connections, released %v", ErrBadSaved, s.Client, s.Idle, s.Controls, s.Released)
		}
		seen[c] = true
	}
	byUse := slices.Clone(ts)
	slices.SortStableFunc(byUse, func(x, y SavedTemplate) int { return cmp.Compare(x.Idle, y.Idle) })
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for _, s := range byUse {
		t := &Template{p: p, dest: s.Dest, lastUse: now - int64(s.Idle), timeout: p.timeout, zeroAt: now}
		if s.Rechecked {
			t.timeout = persistRecheck
		}
		if s.Controls == 0 {
			t.zeroAt = now - int64(s.Released)
		}
		c := s.Client.Unmap()
		if !t.alive(now) {
			continue
		}
		if old := p.templates[c]; old != nil && old.alive(now) {
			continue
		}
		if _, ok := p.templates[c]; !ok && len(p.templates) >= p.max && !p.sweepLocked(now) {
			continue
		}
		p.templates[c] = t
		restored++
	}
	return restored, len(ts) - restored, nil
}

// Adopt counts a connection that another process made through client's
// template and handed over: the template restored from there controls it
// again, as it did there (n_control). It is not a use, so the timer is left
// as it was restored. It returns the template, to Release once the
// connection ends, or nil when client has no live template to dest.
func (p *Persistence) Adopt(client netip.Addr, dest netip.AddrPort) *Template {
	client = client.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.templates[client]
	if t == nil || t.dest != dest || !t.alive(p.now()) {
		return nil
	}
	t.controls++
	return t
}

// ---- rr and wrr positions ----

// SavedScheduler is the position of a scheduler that keeps one from pick
// to pick (rr, wrr), saved with the list it is a position in.
type SavedScheduler struct {
	// Name is the scheduler's: "rr" or "wrr".
	Name string
	// Endpoints is the list the scheduler was over: addresses and
	// weights (Conns are the flows' and are not saved).
	Endpoints []Endpoint
	// Cursor is the index in Endpoints of the destination picked last,
	// or -1 for the list head.
	Cursor int
	// Weight is wrr's current weight (cw); 0 for rr.
	Weight int64
}

// positioned is a Scheduler whose next pick depends on its last.
type positioned interface {
	save() SavedScheduler
	restore(v SavedScheduler, eps []Endpoint)
}

var (
	_ positioned = (*rr)(nil)
	_ positioned = (*wrr)(nil)
)

// SaveScheduler returns s's position, and false for a scheduler that has
// none: the lottery and the least-connection family read only the list and
// its counts, and sh, dh and mh build their tables from the list alone.
// (mh's last_weight of an endpoint quiesced to weight 0 is not kept:
// userproxy gives every endpoint weight 1.)
func SaveScheduler(s Scheduler) (SavedScheduler, bool) {
	if ps, ok := s.(positioned); ok {
		return ps.save(), true
	}
	return SavedScheduler{}, false
}

// RestoreScheduler puts a position saved from a scheduler of the same name
// into s, which is over eps now. It is as if the list had changed from the
// saved one to eps in the process that saved it (the kernel's add_dest and
// del_dest): rr's cursor stays on its destination, or the nearest before
// it that is still listed; wrr keeps its place when the list is the same,
// and otherwise goes back to the head with its weight brought into range.
func RestoreScheduler(s Scheduler, v SavedScheduler, eps []Endpoint) error {
	ps, ok := s.(positioned)
	if !ok || s.Name() != v.Name {
		return fmt.Errorf("%w: a position of %q for scheduler %q", ErrBadSaved, v.Name, s.Name())
	}
	if v.Cursor < headPos || v.Cursor >= len(v.Endpoints) {
		return fmt.Errorf("%w: %s cursor %d in a list of %d", ErrBadSaved, v.Name, v.Cursor, len(v.Endpoints))
	}
	seen := make(map[netip.AddrPort]bool, len(v.Endpoints))
	for _, e := range v.Endpoints {
		if !e.Addr.IsValid() || seen[e.Addr] || e.Weight < 0 {
			return fmt.Errorf("%w: %s endpoint %v of weight %d, or twice", ErrBadSaved, v.Name, e.Addr, e.Weight)
		}
		seen[e.Addr] = true
	}
	if v.Name == "rr" && v.Weight != 0 {
		return fmt.Errorf("%w: rr with a weight of %d", ErrBadSaved, v.Weight)
	}
	if v.Name == "wrr" {
		// At rest, cw lies in [1, mw], or is 0 when every weight is.
		mw := maxWeight(v.Endpoints) - (gcdWeight(v.Endpoints) - 1)
		if (mw <= 0 && v.Weight != 0) || (mw > 0 && (v.Weight < 1 || v.Weight > mw)) {
			return fmt.Errorf("%w: wrr current weight %d, largest %d", ErrBadSaved, v.Weight, mw)
		}
	}
	ps.restore(v, eps)
	return nil
}

// sameWeighted reports whether a and b list the same endpoints with the
// same weights, in the same order.
func sameWeighted(a, b []Endpoint) bool {
	return slices.EqualFunc(a, b, func(x, y Endpoint) bool { return x.Addr == y.Addr && weightOf(&x) == weightOf(&y) })
}

// plainList copies eps without their Conns.
func plainList(eps []Endpoint) []Endpoint {
	out := make([]Endpoint, len(eps))
	for i, e := range eps {
		out[i] = Endpoint{Addr: e.Addr, Weight: e.Weight}
	}
	return out
}

func (s *rr) save() SavedScheduler {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SavedScheduler{Name: "rr", Endpoints: plainList(s.eps), Cursor: s.cur}
}

// restore carries the saved cursor over to eps as update carries its own.
func (s *rr) restore(v SavedScheduler, eps []Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.eps, s.cur = v.Endpoints, v.Cursor
	s.update(eps)
}

func (s *wrr) save() SavedScheduler {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SavedScheduler{Name: "wrr", Endpoints: plainList(s.eps), Cursor: s.cl, Weight: s.cw}
}

// restore is ip_vs_wrr_dest_changed from the saved state, unless nothing
// changed: then the cursor and weight go on as they were.
func (s *wrr) restore(v SavedScheduler, eps []Endpoint) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inited, s.cw = true, v.Weight
	s.update(eps)
	if sameWeighted(v.Endpoints, eps) {
		s.cl, s.cw = v.Cursor, v.Weight
	}
}

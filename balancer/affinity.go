package balancer

import (
	"net/netip"
	"sync"
	"time"
)

// ClientIP session affinity, modelled on the kernel's xt_recent match the way
// kube-proxy uses it (linux net/netfilter/xt_recent.c; kubernetes
// pkg/proxy/iptables/proxier.go, writeServiceToEndpointRules):
//
//  1. Each endpoint of a service port has its own recent list, named after the
//     endpoint's KUBE-SEP chain, keyed by the client's source address only.
//  2. Before the lottery, the KUBE-SVC chain checks the endpoints' lists in
//     endpoint order with `--rcheck --seconds T --reap`; the first list that
//     holds the client with a timestamp no older than T wins. A check never
//     refreshes a timestamp. When the client is in the list, the check also
//     reaps: it removes the list's least recently set entry if that entry is
//     stale (recent_entry_reap), so at most one entry per check.
//  3. The chosen endpoint's KUBE-SEP chain does `--set`: the client's entry in
//     that list is created or refreshed and becomes the most recently set.
//  4. A list holds at most ip_list_tot entries (kernel default 100); adding to a
//     full list first removes its least recently set entry (recent_entry_init).
//  5. nat rules see only the first packet of a connection, so all of this
//     happens once per new connection, never per packet.
//  6. A list lives as long as a rule names it: when an endpoint leaves, its
//     chain and list are gone.

// Clock tells the time. The real clock is SystemClock; tests use a manual one.
type Clock interface {
	Now() time.Time
}

// SystemClock is the wall clock.
type SystemClock struct{}

var _ Clock = SystemClock{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// DefaultAffinityTimeout is kube-proxy's default for
// sessionAffinityConfig.clientIP.timeoutSeconds (10800 s); 86400 s is the
// largest the API allows.
const DefaultAffinityTimeout = 10800 * time.Second

// DefaultListSize is the kernel's default xt_recent ip_list_tot.
const DefaultListSize = 100

// AffinityConfig configures the affinity state of one service port.
type AffinityConfig struct {
	// Timeout is the --seconds of the rcheck rules. Zero means
	// DefaultAffinityTimeout.
	Timeout time.Duration
	// ListSize is the most clients one endpoint's list holds (ip_list_tot).
	// Zero means DefaultListSize.
	ListSize int
	// Clock is the time source. Nil means SystemClock.
	Clock Clock
}

// Affinity holds the recent lists of one service port. It is safe for
// concurrent use; one mutex guards all lists of the service port, as the
// kernel's recent_lock guards all tables.
type Affinity struct {
	timeout  int64 // nanoseconds
	listSize int
	clock    Clock

	mu    sync.Mutex
	lists map[string]*recentList // by endpoint key ("ip:port")
	// epoch is the origin of the nanosecond stamps: stamps are durations
	// since it, read from the monotonic clock.
	epoch time.Time
	// resolved caches the lists of the keys slice resolvedFor.
	resolvedFor []string
	resolved    []*recentList
}

// NewAffinity returns empty affinity state for one service port.
func NewAffinity(cfg AffinityConfig) *Affinity {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultAffinityTimeout
	}
	if cfg.ListSize <= 0 {
		cfg.ListSize = DefaultListSize
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	return &Affinity{
		timeout:  int64(cfg.Timeout),
		listSize: cfg.ListSize,
		clock:    cfg.Clock,
		lists:    make(map[string]*recentList),
		epoch:    cfg.Clock.Now(),
	}
}

// Timeout returns the configured affinity timeout.
func (a *Affinity) Timeout() time.Duration { return time.Duration(a.timeout) }

func (a *Affinity) now() int64 { return int64(a.clock.Now().Sub(a.epoch)) }

// Check runs the rcheck rules: it returns the index of the first endpoint in
// keys whose list holds client with a fresh timestamp. It never refreshes a
// timestamp; each list it looks at in which the client is present may lose
// its least recently set entry if that one is stale (--reap).
//
// keys must not be modified after it is passed (the service table's slices
// are immutable): the lists resolved for a keys slice are cached by its
// backing array.
func (a *Affinity) Check(keys []string, client netip.Addr) (int, bool) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.check(a.resolve(keys), client, now)
}

// Set runs the --set of the chosen endpoint's chain: client's entry in the
// list of key is created or refreshed and becomes the most recently set.
func (a *Affinity) Set(key string, client netip.Addr) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.list(key).set(client, now, a.listSize)
}

// pick is Check, then draw() on a miss, then Set of the chosen endpoint, under
// one lock and one reading of the clock, as the kernel runs the whole chain
// for one packet. draw must return an index into keys.
func (a *Affinity) pick(keys []string, client netip.Addr, draw func() int) (int, bool) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	lists := a.resolve(keys)
	i, hit := a.check(lists, client, now)
	if !hit {
		i = draw()
	}
	l := lists[i]
	if l == nil {
		l = a.list(keys[i])
		lists[i] = l
	}
	l.set(client, now, a.listSize)
	return i, hit
}

func (a *Affinity) check(lists []*recentList, client netip.Addr, now int64) (int, bool) {
	stale := now - a.timeout // stamps before this are stale
	for i, l := range lists {
		if l == nil {
			continue
		}
		e := l.byAddr[client]
		if e == nil {
			// xt_recent returns before reaping when the source is absent.
			continue
		}
		hit := e.stamp >= stale
		l.reap(stale)
		if hit {
			return i, true
		}
	}
	return -1, false
}

// list returns key's list, creating it. The caller holds mu.
func (a *Affinity) list(key string) *recentList {
	l := a.lists[key]
	if l == nil {
		l = newRecentList()
		a.lists[key] = l
		a.resolvedFor = nil
	}
	return l
}

// resolve returns the lists of keys in order (nil where an endpoint has none
// yet), cached for the last keys slice seen. The caller holds mu.
func (a *Affinity) resolve(keys []string) []*recentList {
	if len(keys) > 0 && len(keys) == len(a.resolvedFor) && &keys[0] == &a.resolvedFor[0] {
		return a.resolved
	}
	a.resolved = a.resolved[:0]
	for _, k := range keys {
		a.resolved = append(a.resolved, a.lists[k])
	}
	a.resolvedFor = keys
	return a.resolved
}

// Retain drops the lists of every endpoint not in keys: the endpoint's chain,
// and with it its list, is gone.
func (a *Affinity) Retain(keys []string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.lists) == 0 {
		return
	}
	keep := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		keep[k] = struct{}{}
	}
	for k := range a.lists {
		if _, ok := keep[k]; !ok {
			delete(a.lists, k)
		}
	}
	a.resolvedFor = nil
}

// Forget drops the list of one endpoint.
func (a *Affinity) Forget(key string) {
	a.mu.Lock()
	delete(a.lists, key)
	a.resolvedFor = nil
	a.mu.Unlock()
}

// Clients returns the clients in key's list, least recently set first, with
// the age of their timestamps. It is for tests and the admin endpoint.
func (a *Affinity) Clients(key string) []ClientAge {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.lists[key]
	if l == nil {
		return nil
	}
	out := make([]ClientAge, 0, len(l.byAddr))
	for e := l.head; e != nil; e = e.next {
		out = append(out, ClientAge{Addr: e.addr, Age: time.Duration(now - e.stamp)})
	}
	return out
}

// ClientAge is one entry of a recent list.
type ClientAge struct {
	Addr netip.Addr
	Age  time.Duration
}

// recentList is one xt_recent table: a map by source address and a list in
// order of last --set, least recent at the head (the kernel's lru_list).
type recentList struct {
	byAddr     map[netip.Addr]*recentEntry
	head, tail *recentEntry
}

type recentEntry struct {
	addr       netip.Addr
	stamp      int64 // time of the last --set, nanoseconds since the epoch
	prev, next *recentEntry
}

func newRecentList() *recentList {
	return &recentList{byAddr: make(map[netip.Addr]*recentEntry)}
}

// set creates or refreshes addr and moves it to the tail; a new entry in a
// full list first evicts the head.
func (l *recentList) set(addr netip.Addr, now int64, limit int) {
	e := l.byAddr[addr]
	if e == nil {
		if len(l.byAddr) >= limit {
			l.remove(l.head)
		}
		e = &recentEntry{addr: addr}
		l.byAddr[addr] = e
	} else {
		l.unlink(e)
	}
	e.stamp = now
	l.pushTail(e)
}

// reap removes the least recently set entry if its stamp is stale.
func (l *recentList) reap(stale int64) {
	if l.head != nil && l.head.stamp < stale {
		l.remove(l.head)
	}
}

func (l *recentList) remove(e *recentEntry) {
	l.unlink(e)
	delete(l.byAddr, e.addr)
}

func (l *recentList) unlink(e *recentEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		l.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (l *recentList) pushTail(e *recentEntry) { l.insertAfter(e, l.tail) }

// insertAfter links e in after at, or at the head when at is nil.
func (l *recentList) insertAfter(e, at *recentEntry) {
	e.prev = at
	if at != nil {
		e.next, at.next = at.next, e
	} else {
		e.next, l.head = l.head, e
	}
	if e.next != nil {
		e.next.prev = e
	} else {
		l.tail = e
	}
}

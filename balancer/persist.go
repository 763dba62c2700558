package balancer

import (
	"net/netip"
	"slices"
	"sync"
	"time"
)

// IPVS persistence, which kube-proxy's IPVS mode sets for sessionAffinity:
// ClientIP (`persistent T`, T = timeoutSeconds), the way the kernel runs it
// (linux net/netfilter/ipvs/ip_vs_core.c, ip_vs_sched_persist; ip_vs_conn.c,
// ip_vs_conn_expire, ip_vs_check_template, ip_vs_conn_put):
//
//  1. A persistent virtual service keeps one connection template per client
//     address (persistence netmask /32 and /128, the default), naming the
//     destination that client was scheduled to.
//  2. A new connection from a client whose template is alive and whose
//     destination is still in the list goes to that destination; the
//     scheduler is not asked. A template whose destination left the list is
//     invalid (ip_vs_check_template): it is dropped and the scheduler picks
//     again, making a new template.
//  3. Each connection made through a template is "controlled" by it
//     (n_control), and using the template re-arms its timer to its
//     timeout, T when it is made (ip_vs_conn_put).
//  4. When the timer fires, a template that controls no connection
//     expires. One that still controls some is not expired: its timeout
//     becomes 60 s and the timer is re-armed (ip_vs_conn_expire,
//     expire_later: cp->timeout = 60*HZ); a later use re-arms it with that
//     timeout too (ip_vs_sched_persist leaves a found template's timeout
//     alone). So a template ends T after its last use, or, once it has
//     outlived T with connections, within 60 s after its last connection
//     ends.
//
// Unlike xt_recent affinity (affinity.go), persistence counts live
// connections, so the caller must Release every Template Pick hands out,
// once, when the connection ends.

// persistRecheck is the timeout of a template that outlived its first
// timeout while controlling connections (expire_later's 60*HZ).
const persistRecheck = int64(60 * time.Second)

// DefaultMaxTemplates bounds the templates of one service port. The kernel
// bounds them only by memory; here a client spraying new source addresses
// cannot grow a port's state past it: when the map is full and nothing in it
// has expired, a new client is scheduled without a template.
const DefaultMaxTemplates = 65536

// PersistenceConfig configures the persistence of one service port.
type PersistenceConfig struct {
	// Timeout is T, the persistence timeout; zero means
	// DefaultAffinityTimeout.
	Timeout time.Duration
	// MaxTemplates bounds the templates; zero means DefaultMaxTemplates.
	MaxTemplates int
	// Clock is the time source; nil means SystemClock.
	Clock Clock
}

// Persistence holds the connection templates of one service port. It is
// safe for concurrent use.
type Persistence struct {
	timeout int64 // nanoseconds
	max     int
	clock   Clock
	epoch   time.Time

	mu        sync.Mutex
	templates map[netip.Addr]*Template
	// noSweepUntil holds off the sweep of a full map that found nothing
	// expired, so that a full map costs one scan per second, not per pick.
	noSweepUntil int64
}

// Template is one client's connection template. Release it once per
// connection Pick made through it.
type Template struct {
	p    *Persistence
	dest netip.AddrPort
	// Under p.mu: the controlled connections, the stamp of the last use and
	// of the moment the controls last fell to zero, and the timeout the
	// last use armed (T, or persistRecheck once step 4 re-armed it).
	controls int32
	lastUse  int64
	zeroAt   int64
	timeout  int64
	// hint is the destination's index in the list last seen.
	hint int
}

// NewPersistence returns the persistence state of one service port.
func NewPersistence(cfg PersistenceConfig) *Persistence {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultAffinityTimeout
	}
	if cfg.MaxTemplates <= 0 {
		cfg.MaxTemplates = DefaultMaxTemplates
	}
	if cfg.Clock == nil {
		cfg.Clock = SystemClock{}
	}
	return &Persistence{
		timeout: int64(cfg.Timeout), max: cfg.MaxTemplates, clock: cfg.Clock,
		epoch: cfg.Clock.Now(), templates: make(map[netip.Addr]*Template),
	}
}

// Len returns the number of templates held, live or not yet swept.
func (p *Persistence) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.templates)
}

func (p *Persistence) now() int64 { return int64(p.clock.Now().Sub(p.epoch)) }

// Pick returns the index in eps of the endpoint for a new connection from
// client: its template's destination when the template is alive and the
// destination is in eps (byTemplate true), else schedule's choice, which
// becomes the client's template. It returns -1, and no template, when
// schedule does. The returned Template is nil only then, or when the map is
// full; otherwise the connection is counted as controlled and the caller
// must Release it once the connection ends.
func (p *Persistence) Pick(client netip.Addr, eps []Endpoint, schedule func() int) (index int, t *Template, byTemplate bool) {
	client = client.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if t := p.templates[client]; t != nil {
		if t.alive(now) {
			if i := t.find(eps); i >= 0 {
				if now >= t.lastUse+t.timeout {
					t.timeout = persistRecheck // the timer fired while it controlled connections
				}
				t.controls++
				t.lastUse = now
				return i, t, true
			}
		}
		// Expired, or its destination left (ip_vs_check_template): the
		// connections it still controls keep their Template pointer and
		// release into it harmlessly.
		delete(p.templates, client)
	}
	i := schedule()
	if i < 0 || i >= len(eps) {
		return -1, nil, false
	}
	if len(p.templates) >= p.max && !p.sweepLocked(now) {
		return i, nil, false
	}
	t = &Template{p: p, dest: eps[i].Addr, controls: 1, lastUse: now, timeout: p.timeout, hint: i}
	p.templates[client] = t
	return i, t, false
}

// Release uncounts one connection the template controlled (ip_vs_control_del).
func (t *Template) Release() {
	if t == nil {
		return
	}
	t.p.mu.Lock()
	defer t.p.mu.Unlock()
	if t.controls > 0 {
		t.controls--
		if t.controls == 0 {
			t.zeroAt = t.p.now()
		}
	}
}

// alive reports whether the template's timer has not yet expired it at now
// (step 4): it fires at lastUse + timeout, then every persistRecheck, and
// expires the template at the first firing at which it controls no
// connection (the controls only fall between two uses).
func (t *Template) alive(now int64) bool {
	if t.controls > 0 {
		return true
	}
	first := t.lastUse + t.timeout
	if t.zeroAt <= first {
		return now < first
	}
	k := (t.zeroAt - first + persistRecheck - 1) / persistRecheck
	return now < first+max(k, 1)*persistRecheck
}

// find returns the index of the template's destination in eps, or -1.
func (t *Template) find(eps []Endpoint) int {
	if t.hint < len(eps) && eps[t.hint].Addr == t.dest {
		return t.hint
	}
	i := slices.IndexFunc(eps, func(e Endpoint) bool { return e.Addr == t.dest })
	if i >= 0 {
		t.hint = i
	}
	return i
}

// Peek returns what Pick would answer for client from its template alone:
// the index in eps of the template's destination while the template is
// alive and the destination listed, without using or changing it.
func (p *Persistence) Peek(client netip.Addr, eps []Endpoint) (int, bool) {
	client = client.Unmap()
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := p.templates[client]; t != nil && t.alive(p.now()) {
		if i := slices.IndexFunc(eps, func(e Endpoint) bool { return e.Addr == t.dest }); i >= 0 {
			return i, true
		}
	}
	return -1, false
}

// Sweep drops the templates that have expired and returns how many.
func (p *Persistence) Sweep() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.templates)
	p.sweepLocked(p.now())
	return n - len(p.templates)
}

// sweepLocked drops expired templates and reports whether there is room for
// a new one; a sweep that frees nothing holds off the next for a second.
func (p *Persistence) sweepLocked(now int64) bool {
	if now < p.noSweepUntil {
		return false
	}
	for c, t := range p.templates {
		if !t.alive(now) {
			delete(p.templates, c)
		}
	}
	if len(p.templates) >= p.max {
		p.noSweepUntil = now + int64(time.Second)
		return false
	}
	return true
}

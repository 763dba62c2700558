package service

import (
	"errors"
	"net/netip"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Handler receives Service and EndpointSlice events. Both sources (kube,
// file) call it; Tracker implements it. The shape is kube-proxy's
// ServiceHandler and EndpointSliceHandler (pkg/proxy/config/config.go) with
// one OnSynced for both kinds.
//
// Contract for callers: objects passed in are read-only to the handler and
// to the caller for as long as the call lasts; calls may come from several
// goroutines at once; OnSynced is called once, after every object that
// existed at start has been delivered.
type Handler interface {
	OnServiceAdd(svc *v1.Service)
	OnServiceUpdate(oldSvc, svc *v1.Service)
	OnServiceDelete(svc *v1.Service)
	OnEndpointSliceAdd(slice *discoveryv1.EndpointSlice)
	OnEndpointSliceUpdate(oldSlice, slice *discoveryv1.EndpointSlice)
	OnEndpointSliceDelete(slice *discoveryv1.EndpointSlice)
	OnSynced()
}

var _ Handler = (*Tracker)(nil)

// DefaultMinSyncPeriod is kube-proxy's default --min-sync-period.
const DefaultMinSyncPeriod = time.Second

// Config configures a Tracker.
type Config struct {
	// NodeName is this node's name (kube-proxy's --hostname-override):
	// endpoints on it are local, for internalTrafficPolicy Local and node
	// hints. Empty: no endpoint is local.
	NodeName string
	// Zone is this node's topology.kubernetes.io/zone label, for zone hints.
	// Empty: zone hints are ignored (as kube-proxy ignores them on a node
	// without the label).
	Zone string
	// MinSyncPeriod is the least time between the starts of two table
	// builds (kube-proxy's --min-sync-period): changes arriving sooner are
	// coalesced into the next build. Zero builds on every change. Negative
	// is an error. DefaultConfig sets DefaultMinSyncPeriod.
	MinSyncPeriod time.Duration
	// Clock is the time source; nil means RealClock().
	Clock Clock
	// OnSync, if set, is called with each new table right after it went
	// live (Current returns it), and what changed since the previous one.
	// Calls are serialized and in table order. It runs in the goroutine
	// whose event or timer triggered the build, and must not call the
	// Tracker's handlers (Current and Stats are fine).
	OnSync func(t *Table, c Changes)
}

// DefaultConfig returns a Config with kube-proxy's defaults.
func DefaultConfig() Config {
	return Config{MinSyncPeriod: DefaultMinSyncPeriod, Clock: RealClock()}
}

// Changes describes how a table differs from the one before it. For the
// first table, everything is added. A table whose only changes are in the
// DNS view (a headless service's endpoints, an ExternalName) is published
// with no Ports changes.
type Changes struct {
	// Added, Removed and Changed name the services that gained their first
	// Port, lost their last one, or had a Port change. Sorted.
	Added, Removed, Changed []ServiceName
	// Ports lists every Port added, removed or changed, sorted by name,
	// protocol and family.
	Ports []PortChange
	// NetworkProgrammingLatencies are the latency samples this table
	// completes (also accumulated in Stats.NetworkProgrammingLatency).
	NetworkProgrammingLatencies []time.Duration
}

// Empty reports whether no service port changed.
func (c *Changes) Empty() bool { return len(c.Ports) == 0 }

// PortChange is one Port added (Old nil), removed (New nil) or changed.
type PortChange struct {
	Name     PortName
	Protocol Protocol
	Family   Family
	Old, New *Port
	// EndpointsAdded and EndpointsRemoved are the endpoint keys ("ip:port")
	// that entered or left the port's usable endpoints, sorted. A removed
	// port removes all of its endpoints. The proxy drops the affinity state
	// of removed endpoints. Read-only: they may share memory with the Ports'
	// EndpointKeys.
	EndpointsAdded, EndpointsRemoved []string
	// StaleUDP, for a UDP port, are the endpoints whose flows must end: they
	// served (or were usable) before and serve no more, sorted by key.
	// As kube-proxy's cleanup (pkg/proxy/conntrack/cleanup.go), nothing is
	// stale while no endpoint of the port serves; unlike it, a removed port
	// makes all of its endpoints stale (the ClusterIP is gone, and the
	// proxy would otherwise keep relaying its flows until they time out).
	StaleUDP []netip.AddrPort
}

// Tracker turns Service and EndpointSlice events into Tables. It keeps the
// converted state of every object, marks the services an event touches,
// and builds a new Table from the previous one by recomputing only those.
//
// Building is coalesced: after OnSynced, an event starts a build at once
// when the last one started at least MinSyncPeriod ago, else a timer
// (Clock.AfterFunc) starts it when the period is over; events in between
// join that build. The build runs in the goroutine of the event or timer
// that triggered it; handlers called meanwhile wait for it. The Tracker
// owns no long-lived goroutine (a large build spreads its work over a few
// goroutines that end with it). No table exists before OnSynced.
//
// All methods are safe for concurrent use.
type Tracker struct {
	node    nodeInfo
	minSync time.Duration
	clock   Clock
	onSync  func(*Table, Changes)
	start   time.Time

	current atomic.Pointer[Table]

	// buildMu serializes builds and OnSync calls; it is taken before mu.
	buildMu sync.Mutex

	mu       sync.Mutex
	services map[ServiceName]*svcState
	// dirty lists the services changed since the last build (each once,
	// see svcState.dirty).
	dirty     []ServiceName
	synced    bool
	closed    bool
	published bool
	lastSync  time.Time
	timer     Timer
	timerGen  uint64
	// conflicts holds, per lookup key, the Ports that lost it to another
	// service's Port with a lower name; ipExtra counts the services beyond
	// the first that claim a ClusterIP.
	conflicts map[lookupKey][]*Port
	ipExtra   map[netip.Addr]int
	// ptrWaiting holds, per ClusterIP, the services that lost its PTR
	// record to a lower name; nsRefs counts the DNS view's services per
	// namespace.
	ptrWaiting map[netip.Addr][]ServiceName
	nsRefs     map[string]int
	skipped    map[ServiceName][]Skipped
	noLocal    int
	scratch    scratch

	stats           Stats
	syncHist        histogram
	programmingHist histogram
}

type svcState struct {
	// dirty is true while the service is listed in Tracker.dirty.
	dirty bool
	info  *svcInfo
	// slices are sorted by name.
	slices []*sliceInfo
	// As applied to the current table:
	ports    []*Port
	ips      []netip.Addr
	skipped  []Skipped
	dns      *DNSService
	triggers []time.Time
}

// maxTriggers bounds the latency samples kept per service between builds.
const maxTriggers = 64

// NewTracker returns a Tracker. It publishes nothing until OnSynced.
func NewTracker(cfg Config) (*Tracker, error) {
	if cfg.MinSyncPeriod < 0 {
		return nil, errors.New("service: negative MinSyncPeriod")
	}
	if cfg.Clock == nil {
		cfg.Clock = RealClock()
	}
	t := &Tracker{
		node:            nodeInfo{name: cfg.NodeName, zone: cfg.Zone},
		minSync:         cfg.MinSyncPeriod,
		clock:           cfg.Clock,
		onSync:          cfg.OnSync,
		start:           cfg.Clock.Now(),
		services:        make(map[ServiceName]*svcState),
		conflicts:       make(map[lookupKey][]*Port),
		ipExtra:         make(map[netip.Addr]int),
		ptrWaiting:      make(map[netip.Addr][]ServiceName),
		nsRefs:          make(map[string]int),
		skipped:         make(map[ServiceName][]Skipped),
		syncHist:        newHistogram(SyncDurationBounds),
		programmingHist: newHistogram(NetworkProgrammingBounds),
	}
	return t, nil
}

// Current returns the live table, nil before the first one. Lock-free.
func (t *Tracker) Current() *Table { return t.current.Load() }

// Stats returns a snapshot of the counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.PendingChanges = len(t.dirty)
	s.SyncDuration = t.syncHist.snapshot()
	s.NetworkProgrammingLatency = t.programmingHist.snapshot()
	return s
}

// Close stops a pending build timer; no table is built after it returns
// (events are still absorbed). Close waits for a build in progress.
func (t *Tracker) Close() {
	t.buildMu.Lock()
	defer t.buildMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
}

// OnServiceAdd implements Handler.
func (t *Tracker) OnServiceAdd(svc *v1.Service) { t.setService(svc, false) }

// OnServiceUpdate implements Handler.
func (t *Tracker) OnServiceUpdate(_, svc *v1.Service) { t.setService(svc, false) }

// OnServiceDelete implements Handler.
func (t *Tracker) OnServiceDelete(svc *v1.Service) { t.setService(svc, true) }

// OnEndpointSliceAdd implements Handler.
func (t *Tracker) OnEndpointSliceAdd(es *discoveryv1.EndpointSlice) { t.setSlice(es, false) }

// OnEndpointSliceUpdate implements Handler. A slice whose service label
// changed leaves its old service.
func (t *Tracker) OnEndpointSliceUpdate(old, es *discoveryv1.EndpointSlice) {
	if old != nil {
		oldSvc, okOld := sliceKey(old)
		newSvc, okNew := sliceKey(es)
		if okOld && (!okNew || oldSvc != newSvc) {
			t.setSlice(old, true)
		}
	}
	t.setSlice(es, false)
}

// OnEndpointSliceDelete implements Handler.
func (t *Tracker) OnEndpointSliceDelete(es *discoveryv1.EndpointSlice) { t.setSlice(es, true) }

// OnSynced implements Handler: the first table is built now.
func (t *Tracker) OnSynced() {
	t.mu.Lock()
	t.synced = true
	t.mu.Unlock()
	t.kick()
}

func (t *Tracker) setService(svc *v1.Service, remove bool) {
	if svc == nil {
		return
	}
	name := ServiceName{svc.Namespace, svc.Name}
	var info *svcInfo
	if !remove {
		info = newSvcInfo(svc)
	}
	now := t.clock.Now()
	t.mu.Lock()
	t.stats.ServiceChanges++
	st := t.services[name]
	if st == nil {
		if remove {
			t.mu.Unlock()
			return
		}
		st = &svcState{}
		t.services[name] = st
	}
	if reflect.DeepEqual(st.info, info) {
		t.mu.Unlock()
		return
	}
	st.info = info
	t.markDirty(name, st, now)
	t.mu.Unlock()
	t.kick()
}

func (t *Tracker) setSlice(es *discoveryv1.EndpointSlice, remove bool) {
	if es == nil {
		return
	}
	name, ok := sliceKey(es)
	var info *sliceInfo
	if ok && !remove {
		info = newSliceInfo(es)
		ok = info != nil
	}
	now := t.clock.Now()
	t.mu.Lock()
	if !ok {
		t.stats.IgnoredEndpointSlices++
		t.mu.Unlock()
		return
	}
	t.stats.EndpointChanges++
	st := t.services[name]
	if st == nil {
		if remove {
			t.mu.Unlock()
			return
		}
		st = &svcState{}
		t.services[name] = st
	}
	i, had := slices.BinarySearchFunc(st.slices, es.Name, func(s *sliceInfo, name string) int { return cmpString(s.name, name) })
	switch {
	case remove && !had:
		t.mu.Unlock()
		return
	case remove:
		st.slices = slices.Delete(st.slices, i, i+1)
	case had && reflect.DeepEqual(st.slices[i], info):
		t.mu.Unlock()
		return
	default:
		if had {
			st.slices[i] = info
		} else {
			st.slices = slices.Insert(st.slices, i, info)
		}
		if tt := triggerTime(es); !tt.IsZero() && !tt.Before(t.start) {
			now = tt
		}
	}
	t.markDirty(name, st, now)
	t.mu.Unlock()
	t.kick()
}

// markDirty queues a service for the next build, with the time of the
// change for the latency metric. Called with mu held.
func (t *Tracker) markDirty(name ServiceName, st *svcState, changed time.Time) {
	if !st.dirty {
		st.dirty = true
		t.dirty = append(t.dirty, name)
	}
	if t.published && len(st.triggers) < maxTriggers {
		st.triggers = append(st.triggers, changed)
	}
}

// kick builds a table now, or arms the timer that will, or does nothing, as
// the sync state and MinSyncPeriod say.
func (t *Tracker) kick() {
	t.buildMu.Lock()
	defer t.buildMu.Unlock()
	t.mu.Lock()
	if !t.synced || t.closed || (t.published && len(t.dirty) == 0) {
		t.mu.Unlock()
		return
	}
	now := t.clock.Now()
	if t.published {
		if wait := t.lastSync.Add(t.minSync).Sub(now); wait > 0 {
			if t.timer == nil {
				t.timerGen++
				gen := t.timerGen
				t.timer = t.clock.AfterFunc(wait, func() { t.timerFired(gen) })
			}
			t.mu.Unlock()
			return
		}
	}
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
		t.timerGen++
	}
	tbl, ch, ok := t.buildLocked(now)
	t.mu.Unlock()
	if ok && t.onSync != nil {
		t.onSync(tbl, ch)
	}
}

// timerFired runs the build a timer was armed for. A timer that a build
// made needless (stopped too late) finds a newer generation and leaves the
// current timer alone.
func (t *Tracker) timerFired(gen uint64) {
	t.mu.Lock()
	if gen == t.timerGen {
		t.timer = nil
	}
	t.mu.Unlock()
	t.kick()
}

// buildLocked recomputes the dirty services and derives the next table from
// the current one. ok is false when nothing changed (no table is
// published). Called with buildMu and mu held.
func (t *Tracker) buildLocked(start time.Time) (tbl *Table, ch Changes, ok bool) {
	t.lastSync = start
	names := t.dirty
	t.dirty = nil
	slices.SortFunc(names, func(a, b ServiceName) int {
		if a.less(b) {
			return -1
		}
		if b.less(a) {
			return 1
		}
		return 0
	})

	b := newTableBuilder(t.current.Load(), len(names))
	ch.Ports = make([]PortChange, 0, len(names))
	skippedChanged := false
	var triggers []time.Time
	states := make([]*svcState, len(names))
	for i, name := range names {
		states[i] = t.services[name]
	}
	fresh := t.computePorts(states)
	for i, name := range names {
		st := states[i]
		st.dirty = false
		triggers = append(triggers, st.triggers...)
		st.triggers = nil
		if t.applyService(b, &ch, name, st, fresh[i]) {
			skippedChanged = true
		}
		t.applyDNS(b, name, st, buildDNS(st.info, st.slices))
		if st.info == nil && len(st.slices) == 0 {
			delete(t.services, name)
		}
	}
	if t.published && !b.touched && !skippedChanged {
		return nil, Changes{}, false
	}
	if skippedChanged {
		b.t.skipped = t.flattenSkipped()
	}
	b.finishSorted()
	slices.SortFunc(ch.Ports, func(x, y PortChange) int {
		return comparePorts(x.either(), y.either())
	})

	tbl = b.t
	tbl.generation++
	tbl.built = start
	end := t.clock.Now()
	t.current.Store(tbl)
	t.published = true

	for _, tr := range triggers {
		d := max(end.Sub(tr), 0)
		ch.NetworkProgrammingLatencies = append(ch.NetworkProgrammingLatencies, d)
		t.programmingHist.observe(d)
	}
	dur := end.Sub(start)
	t.syncHist.observe(dur)
	t.stats.Syncs++
	t.stats.LastSyncDuration = dur
	t.stats.LastSyncTime = end
	t.stats.NoLocalEndpoints.Internal = t.noLocal
	t.stats.Services = tbl.nServices
	t.stats.Ports = tbl.nPorts
	t.stats.Skipped = len(tbl.skipped)
	return tbl, ch, true
}

func (c *PortChange) either() *Port {
	if c.New != nil {
		return c.New
	}
	return c.Old
}

// parallelBuild is the number of changed services from which a build
// computes Ports on several cores.
const parallelBuild = 2048

// computePorts computes the Ports of each service (buildPorts is pure). A
// large build, such as the first one, fans out to GOMAXPROCS goroutines
// (four at most), which end before it returns; handlers cannot change the
// services meanwhile, as the caller holds mu.
func (t *Tracker) computePorts(states []*svcState) [][]*Port {
	fresh := make([][]*Port, len(states))
	workers := min(runtime.GOMAXPROCS(0), 4)
	if len(states) < parallelBuild || workers < 2 {
		for i, st := range states {
			fresh[i] = buildPorts(st.info, st.slices, t.node, &t.scratch)
		}
		return fresh
	}
	var wg sync.WaitGroup
	per := (len(states) + workers - 1) / workers
	for lo := 0; lo < len(states); lo += per {
		hi := min(lo+per, len(states))
		wg.Go(func() {
			var sc scratch
			for i := lo; i < hi; i++ {
				fresh[i] = buildPorts(states[i].info, states[i].slices, t.node, &sc)
			}
		})
	}
	wg.Wait()
	return fresh
}

// applyService recomputes one service's Ports, reusing each unchanged Port
// of the current table, records the differences in ch, and writes them to
// the table being built. It reports whether the service's skipped list
// changed.
func (t *Tracker) applyService(b *tableBuilder, ch *Changes, name ServiceName, st *svcState, fresh []*Port) bool {
	var ips []netip.Addr
	var skipped []Skipped
	if st.info != nil {
		ips = st.info.clusterIPs
		skipped = st.info.skipped
	}
	old := st.ports

	changed := false
	for i, np := range fresh {
		op := findPort(old, np)
		if op != nil && op.equal(np) {
			fresh[i] = op
			continue
		}
		ch.Ports = append(ch.Ports, newPortChange(op, np))
		changed = true
	}
	for _, op := range old {
		if findPort(fresh, op) == nil {
			ch.Ports = append(ch.Ports, newPortChange(op, nil))
			changed = true
		}
	}

	// Index: release what the old ports held, then claim for the new ones.
	for _, op := range old {
		if !slices.Contains(fresh, op) {
			t.unclaim(b, op)
			b.removed = append(b.removed, op)
		}
	}
	for _, np := range fresh {
		if !slices.Contains(old, np) {
			t.claim(b, np)
			b.added = append(b.added, np)
		}
	}
	for _, ip := range st.ips {
		if !slices.Contains(ips, ip) {
			t.unmark(b, ip)
		}
	}
	for _, ip := range ips {
		if !slices.Contains(st.ips, ip) {
			t.mark(b, ip)
		}
	}
	if !slices.Equal(old, fresh) {
		b.setService(name, fresh)
	}
	t.noLocal += countNoLocal(fresh) - countNoLocal(old)

	switch {
	case len(old) == 0 && len(fresh) > 0:
		ch.Added = append(ch.Added, name)
	case len(old) > 0 && len(fresh) == 0:
		ch.Removed = append(ch.Removed, name)
	case changed:
		ch.Changed = append(ch.Changed, name)
	}
	st.ports, st.ips = fresh, ips

	if slices.Equal(st.skipped, skipped) {
		return false
	}
	st.skipped = skipped
	if len(skipped) == 0 {
		delete(t.skipped, name)
	} else {
		t.skipped[name] = skipped
	}
	return true
}

// findPort returns the Port of list with p's identity (name, protocol,
// family), or nil.
func findPort(list []*Port, p *Port) *Port {
	for _, q := range list {
		if q.Name == p.Name && q.Protocol == p.Protocol && q.Family == p.Family {
			return q
		}
	}
	return nil
}

func newPortChange(old, cur *Port) PortChange {
	c := PortChange{Old: old, New: cur}
	p := c.either()
	c.Name, c.Protocol, c.Family = p.Name, p.Protocol, p.Family
	switch {
	case old == nil:
		c.EndpointsAdded = cur.EndpointKeys
	case cur == nil:
		c.EndpointsRemoved = old.EndpointKeys
	default:
		c.EndpointsAdded, c.EndpointsRemoved = diffSorted(old.EndpointKeys, cur.EndpointKeys)
	}
	if c.Protocol == UDP && old != nil {
		c.StaleUDP = staleUDP(old, cur)
	}
	return c
}

// staleUDP returns the endpoints whose UDP flows end when old becomes cur
// (nil: removed): those of old's serving or usable endpoints that are not
// serving in cur, unless nothing serves in cur.
func staleUDP(old, cur *Port) []netip.AddrPort {
	if cur != nil && len(cur.Serving) == 0 {
		return nil
	}
	before := slices.Clone(old.Serving)
	for i := range old.Endpoints {
		before = append(before, old.Endpoints[i].Addr)
	}
	slices.SortFunc(before, netip.AddrPort.Compare)
	before = slices.Compact(before)
	var stale []netip.AddrPort
	for _, a := range before {
		if cur == nil || !slices.Contains(cur.Serving, a) {
			stale = append(stale, a)
		}
	}
	return stale
}

// diffSorted returns the strings only in b (added) and only in a (removed);
// both inputs are sorted.
func diffSorted(a, b []string) (added, removed []string) {
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			removed = append(removed, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			added = append(added, b[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}

func countNoLocal(ps []*Port) int {
	n := 0
	for _, p := range ps {
		if p.Verdict == NoLocalEndpoints {
			n++
		}
	}
	return n
}

func portKey(p *Port) lookupKey { return makeKey(p.ClusterIP, p.Port, p.Protocol) }

// claim makes p answer its lookup key, unless a Port with a lower name holds
// it already: then p waits in conflicts. The API server never allocates one
// ClusterIP twice, but files can say anything; the lower name wins so the
// outcome does not depend on event order.
func (t *Tracker) claim(b *tableBuilder, p *Port) {
	k := portKey(p)
	cur := b.get(k)
	switch {
	case cur == nil:
		b.setIndex(k, p)
	case comparePorts(p, cur) < 0:
		t.conflicts[k] = append(t.conflicts[k], cur)
		b.setIndex(k, p)
	default:
		t.conflicts[k] = append(t.conflicts[k], p)
	}
}

// unclaim releases p's lookup key, promoting the best waiting Port.
func (t *Tracker) unclaim(b *tableBuilder, p *Port) {
	k := portKey(p)
	waiting := t.conflicts[k]
	if b.get(k) != p {
		if i := slices.Index(waiting, p); i >= 0 {
			waiting = slices.Delete(waiting, i, i+1)
		}
	} else {
		var best *Port
		bi := -1
		for i, q := range waiting {
			if best == nil || comparePorts(q, best) < 0 {
				best, bi = q, i
			}
		}
		if best != nil {
			waiting = slices.Delete(waiting, bi, bi+1)
		}
		b.setIndex(k, best)
	}
	if len(waiting) == 0 {
		delete(t.conflicts, k)
	} else {
		t.conflicts[k] = waiting
	}
}

func (t *Tracker) mark(b *tableBuilder, ip netip.Addr) {
	k := makeKey(ip, 0, 0)
	if b.get(k) != nil {
		t.ipExtra[ip]++
		return
	}
	b.setIndex(k, ipMarker)
}

func (t *Tracker) unmark(b *tableBuilder, ip netip.Addr) {
	if n := t.ipExtra[ip]; n > 0 {
		if n == 1 {
			delete(t.ipExtra, ip)
		} else {
			t.ipExtra[ip] = n - 1
		}
		return
	}
	b.setIndex(makeKey(ip, 0, 0), nil)
}

func (t *Tracker) flattenSkipped() []Skipped {
	var out []Skipped
	for _, s := range t.skipped {
		out = append(out, s...)
	}
	slices.SortStableFunc(out, func(a, b Skipped) int {
		if a.Service != b.Service {
			if a.Service.less(b.Service) {
				return -1
			}
			return 1
		}
		if a.Port != b.Port {
			return cmpString(a.Port, b.Port)
		}
		return int(a.PortNumber) - int(b.PortNumber)
	})
	return out
}

package service

// The Tracker: its configuration, its state, and the calls that are not
// events (Current, Stats, Close). What feeds it is in events.go, how it
// builds a Table in build.go, what a build reports in changes.go.

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

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
	// CheckScheduler, if set, checks the scheduler a Service's annotations
	// name (AnnotationScheduler, AnnotationSchedulerFlags); a Service it
	// refuses is skipped, with the error as the reason. cmd sets it to
	// balancer's ParseScheduler.
	CheckScheduler func(name, flags string) error
}

// DefaultConfig returns a Config with kube-proxy's defaults.
func DefaultConfig() Config {
	return Config{MinSyncPeriod: DefaultMinSyncPeriod, Clock: RealClock()}
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
	// checkScheduler is Config.CheckScheduler.
	checkScheduler func(name, flags string) error
	start          time.Time

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
	// oldestPending is when the oldest change not yet in a table arrived,
	// once a table is published (Health.OldestPending).
	oldestPending time.Time
	timer         Timer
	timerGen      uint64
	// conflicts holds, per lookup key, the Ports that lost it to another
	// service's Port with a lower name; markExtra counts, per marker key
	// (ClusterIP or external address), the services beyond the first that
	// mark it.
	conflicts map[lookupKey][]*Port
	markExtra map[lookupKey]int
	// keys is claim's and unclaim's buffer.
	keys []lookupKey
	// ptrWaiting holds, per ClusterIP, the services that lost its PTR
	// record to a lower name; nsRefs counts the DNS view's services per
	// namespace.
	ptrWaiting map[netip.Addr][]ServiceName
	nsRefs     map[string]int
	skipped    map[ServiceName][]Skipped
	noLocal    PerFamily[NoLocalEndpointsCount]
	scratch    scratch

	stats           Stats
	syncHist        histogram
	programmingHist histogram
	programmingFam  PerFamily[histogram]
}

type svcState struct {
	// dirty is true while the service is listed in Tracker.dirty;
	// serviceChanged and slicesChanged say what changed since the last
	// build (Stats.ServiceChangesPending, EndpointChangesPending).
	dirty, serviceChanged, slicesChanged bool
	info                                 *svcInfo
	// slices are sorted by name.
	slices []*sliceInfo
	// As applied to the current table:
	ports    []*Port
	ips      []netip.Addr
	extIPs   []netip.Addr
	skipped  []Skipped
	dns      *DNSService
	triggers []trigger
}

// trigger is a change waiting for a table: when it happened and the
// families it concerns (the latency metric's samples).
type trigger struct {
	at   time.Time
	fams familySet
}

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
		checkScheduler:  cfg.CheckScheduler,
		start:           cfg.Clock.Now(),
		services:        make(map[ServiceName]*svcState),
		conflicts:       make(map[lookupKey][]*Port),
		markExtra:       make(map[lookupKey]int),
		ptrWaiting:      make(map[netip.Addr][]ServiceName),
		nsRefs:          make(map[string]int),
		skipped:         make(map[ServiceName][]Skipped),
		syncHist:        newHistogram(SyncDurationBounds),
		programmingHist: newHistogram(NetworkProgrammingBounds),
		programmingFam: PerFamily[histogram]{
			IPv4: newHistogram(NetworkProgrammingBounds), IPv6: newHistogram(NetworkProgrammingBounds),
		},
	}
	return t, nil
}

// Current returns the live table, nil before the first one. Lock-free.
func (t *Tracker) Current() *Table { return t.current.Load() }

// Health is the part of Stats a health check reads: Tracker.Health returns
// it without copying the histograms, for probes that may come many times a
// second.
type Health struct {
	// Syncs, LastSyncTime and PendingChanges are Stats'.
	Syncs          uint64
	LastSyncTime   time.Time
	PendingChanges int
	// OldestPending is when the oldest change not yet in a table arrived
	// (by the Tracker's clock); zero when none waits, and before the first
	// table: kube-proxy's QueuedUpdate, which its proxier starts calling
	// once initialized (pkg/proxy/healthcheck/proxy_health.go).
	OldestPending time.Time
}

// Health returns the counters health checks read (see Stats).
func (t *Tracker) Health() Health {
	t.mu.Lock()
	defer t.mu.Unlock()
	return Health{Syncs: t.stats.Syncs, LastSyncTime: t.stats.LastSyncTime, PendingChanges: len(t.dirty), OldestPending: t.oldestPending}
}

// Stats returns a snapshot of the counters.
func (t *Tracker) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.PendingChanges = len(t.dirty)
	for _, name := range t.dirty {
		if st := t.services[name]; st != nil {
			s.ServiceChangesPending += b2i(st.serviceChanged)
			s.EndpointChangesPending += b2i(st.slicesChanged)
		}
	}
	s.SyncDuration = t.syncHist.snapshot()
	s.NetworkProgrammingLatency = t.programmingHist.snapshot()
	s.NetworkProgrammingLatencyByFamily = PerFamily[Histogram]{
		IPv4: t.programmingFam.IPv4.snapshot(), IPv6: t.programmingFam.IPv6.snapshot(),
	}
	return s
}

// SetZone changes this node's zone (Config.Zone: the Node's
// topology.kubernetes.io/zone label, when it is watched) and rebuilds every
// service, since zone hints may now select other endpoints.
func (t *Tracker) SetZone(zone string) {
	t.mu.Lock()
	if t.node.zone == zone {
		t.mu.Unlock()
		return
	}
	t.node.zone = zone
	now := t.clock.Now()
	for name, st := range t.services {
		// Not an object change: no latency sample, but a pending change.
		if !st.dirty {
			st.dirty = true
			t.dirty = append(t.dirty, name)
		}
	}
	if t.published && t.oldestPending.IsZero() && len(t.dirty) > 0 {
		t.oldestPending = now
	}
	t.mu.Unlock()
	t.kick()
}

// Zone returns this node's zone as the Tracker uses it.
func (t *Tracker) Zone() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.node.zone
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
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

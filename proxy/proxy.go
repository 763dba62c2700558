package proxy

// What the proxy does for a new flow (DESIGN.md section 2):
//
//  1. Admit (on the packet path, for the gate): the flow's destination is
//     looked up in the current service.Table: Forward -> accept; no service
//     port, unknown port or no endpoints -> reject (ICMP unreachable);
//     internalTrafficPolicy Local without local endpoints -> drop.
//  2. HandleTCP / HandleUDP (one goroutine per flow, from netstack): look up
//     again (the table may have changed), pick the endpoint (affinity, else
//     the lottery), dial it first, and only then complete the client's
//     handshake (tcp.go) or start the relay (udp.go).
//  3. The conntrack entry records the binding and the flow's handle; when
//     it leaves the table (timeout, flush, endpoint removal) the flow is
//     queued for the reaper, which ends it (flows.go).
//  4. SetTable swaps in a new service table; UDP flows to endpoints that
//     stopped serving lose their conntrack entries (so the next datagram
//     picks a live endpoint), and affinity lists of departed endpoints are
//     dropped.
//  5. Local servers (local.go): a flow to an address registered with
//     SetLocal that no service port claims is served in-process.

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// endpointKeepAlive is the keep-alive period of endpoint connections the
// proxy dials itself; defaultDialer dials where dialHost does not (UDP
// endpoints, and TCP off Linux).
const endpointKeepAlive = 15 * time.Second

var defaultDialer = &net.Dialer{KeepAlive: endpointKeepAlive}

// Dialer opens host connections to endpoints; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Proxy.
type Config struct {
	// Conntrack configures the conntrack table the proxy builds and owns
	// (Proxy.Conntrack gives it to the stack). OnRemove must be nil: the
	// proxy sets it. A zero HashSeed is replaced by a random one, so that
	// clients cannot precompute colliding tuples. A nil Clock means a
	// coarse clock (conntrack.CoarseClock) that Run ticks every 10 ms, as
	// the kernel's conntrack reads jiffies; affinity then reads it too.
	Conntrack conntrack.Config
	// SweepInterval is how often Run sweeps expired entries; 0 means 1 s.
	SweepInterval time.Duration
	// DialTimeout bounds the dial of an endpoint; 0 means 5 s.
	DialTimeout time.Duration
	// AffinityListSize is xt_recent's ip_list_tot; 0 means 100.
	AffinityListSize int
	// MaxUDPSessions bounds the concurrent UDP flows; 0 means 65536.
	MaxUDPSessions int
	// Dialer dials endpoints from the host; nil means the proxy's own:
	// TCP with dialHost (hostdial_linux.go), UDP with a net.Dialer; both
	// keep alive every 15 s as net.Dialer's default does.
	Dialer Dialer
	// Via is how TCP flows reach endpoints (dialvia.go): direct (the
	// zero value), through PodDialer, or direct first then PodDialer.
	Via DialVia
	// PodDialer reaches endpoints through the API server; required by
	// ViaAPIServer, used by ViaAuto when set.
	PodDialer PodDialer
	// DirectAttempt bounds ViaAuto's first direct dial of an endpoint; 0
	// means 1 s.
	DirectAttempt time.Duration
	// ViaMemory is how long ViaAuto remembers the way that worked for an
	// endpoint; 0 means 5 minutes.
	ViaMemory time.Duration
	// Rand is the lottery's random source; nil means balancer.RuntimeSource.
	Rand balancer.Source
	// LocalSource reports whether a source address is this host's or one
	// of its pods' (kube-proxy's LOCAL address type and local-traffic
	// detector): such flows to an external destination use the cluster
	// set whatever externalTrafficPolicy says. nil: no source is local.
	LocalSource func(netip.Addr) bool
	// Scheduler is the scheduler of service ports whose Service names none
	// (--scheduler); the zero value is "random", kube-proxy's iptables
	// lottery.
	Scheduler balancer.SchedulerConfig
	// Clock for affinity; nil means the conntrack clock when the proxy
	// ticks its own, else the system clock.
	Clock balancer.Clock
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// Proxy answers admission for the gate and handles the flows netstack hands
// it. Its methods are safe for concurrent use.
type Proxy struct {
	cfg     Config
	ct      *conntrack.Table
	lottery *balancer.Lottery
	logger  *zap.Logger

	table  atomic.Pointer[service.Table]
	states atomic.Pointer[map[pickerKey]*portState] // sched.go
	syncMu sync.Mutex                               // serializes SetTable

	// direct dials TCP endpoints from the host: Config.Dialer's
	// DialContext, or dialHost when the proxy made its own.
	direct func(ctx context.Context, ep netip.AddrPort) (net.Conn, error)

	coarse *conntrack.CoarseClock // the conntrack clock Run ticks; nil if injected
	flows  *flowSet
	// handoverCut is held for reading from a translated flow's Accept to
	// its track, from a UDP flow's track to its attach, and for writing by
	// DetachFlows (handover.go).
	handoverCut sync.RWMutex
	// detached are the flows DetachFlows stopped, for ReattachFlows
	// (handover.go); only the handover's one goroutine touches it.
	detached []mover
	// adopted are the flows AdoptFlows took, for StartAdopted (the
	// run's one goroutine; translated_linux.go).
	adopted   []mover
	unadopted []MovedFlow
	poller    atomic.Pointer[replyPoller] // UDP replies (udppoll_linux.go), while Run runs
	runOnce   sync.Once
	// pollWait are UDP flows a handover brought that started before Run
	// started its poller; Run adds them to it (udpmove.go). pollerStarted
	// says it did (or failed to). Both under pollMu.
	pollMu        sync.Mutex
	pollWait      []*udpFlow
	pollerStarted bool
	defrag        *conntrack.Reassembler
	// reopenGrace is how long a flow whose entry a SYN reopened may go on
	// before the reaper ends it (flows.go, step 2): the TIME_WAIT timeout,
	// on ctClock, the conntrack table's clock.
	reopenGrace time.Duration
	ctClock     conntrack.Clock

	udpSessions    atomic.Int64
	stats          counters
	unusableLogged atomic.Bool    // the warning about an unusable source was logged
	ways           wayMemory      // ViaAuto's (dialvia.go)
	probes         sync.WaitGroup // ViaAuto's UDP probes (dialvia.go)
	// locals maps the addresses of local servers to their handlers
	// (copy-on-write; see SetLocal).
	locals  atomic.Pointer[map[netip.AddrPort]LocalHandler]
	closing atomic.Bool

	// The ipvsadm --rate estimator (ipvs.go): est holds the estimate of
	// each dest while it runs, under estMu; estUntil is when it stops
	// sampling (Unix nanoseconds).
	estMu    sync.Mutex
	est      map[*dest]*estimator
	estUntil atomic.Int64
}

var _ netstack.FlowHandler = (*Proxy)(nil)

// pickerKey names the affinity and lottery state of one service port of one
// family: kube-proxy runs one proxier per family.
type pickerKey struct {
	name     service.PortName
	protocol service.Protocol
	family   service.Family
}

func keyOf(p *service.Port) pickerKey {
	return pickerKey{name: p.Name, protocol: p.Protocol, family: p.Family}
}

// New returns a Proxy and its conntrack table, without a service table:
// every flow is rejected until SetTable. Run must be running for flows to
// end when their entries leave the table.
func New(cfg Config) (*Proxy, error) {
	if cfg.Conntrack.OnRemove != nil {
		return nil, errors.New("proxy: Config.Conntrack.OnRemove must be nil (the proxy sets it)")
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = time.Second
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.AffinityListSize <= 0 {
		cfg.AffinityListSize = balancer.DefaultListSize
	}
	if cfg.MaxUDPSessions <= 0 {
		cfg.MaxUDPSessions = 65536
	}
	direct := func(ctx context.Context, ep netip.AddrPort) (net.Conn, error) {
		return cfg.Dialer.DialContext(ctx, "tcp", ep.String())
	}
	if cfg.Dialer == nil {
		cfg.Dialer, direct = defaultDialer, dialHost
	}
	if cfg.Via == ViaAPIServer && cfg.PodDialer == nil {
		return nil, errors.New("proxy: Config.Via is apiserver without a PodDialer")
	}
	if cfg.Via > ViaAuto {
		return nil, fmt.Errorf("proxy: Config.Via %v", cfg.Via)
	}
	if cfg.DirectAttempt <= 0 {
		cfg.DirectAttempt = time.Second
	}
	if cfg.ViaMemory <= 0 {
		cfg.ViaMemory = 5 * time.Minute
	}
	if cfg.Rand == nil {
		cfg.Rand = balancer.RuntimeSource{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Scheduler.Name == "" {
		cfg.Scheduler.Name = "random"
	}
	p := &Proxy{lottery: balancer.NewLottery(64), logger: cfg.Logger, flows: newFlowSet(), direct: direct}
	ctc := cfg.Conntrack
	if ctc.HashSeed == 0 {
		ctc.HashSeed = maphash.Bytes(maphash.MakeSeed(), nil)
	}
	if ctc.Clock == nil {
		p.coarse = conntrack.NewCoarseClock()
		ctc.Clock = p.coarse
		if cfg.Clock == nil {
			cfg.Clock = coarseTime{clock: p.coarse, origin: time.Now()}
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = balancer.SystemClock{}
	}
	ctc.OnRemove = p.OnConntrackRemove
	ct, err := conntrack.NewTable(ctc)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	// Fragments are reassembled before conntrack sees them, within the
	// kernel's bounds (4 MiB per family, 30 s for IPv4, 60 s for IPv6), on
	// the same clock; the reaper sweeps both.
	defrag, err := conntrack.NewReassembler(conntrack.ReassemblyConfig{Clock: ctc.Clock})
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	p.cfg, p.ct, p.defrag = cfg, ct, defrag
	p.reopenGrace, p.ctClock = ctc.Timeouts.TCPTimeWait, ctc.Clock
	if p.reopenGrace == 0 {
		p.reopenGrace = conntrack.DefaultTimeouts().TCPTimeWait
	}
	empty := map[pickerKey]*portState{}
	p.states.Store(&empty)
	return p, nil
}

// Conntrack returns the proxy's conntrack table, for the stack's gate and
// for listing.
func (p *Proxy) Conntrack() *conntrack.Table { return p.ct }

// Reassembler returns the fragment reassembler the stack's gate should use
// (netstack.Options.Reassembler); Run sweeps it with the table.
func (p *Proxy) Reassembler() *conntrack.Reassembler { return p.defrag }

// Table returns the current service table, nil before the first SetTable.
func (p *Proxy) Table() *service.Table { return p.table.Load() }

// SetTable makes t the table new flows are looked up in (step 4). changes
// says what differs from the previous table (the Tracker's OnSync gives both).
func (p *Proxy) SetTable(t *service.Table, changes service.Changes) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	old := *p.states.Load()
	next := make(map[pickerKey]*portState, len(old))
	for _, port := range t.Ports() {
		k := keyOf(port)
		if s := old[k]; s != nil && s.port == port {
			next[k] = s // unchanged
			continue
		}
		next[k] = p.newPortState(port, old[k])
	}
	p.states.Store(&next)
	p.table.Store(t)

	ended := 0
	for _, c := range changes.Ports {
		if s := next[pickerKey{c.Name, c.Protocol, c.Family}]; s != nil && s.picker != nil && s.picker.Affinity() != nil && c.New != nil {
			s.picker.Affinity().Retain(c.New.EndpointKeys)
		}
		// UDP flows to endpoints that stopped serving end, so that their
		// next datagram picks a live endpoint; flows to endpoints that
		// still serve (terminating, out of this zone's hints, behind a
		// changed traffic policy) live on, as kube-proxy's cleanup keeps
		// them (pkg/proxy/conntrack/cleanup.go).
		for _, addr := range c.StaleUDP {
			n := p.ct.Delete(conntrack.Filter{Protocol: conntrack.UDP, Endpoint: addr.Addr(), EndpointPort: addr.Port(), ServicePort: c.Name.String()})
			ended += n
			if n > 0 {
				p.logger.Debug("ended the UDP flows of an endpoint that stopped serving", zap.Stringer("servicePort", c.Name), zap.Stringer("endpoint", addr), zap.Int("entries", n))
			}
		}
	}
	if ended > 0 {
		p.awaitReaped(time.Second)
	}
}

// unusableSource reports whether no reply can reach src: the unspecified
// address, 0.0.0.0/8 ("this network", RFC 1122 3.2.1.3), multicast, and
// IPv4's limited broadcast. The kernel takes such sources for martians on
// input (ip_route_input_slow).
func unusableSource(src netip.Addr) bool {
	return src.IsUnspecified() || src.IsMulticast() || (src.Is4() && (src.As4()[0] == 0 || src == netip.AddrFrom4([4]byte{255, 255, 255, 255})))
}

// Admit is the gate's admission function (step 1).
func (p *Proxy) Admit(flow conntrack.Tuple) netstack.Decision {
	if p.closing.Load() {
		return netstack.Reject
	}
	if src := flow.SrcAddr(); unusableSource(src) {
		p.stats.count(flow.Proto(), ResultDroppedUnusableSource)
		if p.unusableLogged.CompareAndSwap(false, true) {
			p.logger.Warn("flows from an address no reply can reach are dropped: the client has no address the route to the service can use as its source "+
				"(a host or network namespace with loopback only?); give one of its interfaces an address, or the route one (ip route change CIDR dev TUN src ADDRESS). Logged once, counted as userproxy_flows_total{result=\"dropped_unusable_source\"}",
				zap.Stringer("source", src), zap.Stringer("destination", flow.Dst()))
		}
		return netstack.Drop
	}
	proto := service.TCP
	if flow.Proto() == conntrack.UDP {
		proto = service.UDP
	}
	t := p.table.Load()
	if t == nil {
		p.stats.count(flow.Proto(), ResultRejectedNoService)
		return netstack.Reject
	}
	tg := p.resolve(t, proto, flow.SrcAddr(), flow.Dst())
	d, r, _ := p.decide(t, proto, &tg, flow.Dst())
	if d != netstack.Accept {
		p.stats.count(flow.Proto(), r)
	}
	return d
}

// decide is the admission's answer for a new flow to tg (at dst): the
// decision, the flows_total result a refusal counts as, and whether a
// local handler (cluster DNS) takes the flow. Admit and Explain share it.
func (p *Proxy) decide(t *service.Table, proto service.Protocol, tg *target, dst netip.AddrPort) (netstack.Decision, Result, bool) {
	switch {
	case tg.v == service.Forward && proto == service.UDP && p.udpNoWay(tg):
		return netstack.Reject, ResultNoWay, false
	case tg.v == service.Forward:
		return netstack.Accept, ResultProxied, false
	case tg.v != service.NoEndpoints && !tg.v.Drop() && p.localFor(t, dst) != nil:
		return netstack.Accept, ResultLocal, true
	case tg.v.Drop():
		return netstack.Drop, tg.refusal(), false
	}
	return netstack.Reject, tg.refusal(), false
}

// route finds the endpoint for a flow admitted earlier (step 2): the table
// is looked up again because it may have changed since the SYN was admitted.
// The pick counts the flow for its endpoint (sched.go): the caller hands it
// to the flow's record (flow.count) or, if the flow never gets that far,
// releases it. A nil pick.port comes with the verdict that refused it.
func (p *Proxy) route(proto service.Protocol, flow conntrack.Tuple) (pick, service.Verdict) {
	t := p.table.Load()
	if t == nil {
		return pick{}, service.NotService
	}
	tg := p.resolve(t, proto, flow.SrcAddr(), flow.Dst())
	if tg.v != service.Forward {
		return pick{}, tg.v
	}
	pk := p.pickFor(tg, flow)
	if !pk.ok {
		return pick{}, service.NoEndpoints
	}
	return pk, tg.v
}

// pickFor picks the endpoint of a flow to tg (Forward) from its port's
// state, counting an affinity hit; pick.ok is false when the scheduler
// finds none.
func (p *Proxy) pickFor(tg target, flow conntrack.Tuple) pick {
	pk := p.choose((*p.states.Load())[keyOf(tg.port)], tg, flow)
	if pk.byAffinity {
		p.stats.affinityHits.Add(1)
	}
	return pk
}

// Run drives the conntrack clock (when the proxy owns it), expiry, the
// reaper that ends flows whose entries left the table (flows.go) and the
// UDP reply poller (udp.go), until ctx is done. Run it once: a second Run
// drives the rest but no poller.
func (p *Proxy) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if p.coarse != nil {
		wg.Add(1)
		go func() { defer wg.Done(); tickClock(ctx, p.coarse) }()
	}
	p.runOnce.Do(func() {
		rp, err := newReplyPoller()
		if err != nil {
			p.logger.Info("UDP flows relay their replies on a goroutine each", zap.Error(err))
			p.startPoller(nil)
			return
		}
		p.startPoller(rp)
		wg.Add(1)
		go func() {
			defer wg.Done()
			rp.run(ctx)
			p.poller.CompareAndSwap(rp, nil)
			if rp.err != nil {
				p.logger.Warn("the UDP reply poller stopped: its flows ended, later ones relay on a goroutine each", zap.Error(rp.err))
			}
		}()
	})
	wg.Add(1)
	go func() { defer wg.Done(); p.estimate(ctx) }()
	p.reap(ctx, p.cfg.SweepInterval)
	wg.Wait()
	p.probes.Wait() // ViaAuto's UDP probes: each ends within DirectAttempt
}

// tickClock advances the conntrack clock every 10 ms until ctx is done.
func tickClock(ctx context.Context, c *conntrack.CoarseClock) { // conntrack clock ticker
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Tick()
		}
	}
}

// coarseTime reads the conntrack clock as a balancer.Clock: affinity stamps
// at 10 ms resolution, as xt_recent's are in jiffies, without a system clock
// read per new connection (half the cost of an affinity check on this VM).
type coarseTime struct {
	clock  *conntrack.CoarseClock
	origin time.Time
}

func (c coarseTime) Now() time.Time { return c.origin.Add(time.Duration(c.clock.Now())) }

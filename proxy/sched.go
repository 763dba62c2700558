package proxy

// How a new flow's endpoint is chosen, per service port (DESIGN.md section
// 3, "Schedulers"):
//
//  1. SetTable gives each service port a portState: its scheduler (the
//     Service's userproxy.io/scheduler annotation, else Config.Scheduler),
//     its affinity — xt_recent under "random" (the Picker), IPVS
//     persistence under an IPVS scheduler — and its endpoints as the
//     schedulers see them, each with the endpoint's dest: its IPVS
//     connection counts and ipvsadm's counters. A dest belongs to the
//     endpoint, not to one table: the next table's list points at the same
//     dest for as long as the endpoint is listed or has flows (IPVS keeps a
//     removed destination in its trash while connections use it).
//  2. route picks: "random" runs the Picker (bit-identical to kube-proxy's
//     iptables rules); the others ask persistence first, then the
//     scheduler. The chosen dest counts the flow at once, as inactive
//     (ip_vs_bind_dest), before the endpoint is dialled.
//  3. From the Bind of the flow's conntrack entry on, conntrack moves the
//     count (the flow is the entry's conntrack.Counter): active while the
//     TCP state is ESTABLISHED, inactive otherwise, gone with the entry; a
//     flow that never got bound is uncounted by its handler (pick.release).
//     Every step is O(1): a pick never scans the conntrack table.

import (
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

// dest is one endpoint of one service port as IPVS counts it: struct
// ip_vs_dest's connection counts and the totals ipvsadm --stats prints for
// the flows that ended (the live ones are read from their entries).
type dest struct {
	conns balancer.Conns
	// scheduled counts every flow scheduled to the endpoint (ipvsadm's
	// Conns).
	scheduled atomic.Uint64
	// Packets and bytes of the flows whose entries left the table, per
	// conntrack Direction (Original: client to service, IPVS's "in").
	packets, bytes [2]atomic.Uint64
}

// portState is the scheduling state of one service port (step 1). It is
// immutable once published, but for what its parts guard themselves.
type portState struct {
	port   *service.Port
	cfg    balancer.SchedulerConfig
	pp     ProxyProtocol    // userproxy.io/proxy-protocol
	picker *balancer.Picker // "random": the lottery and xt_recent affinity
	// The port's endpoint sets (resolve.go): internal (Endpoints), external
	// (ExternalEndpoints) and from this host (ClusterEndpoints); a set
	// equal to another is the same *endpointSet.
	sets [3]*endpointSet
	// gone holds the dests of endpoints that left every set while flows
	// still count on them, by address (nil when none).
	gone map[netip.AddrPort]*dest
}

// endpointSet is one of a port's endpoint lists as a pick sees it. Under
// an IPVS scheduler each set is a virtual service of its own (kube-proxy's
// IPVS mode gives each ClusterIP, external IP and NodePort address one),
// with its own scheduler and persistence; the dests are the endpoints',
// shared by every set of the port. The affinity lists of "random" are
// shared too, as kube-proxy's recent lists are named after the KUBE-SEP
// chains that KUBE-SVC and KUBE-SVL jump to alike.
type endpointSet struct {
	eps   []service.Endpoint
	keys  []string
	dests []*dest // dests[i] counts eps[i]
	// IPVS schedulers only: the list as they see it, and their state.
	beps    []balancer.Endpoint
	sched   balancer.Scheduler
	persist *balancer.Persistence
}

// schedulerOf returns the scheduler a port asks for, or the default.
func (p *Proxy) schedulerOf(port *service.Port) balancer.SchedulerConfig {
	if port.Scheduler == (service.Scheduler{}) {
		return p.cfg.Scheduler
	}
	cfg, err := balancer.ParseScheduler(port.Scheduler.Name, port.Scheduler.Flags)
	if err != nil {
		// The Tracker refuses such Services when cmd wires its
		// CheckScheduler; a table built without the check gets the default.
		p.logger.Warn("unknown scheduler; using the default", zap.Stringer("servicePort", port.Name), zap.Error(err))
		return p.cfg.Scheduler
	}
	return cfg
}

// proxyProtocolOf returns the PROXY protocol header a port asks for; one
// that does not parse, or v1 on a UDP port, sends none (cmd refuses such
// files at load; the API source's objects are not checked).
func (p *Proxy) proxyProtocolOf(port *service.Port) ProxyProtocol {
	if port.ProxyProtocol == "" {
		return ProxyProtocolNone
	}
	v, err := ParseProxyProtocol(port.ProxyProtocol)
	if err == nil {
		err = v.Check(port.Protocol)
	}
	if err != nil {
		p.logger.Warn("ignoring the PROXY protocol annotation", zap.Stringer("servicePort", port.Name), zap.Error(err))
		return ProxyProtocolNone
	}
	return v
}

// sameEndpoints reports whether a and b are the same list (the service
// table shares a set's slice with an equal one).
func sameEndpoints(a, b []service.Endpoint) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// newPortState returns the state of port, keeping what old (the port's
// previous state, or nil) has that still applies: the dests always, the
// schedulers and affinity when neither the scheduler nor the affinity
// changed.
func (p *Proxy) newPortState(port *service.Port, old *portState) *portState {
	s := &portState{port: port, cfg: p.schedulerOf(port), pp: p.proxyProtocolOf(port)}
	keep := old != nil && old.cfg == s.cfg && old.port.Affinity == port.Affinity
	if !s.cfg.IPVS() {
		if keep {
			s.picker = old.picker
		} else {
			var aff *balancer.Affinity
			if port.Affinity.ClientIP {
				aff = balancer.NewAffinity(balancer.AffinityConfig{Timeout: port.Affinity.Timeout, ListSize: p.cfg.AffinityListSize, Clock: p.cfg.Clock})
			}
			s.picker = balancer.NewPicker(p.lottery, p.cfg.Rand, aff)
		}
	}
	var prev map[netip.AddrPort]*dest // old's dests, listed or gone
	if old != nil {
		prev = make(map[netip.AddrPort]*dest, len(old.port.Endpoints)+len(old.gone))
		for _, set := range old.sets {
			for i, d := range set.dests {
				prev[set.eps[i].Addr] = d
			}
		}
		for a, d := range old.gone {
			prev[a] = d
		}
	}
	epsOf := [3][]service.Endpoint{port.Endpoints, port.ExternalEndpoints, port.ClusterEndpoints}
	keysOf := [3][]string{port.EndpointKeys, port.ExternalEndpointKeys, port.ClusterEndpointKeys}
	var used map[netip.AddrPort]*dest // the dests of this state, when several sets
	for k, eps := range epsOf {
		keys := keysOf[k]
		if k > 0 && len(eps) == 0 {
			s.sets[k] = s.sets[0] // no such set: never picked from
			continue
		}
		if k > 0 && used == nil {
			used = make(map[netip.AddrPort]*dest, len(port.Endpoints))
			for i, d := range s.sets[0].dests {
				used[s.sets[0].eps[i].Addr] = d
			}
		}
		shared := false
		for j := range k {
			if sameEndpoints(s.sets[j].eps, eps) {
				s.sets[k], shared = s.sets[j], true
				break
			}
		}
		if shared {
			continue
		}
		var oldSet *endpointSet
		if keep && !slices.Contains(old.sets[:k], old.sets[k]) {
			// The set's scheduler state, unless the old state shared it
			// with an earlier set: one scheduler per list (an mh table or
			// an rr cursor serves one list; two would rebuild it per pick).
			oldSet = old.sets[k]
		}
		s.sets[k] = p.newEndpointSet(port, s.cfg, eps, keys, prev, used, oldSet)
	}
	listed := make(map[*dest]struct{}, len(prev))
	if len(prev) > 0 {
		for _, d := range s.setDests() {
			listed[d] = struct{}{}
		}
	}
	for addr, d := range prev {
		if _, ok := listed[d]; ok {
			continue
		}
		if a, i := d.conns.Load(); a+i > 0 {
			if s.gone == nil {
				s.gone = make(map[netip.AddrPort]*dest)
			}
			s.gone[addr] = d // in IPVS's trash until its flows end
		}
	}
	return s
}

// newEndpointSet builds one set, reusing the dests of prev (the previous
// state's) and used (this state's other sets; nil while building the
// first), and old's scheduler and persistence when given.
func (p *Proxy) newEndpointSet(port *service.Port, cfg balancer.SchedulerConfig, eps []service.Endpoint, keys []string, prev, used map[netip.AddrPort]*dest, old *endpointSet) *endpointSet {
	set := &endpointSet{eps: eps, keys: keys, dests: make([]*dest, len(eps))}
	if cfg.IPVS() {
		set.beps = make([]balancer.Endpoint, len(eps))
		if old != nil && old.sched != nil {
			set.sched, set.persist = old.sched, old.persist
		} else {
			set.sched = cfg.New(p.cfg.Rand)
			if port.Affinity.ClientIP {
				set.persist = balancer.NewPersistence(balancer.PersistenceConfig{Timeout: port.Affinity.Timeout, Clock: p.cfg.Clock})
			}
		}
	}
	fresh := make([]dest, len(eps)) // one allocation for the new endpoints
	for i := range eps {
		addr := eps[i].Addr
		d := used[addr]
		if d == nil {
			d = prev[addr]
		}
		if d == nil {
			d = &fresh[i]
		}
		if used != nil {
			used[addr] = d
		}
		set.dests[i] = d
		if set.beps != nil {
			set.beps[i] = balancer.Endpoint{Addr: addr, Weight: 1, Conns: &d.conns}
		}
	}
	if set.sched != nil {
		if err := set.sched.Update(set.beps); err != nil {
			p.logger.Warn("scheduler refused the endpoint list; new flows are refused", zap.Stringer("servicePort", port.Name), zap.Error(err))
		}
	}
	return set
}

// pick is route's answer for a flow: where it goes and what counts it.
type pick struct {
	port       *service.Port
	endpoint   netip.AddrPort
	byAffinity bool
	ok         bool
	dest       *dest              // counts the flow; nil for an uncounted pick
	tmpl       *balancer.Template // the persistence template, if any
	pp         ProxyProtocol      // the header to send first, if any
	pod        service.PodRef     // the endpoint's Pod, if its slice names one
}

// choose runs step 2 for a flow to tg (Forward), with s the port's state
// (nil or stale during a table swap). ok is false when the scheduler finds
// no endpoint.
func (p *Proxy) choose(s *portState, tg target, flow conntrack.Tuple) pick {
	pk := pick{port: tg.port}
	eps, keys := tg.endpoints()
	if len(eps) == 0 {
		return pk
	}
	index := -1
	var set *endpointSet
	if s != nil && s.port == tg.port {
		set = s.sets[tg.set]
	}
	if set != nil {
		pk.pp = s.pp
	} else {
		pk.pp = p.proxyProtocolOf(tg.port)
	}
	switch {
	case set == nil:
		// A table swap in progress: the lottery without affinity, uncounted.
		index = p.lottery.Pick(len(eps), p.cfg.Rand)
	case s.picker != nil:
		index, pk.byAffinity = s.picker.Pick(keys, flow.SrcAddr())
	case set.persist != nil:
		f := balancer.Flow{Client: flow.Src(), Service: flow.Dst()}
		index, pk.tmpl, pk.byAffinity = set.persist.Pick(flow.SrcAddr(), set.beps, func() int { return set.sched.Pick(set.beps, f) })
	default:
		index = set.sched.Pick(set.beps, balancer.Flow{Client: flow.Src(), Service: flow.Dst()})
	}
	if index < 0 || index >= len(eps) {
		pk.tmpl.Release()
		pk.tmpl = nil
		return pk
	}
	pk.endpoint, pk.pod, pk.ok = eps[index].Addr, eps[index].Pod, true
	if set != nil {
		pk.dest = set.dests[index]
		pk.dest.conns.Open()
		pk.dest.scheduled.Add(1)
	}
	return pk
}

// release uncounts a pick whose flow never got its entry bound (a failed
// dial, a refused handshake, an entry gone meanwhile).
func (pk *pick) release() {
	if pk.dest != nil {
		pk.dest.conns.Close(false)
		pk.dest = nil
	}
	pk.tmpl.Release()
	pk.tmpl = nil
}

// count makes f the conntrack.Counter of its entry for the pick (step 3).
func (f *flow) count(pk pick) {
	if pk.dest == nil {
		return
	}
	f.dest, f.tmpl = pk.dest, pk.tmpl
	f.Counter = f
}

var _ conntrack.Counter = (*flow)(nil)

// Established moves the flow between its endpoint's active and inactive
// counts (conntrack.Counter; called under the entry's shard lock).
func (f *flow) Established(on bool) {
	if on {
		f.dest.conns.Activate()
	} else {
		f.dest.conns.Deactivate()
	}
}

// Removed uncounts the flow: its entry left the table (conntrack.Counter).
func (f *flow) Removed(established bool) {
	f.dest.conns.Close(established)
	f.tmpl.Release()
}

// templateSweep is how often the expired persistence templates of every
// service port are dropped (the reaper does it), so that a port's templates
// do not wait for its map to fill to go.
const templateSweep = time.Minute

// sweepTemplates drops the expired persistence templates of every set.
func (p *Proxy) sweepTemplates() {
	for _, s := range *p.states.Load() {
		for k, set := range s.sets {
			if set.persist != nil && !slices.Contains(s.sets[:k], set) {
				set.persist.Sweep()
			}
		}
	}
}

// setDests returns the dests of the state's distinct sets; a dest shared
// by several sets is listed once per set.
func (s *portState) setDests() []*dest {
	var out []*dest
	for k, set := range s.sets {
		if slices.Contains(s.sets[:k], set) {
			continue
		}
		out = append(out, set.dests...)
	}
	return out
}

// allDests returns every dest of the state: its sets' and the gone ones.
func (s *portState) allDests() []*dest {
	return append(slices.Collect(maps.Values(s.gone)), s.setDests()...)
}

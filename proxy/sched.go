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
	"net/netip"
	"sync/atomic"

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
	port    *service.Port
	cfg     balancer.SchedulerConfig
	picker  *balancer.Picker      // "random": the lottery and xt_recent affinity
	sched   balancer.Scheduler    // IPVS's schedulers; nil for "random"
	persist *balancer.Persistence // persistence under an IPVS scheduler, else nil
	// dests[i] is the dest of port.Endpoints[i]; eps are the endpoints as
	// IPVS's schedulers see them (nil under "random").
	dests []*dest
	eps   []balancer.Endpoint
	// gone holds the dests of endpoints that left the list while flows
	// still count on them, by address (nil when none).
	gone map[netip.AddrPort]*dest
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

// newPortState returns the state of port, keeping what old (the port's
// previous state, or nil) has that still applies: the dests always, the
// scheduler and affinity when neither the scheduler nor the affinity
// changed.
func (p *Proxy) newPortState(port *service.Port, old *portState) *portState {
	s := &portState{port: port, cfg: p.schedulerOf(port)}
	keep := old != nil && old.cfg == s.cfg && old.port.Affinity == port.Affinity
	switch {
	case keep:
		s.picker, s.sched, s.persist = old.picker, old.sched, old.persist
	case !s.cfg.IPVS():
		var aff *balancer.Affinity
		if port.Affinity.ClientIP {
			aff = balancer.NewAffinity(balancer.AffinityConfig{Timeout: port.Affinity.Timeout, ListSize: p.cfg.AffinityListSize, Clock: p.cfg.Clock})
		}
		s.picker = balancer.NewPicker(p.lottery, p.cfg.Rand, aff)
	default:
		s.sched = s.cfg.New(p.cfg.Rand)
		if port.Affinity.ClientIP {
			s.persist = balancer.NewPersistence(balancer.PersistenceConfig{Timeout: port.Affinity.Timeout, Clock: p.cfg.Clock})
		}
	}
	n := len(port.Endpoints)
	if s.sched != nil {
		s.eps = make([]balancer.Endpoint, n)
	}
	s.dests = make([]*dest, n)
	var prev map[netip.AddrPort]*dest // old's dests, listed or gone
	if old != nil {
		prev = make(map[netip.AddrPort]*dest, len(old.dests)+len(old.gone))
		for i, d := range old.dests {
			prev[old.port.Endpoints[i].Addr] = d
		}
		for a, d := range old.gone {
			prev[a] = d
		}
	}
	fresh := make([]dest, n) // one allocation for the new endpoints
	for i := range port.Endpoints {
		addr := port.Endpoints[i].Addr
		d := prev[addr]
		if d == nil {
			d = &fresh[i]
		} else {
			delete(prev, addr)
		}
		s.dests[i] = d
		if s.eps != nil {
			s.eps[i] = balancer.Endpoint{Addr: addr, Weight: 1, Conns: &d.conns}
		}
	}
	for addr, d := range prev {
		if a, i := d.conns.Load(); a+i > 0 {
			if s.gone == nil {
				s.gone = make(map[netip.AddrPort]*dest)
			}
			s.gone[addr] = d // in IPVS's trash until its flows end
		}
	}
	if s.sched != nil {
		if err := s.sched.Update(s.eps); err != nil {
			p.logger.Warn("scheduler refused the endpoint list; new flows are refused", zap.Stringer("servicePort", port.Name), zap.Error(err))
		}
	}
	return s
}

// pick is route's answer for a flow: where it goes and what counts it.
type pick struct {
	port       *service.Port
	index      int
	byAffinity bool
	dest       *dest              // counts the flow; nil for an uncounted pick
	tmpl       *balancer.Template // the persistence template, if any
}

// choose runs step 2 for a flow to port from client, with s the port's
// state (nil during a table swap). It returns index -1 when the scheduler
// finds no endpoint.
func (p *Proxy) choose(s *portState, port *service.Port, flow conntrack.Tuple) pick {
	pk := pick{port: port, index: -1}
	if s == nil || s.port != port {
		// A table swap in progress: the lottery without affinity, uncounted.
		pk.index = p.lottery.Pick(len(port.Endpoints), p.cfg.Rand)
		return pk
	}
	switch {
	case s.picker != nil:
		pk.index, pk.byAffinity = s.picker.Pick(port.EndpointKeys, flow.SrcAddr())
	case s.persist != nil:
		f := balancer.Flow{Client: flow.Src(), Service: flow.Dst()}
		pk.index, pk.tmpl, pk.byAffinity = s.persist.Pick(flow.SrcAddr(), s.eps, func() int { return s.sched.Pick(s.eps, f) })
	default:
		pk.index = s.sched.Pick(s.eps, balancer.Flow{Client: flow.Src(), Service: flow.Dst()})
	}
	if pk.index < 0 || pk.index >= len(port.Endpoints) {
		pk.tmpl.Release()
		pk.index, pk.tmpl = -1, nil
		return pk
	}
	pk.dest = s.dests[pk.index]
	pk.dest.conns.Open()
	pk.dest.scheduled.Add(1)
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

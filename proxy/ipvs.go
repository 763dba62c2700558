package proxy

// The service table as IPVS would list it (`userproxy ipvs`, /debug/ipvs):
//
//  1. IPVS() walks the port states (sched.go): one VirtualService per
//     ClusterIP port, its scheduler and persistence, and its endpoints'
//     counts, which conntrack keeps current (Binding.Counter).
//  2. The --stats counters: flows scheduled, and packets and bytes of the
//     ended flows (added when their entries go) plus those of the live
//     entries (one pass over the conntrack table per call).
//  3. The --rate estimator (ip_vs_est.c) samples those totals every 2 s
//     while someone looks.

import (
	"context"
	"net/netip"
	"slices"
	"time"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

// VirtualService is one service port as IPVS would hold it: a virtual
// service (protocol, address, port) with its scheduler, persistence and
// destinations, and the counts the schedulers read. It is the snapshot that
// `userproxy ipvs` and /debug/ipvs print in `ipvsadm -Ln`'s layout.
type VirtualService struct {
	// Name is the service port's name, for display beside the table.
	Name service.PortName
	// Protocol is TCP or UDP.
	Protocol service.Protocol
	// Addr is ClusterIP:port, the address IPVS would list.
	Addr netip.AddrPort
	// Scheduler is the service port's scheduler ("random" for the
	// iptables lottery) and its flags.
	Scheduler balancer.SchedulerConfig
	// Persistent is IPVS persistence's timeout: the ClientIP affinity
	// timeout under an IPVS scheduler, 0 without affinity. Under "random"
	// affinity is xt_recent's, shown in Affinity instead.
	Persistent time.Duration
	// Affinity is the xt_recent affinity timeout under "random", else 0.
	Affinity time.Duration
	// Dests are the destinations in the order the scheduler sees them
	// (kube-proxy's: sorted by "ip:port").
	Dests []Destination
	// Stats sums the destinations' counters.
	Stats IPVSStats
}

// Destination is one endpoint of a VirtualService.
type Destination struct {
	Addr netip.AddrPort
	// Weight is 1: EndpointSlices carry no weights.
	Weight int32
	// ActiveConn and InActConn are IPVS's counts: ESTABLISHED TCP flows,
	// and every other tracked flow (UDP flows are all inactive).
	ActiveConn, InActConn int32
	Stats                 IPVSStats
}

// IPVSStats are the counters and rates `ipvsadm -Ln --stats` and `--rate`
// print: totals since the destination was first used, and the rates of
// IPVS's estimator (ip_vs_est.c), per second.
type IPVSStats struct {
	Conns, InPkts, OutPkts, InBytes, OutBytes uint64
	CPS, InPPS, OutPPS, InBPS, OutBPS         uint64
}

// IPVS returns the service table as IPVS virtual services, sorted by
// protocol, address and port as ipvsadm sorts them, with each endpoint's
// counts and counters: the closed flows' totals plus the live entries' (one
// pass over the conntrack table). Each call keeps the rate estimator running
// for estimatorLinger more, so that rates are estimated while someone looks.
func (p *Proxy) IPVS() []VirtualService {
	p.estUntil.Store(time.Now().Add(estimatorLinger).UnixNano())
	states := *p.states.Load()
	totals := p.destTotals()
	out := make([]VirtualService, 0, len(states))
	p.estMu.Lock()
	defer p.estMu.Unlock()
	for _, s := range states {
		vs := VirtualService{
			Name: s.port.Name, Protocol: s.port.Protocol, Scheduler: s.cfg,
			Addr: netip.AddrPortFrom(s.port.ClusterIP, s.port.Port),
		}
		if s.port.Affinity.ClientIP {
			if s.cfg.IPVS() {
				vs.Persistent = s.port.Affinity.Timeout
			} else {
				vs.Affinity = s.port.Affinity.Timeout
			}
		}
		set := s.sets[setInternal]
		for i, e := range set.eps {
			d := set.dests[i]
			active, inactive := d.conns.Load()
			st := totals[d]
			if e := p.est[d]; e != nil {
				e.read(&st)
			}
			vs.Dests = append(vs.Dests, Destination{Addr: e.Addr, Weight: 1, ActiveConn: active, InActConn: inactive, Stats: st})
			vs.Stats.add(&st)
		}
		out = append(out, vs)
	}
	slices.SortFunc(out, func(a, b VirtualService) int {
		if a.Protocol != b.Protocol {
			return int(a.Protocol) - int(b.Protocol)
		}
		return a.Addr.Compare(b.Addr)
	})
	return out
}

func (s *IPVSStats) add(o *IPVSStats) {
	s.Conns += o.Conns
	s.InPkts += o.InPkts
	s.OutPkts += o.OutPkts
	s.InBytes += o.InBytes
	s.OutBytes += o.OutBytes
	s.CPS += o.CPS
	s.InPPS += o.InPPS
	s.OutPPS += o.OutPPS
	s.InBPS += o.InBPS
	s.OutBPS += o.OutBPS
}

// destTotals returns every dest's totals: flows scheduled, and packets and
// bytes of its ended flows plus those of its live entries.
func (p *Proxy) destTotals() map[*dest]IPVSStats {
	out := make(map[*dest]IPVSStats)
	for _, s := range *p.states.Load() {
		for _, d := range s.allDests() {
			out[d] = IPVSStats{
				Conns:  d.scheduled.Load(),
				InPkts: d.packets[conntrack.Original].Load(), OutPkts: d.packets[conntrack.Reply].Load(),
				InBytes: d.bytes[conntrack.Original].Load(), OutBytes: d.bytes[conntrack.Reply].Load(),
			}
		}
	}
	for _, e := range p.ct.List(conntrack.Filter{}) {
		f, ok := e.Owner.(*flow)
		if !ok || f.dest == nil {
			continue
		}
		st, ok := out[f.dest]
		if !ok {
			continue
		}
		st.InPkts += e.Packets[conntrack.Original]
		st.OutPkts += e.Packets[conntrack.Reply]
		st.InBytes += e.Bytes[conntrack.Original]
		st.OutBytes += e.Bytes[conntrack.Reply]
		out[f.dest] = st
	}
	return out
}

// The rate estimator of ipvsadm --rate (linux net/netfilter/ipvs/ip_vs_est.c):
// every 2 s, each counter's increase becomes a rate, smoothed by an EWMA of
// weight 1/4 in fixed point (connections and packets scaled by 2^10, bytes
// by 2^5), and read back rounded. The kernel runs it for every service all
// the time; here it runs while someone looks (estimatorLinger after the
// last IPVS call), because it needs a pass over the conntrack table for the
// live flows' packets.
const (
	estimatorInterval = 2 * time.Second
	estimatorLinger   = 10 * time.Minute
)

type estimator struct {
	last               [5]uint64 // conns, inpkts, outpkts, inbytes, outbytes
	cps, inpps, outpps int64     // scaled by 2^10
	inbps, outbps      int64     // scaled by 2^5
	started            bool
}

// sample folds one interval's totals into the estimate (estimation_timer).
func (e *estimator) sample(t *IPVSStats) {
	cur := [5]uint64{t.Conns, t.InPkts, t.OutPkts, t.InBytes, t.OutBytes}
	if !e.started {
		e.last, e.started = cur, true
		return
	}
	step := func(avg *int64, i int, shift uint) {
		rate := int64(cur[i]-e.last[i]) << shift
		*avg += (rate - *avg) >> 2
	}
	// Per 2 s interval: << 9 is (delta / 2) << 10, << 4 is (delta / 2) << 5.
	step(&e.cps, 0, 9)
	step(&e.inpps, 1, 9)
	step(&e.outpps, 2, 9)
	step(&e.inbps, 3, 4)
	step(&e.outbps, 4, 4)
	e.last = cur
}

// read puts the estimate into t (ip_vs_read_estimator).
func (e *estimator) read(t *IPVSStats) {
	t.CPS = uint64(max(e.cps+0x1FF, 0) >> 10)
	t.InPPS = uint64(max(e.inpps+0x1FF, 0) >> 10)
	t.OutPPS = uint64(max(e.outpps+0x1FF, 0) >> 10)
	t.InBPS = uint64(max(e.inbps+0xF, 0) >> 5)
	t.OutBPS = uint64(max(e.outbps+0xF, 0) >> 5)
}

// estimate samples every dest every estimatorInterval while the estimator
// is wanted, until ctx is done.
func (p *Proxy) estimate(ctx context.Context) { // ipvsadm rate estimator
	tick := time.NewTicker(estimatorInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if now.UnixNano() > p.estUntil.Load() {
				p.estMu.Lock()
				p.est = nil // started afresh when next wanted
				p.estMu.Unlock()
				continue
			}
			totals := p.destTotals()
			p.estMu.Lock()
			next := make(map[*dest]*estimator, len(totals))
			for d, t := range totals {
				e := p.est[d]
				if e == nil {
					e = &estimator{}
				}
				e.sample(&t)
				next[d] = e
			}
			p.est = next
			p.estMu.Unlock()
		}
	}
}

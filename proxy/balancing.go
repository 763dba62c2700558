package proxy

// The balancing state on its way to the next process (a handover; the
// flows go by handover.go):
//
//  1. SaveBalancing copies, per service port, the xt_recent lists of
//     "random" with ClientIP affinity, and per endpoint set under an IPVS
//     scheduler its persistence templates and the position of rr and wrr
//     (balancer's saved.go says what each holds).
//  2. RestoreBalancing, in the next process, puts it into the port states
//     its own first table made. It goes by the names that mean the same in
//     both processes: the port's name, protocol and family, the set
//     (internal, external, from this host) and the endpoints' addresses.
//     What that table does not have, or has under another scheduler, is
//     dropped and counted, never given to something else. Later tables
//     keep what was restored as they keep any state of a port whose
//     scheduler and affinity did not change (newPortState).
//  3. The connection counts are the flows': AdoptFlows counts each flow it
//     adopts on its endpoint and its client's template (adoptedPick), so
//     lc and wlc see the flows that moved and a template lives while they
//     do, as IPVS's n_control keeps it.

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

// Balancing is a proxy's balancing state, saved.
type Balancing struct {
	Ports []PortBalancing
}

// PortBalancing is one service port's balancing state.
type PortBalancing struct {
	Name     service.PortName
	Protocol service.Protocol
	Family   service.Family
	// Scheduler is the port's scheduler as ParseScheduler reads it back
	// ("random", "mh mh-port"): state for another one is dropped.
	Scheduler string
	// Affinity holds the xt_recent lists ("random" with ClientIP).
	Affinity []balancer.SavedList
	// Sets holds the state of the IPVS schedulers' endpoint sets.
	Sets []SetBalancing
}

// SetBalancing is one endpoint set's IPVS state.
type SetBalancing struct {
	// Set is which: 0 internal, 1 external, 2 from this host.
	Set uint8
	// Scheduler is rr's or wrr's position; nil for the others.
	Scheduler *balancer.SavedScheduler
	// Templates are the persistence templates (ClientIP affinity).
	Templates []balancer.SavedTemplate
}

// items counts what b holds, as RestoreBalancing counts it: a client of a
// list, a template, a scheduler's position.
func (b *PortBalancing) items() int {
	n := 0
	for _, l := range b.Affinity {
		n += len(l.Clients)
	}
	for _, s := range b.Sets {
		n += s.items()
	}
	return n
}

func (s *SetBalancing) items() int {
	n := len(s.Templates)
	if s.Scheduler != nil {
		n++
	}
	return n
}

// SaveBalancing returns the balancing state of every service port that
// has some, in the order of their names.
func (p *Proxy) SaveBalancing() Balancing {
	var b Balancing
	for k, s := range *p.states.Load() {
		pb := PortBalancing{Name: k.name, Protocol: k.protocol, Family: k.family, Scheduler: s.cfg.String()}
		if s.picker != nil && s.picker.Affinity() != nil {
			pb.Affinity = s.picker.Affinity().Save()
		}
		for i, set := range s.sets {
			if set == nil || set.sched == nil || slices.Contains(s.sets[:i], set) {
				continue // no IPVS state, or an earlier set's
			}
			sb := SetBalancing{Set: uint8(i)}
			if v, ok := balancer.SaveScheduler(set.sched); ok {
				sb.Scheduler = &v
			}
			if set.persist != nil {
				sb.Templates = set.persist.Save()
			}
			if sb.items() > 0 {
				pb.Sets = append(pb.Sets, sb)
			}
		}
		if pb.items() > 0 {
			b.Ports = append(b.Ports, pb)
		}
	}
	slices.SortFunc(b.Ports, func(x, y PortBalancing) int {
		return cmp.Or(cmp.Compare(x.Name.String(), y.Name.String()), cmp.Compare(x.Protocol, y.Protocol), cmp.Compare(x.Family, y.Family))
	})
	return b
}

// RestoreBalancing puts state another process saved into this one's
// service ports, against this proxy's clock and its ports' timeouts and
// limits (step 2). It returns how many items (a client in a list, a
// template, a scheduler's position) it restored and how many it dropped:
// for a port, set or endpoint the table lacks, under another scheduler,
// expired, or past a limit. State that does not hold together is dropped
// as well, and the error says where. Call it once the first table is set
// and before AdoptFlows, so that the adopted flows find their templates.
func (p *Proxy) RestoreBalancing(b Balancing) (restored, dropped int, err error) {
	p.syncMu.Lock() // no table swap halfway
	defer p.syncMu.Unlock()
	states := *p.states.Load()
	var errs []error
	seen := make(map[pickerKey]bool, len(b.Ports))
	for i := range b.Ports {
		pb := &b.Ports[i]
		k := pickerKey{pb.Name, pb.Protocol, pb.Family}
		s := states[k]
		if seen[k] {
			errs = append(errs, fmt.Errorf("service port %v %v %v saved twice", pb.Name, pb.Protocol, pb.Family))
			s = nil
		}
		seen[k] = true
		if s == nil || s.cfg.String() != pb.Scheduler {
			dropped += pb.items()
			continue
		}
		r, d, err := restorePort(s, pb)
		restored, dropped = restored+r, dropped+d
		if err != nil {
			errs = append(errs, fmt.Errorf("service port %v: %w", pb.Name, err))
		}
	}
	return restored, dropped, errors.Join(errs...)
}

// restorePort restores one port's state into s.
func restorePort(s *portState, pb *PortBalancing) (restored, dropped int, err error) {
	var errs []error
	if len(pb.Affinity) > 0 {
		var aff *balancer.Affinity
		if s.picker != nil {
			aff = s.picker.Affinity()
		}
		listed := make(map[string]bool)
		for _, set := range s.sets {
			for _, k := range set.keys {
				listed[k] = true
			}
		}
		var keep []balancer.SavedList
		for _, l := range pb.Affinity {
			if aff != nil && listed[l.Endpoint] {
				keep = append(keep, l)
			} else {
				dropped += len(l.Clients) // the endpoint, or the affinity, is gone
			}
		}
		if len(keep) > 0 {
			r, d, err := aff.Restore(keep)
			if err != nil {
				for _, l := range keep {
					d += len(l.Clients)
				}
				errs = append(errs, err)
			}
			restored, dropped = restored+r, dropped+d
		}
	}
	done := [len(s.sets)]bool{}
	for i := range pb.Sets {
		sb := &pb.Sets[i]
		k := int(sb.Set)
		if k >= len(s.sets) || done[k] {
			errs = append(errs, fmt.Errorf("endpoint set %d, or twice", k))
			dropped += sb.items()
			continue
		}
		done[k] = true
		set := s.sets[k]
		if set.sched == nil || slices.Contains(s.sets[:k], set) {
			// No IPVS scheduler here, or the set is an earlier one's in
			// this table (its list is that set's): its state is that one's.
			dropped += sb.items()
			continue
		}
		r, d, err := restoreSet(set, sb)
		restored, dropped = restored+r, dropped+d
		if err != nil {
			errs = append(errs, fmt.Errorf("endpoint set %d: %w", k, err))
		}
	}
	return restored, dropped, errors.Join(errs...)
}

// restoreSet restores one endpoint set's scheduler position and templates.
func restoreSet(set *endpointSet, sb *SetBalancing) (restored, dropped int, err error) {
	var errs []error
	if v := sb.Scheduler; v != nil {
		if err := balancer.RestoreScheduler(set.sched, *v, set.beps); err != nil {
			dropped++
			errs = append(errs, err)
		} else {
			restored++
		}
	}
	if len(sb.Templates) > 0 {
		listed := make(map[netip.AddrPort]bool, len(set.eps))
		for _, e := range set.eps {
			listed[e.Addr] = true
		}
		var keep []balancer.SavedTemplate
		for _, t := range sb.Templates {
			if set.persist != nil && listed[t.Dest] {
				keep = append(keep, t)
			} else {
				dropped++ // its destination, or persistence, is gone
			}
		}
		if len(keep) > 0 {
			r, d, err := set.persist.Restore(keep)
			if err != nil {
				d = len(keep)
				errs = append(errs, err)
			}
			restored, dropped = restored+r, dropped+d
		}
	}
	return restored, dropped, errors.Join(errs...)
}

// adoptedPick counts a flow handed over by the previous process as a pick
// here would count it (step 3): on its endpoint's dest in the set its
// destination resolves to, inactive until its entry is bound (Bind moves
// an ESTABLISHED one to active), and on its client's template. A flow
// whose service port, set or endpoint this table does not have is not
// counted.
func (p *Proxy) adoptedPick(tuple conntrack.Tuple, endpoint netip.AddrPort, servicePort string) pick {
	t := p.table.Load()
	if t == nil {
		return pick{}
	}
	proto := service.TCP
	if tuple.Proto() == conntrack.UDP {
		proto = service.UDP
	}
	tg := p.resolve(t, proto, tuple.SrcAddr(), tuple.Dst())
	if tg.v != service.Forward || tg.port.Name.String() != servicePort {
		return pick{}
	}
	s := (*p.states.Load())[keyOf(tg.port)]
	if s == nil || s.port != tg.port {
		return pick{}
	}
	set := s.sets[tg.set]
	i := slices.IndexFunc(set.eps, func(e service.Endpoint) bool { return e.Addr == endpoint })
	if i < 0 {
		return pick{}
	}
	pk := pick{port: tg.port, endpoint: endpoint, ok: true, dest: set.dests[i]}
	pk.dest.conns.Open()
	if set.persist != nil {
		pk.tmpl = set.persist.Adopt(tuple.SrcAddr(), endpoint)
	}
	return pk
}

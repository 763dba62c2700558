package service

// The DNS view of a Table: what cluster DNS (the clusterdns package) answers
// from, built in the same sync as the service ports.
//
//  1. At handler time, newSvcInfo keeps a DNSService template per Service
//     (ClusterIPs, ports, headless, ExternalName); newSliceInfo keeps each
//     endpoint's hostname.
//  2. At build time, buildDNS completes a headless service's template with
//     the endpoints of its slices (ready ones, or all with
//     publishNotReadyAddresses); other services use the template as is.
//  3. applyDNS writes what changed into the table being built: the service
//     by name, its ClusterIPs in the reverse (PTR) index, its namespace in
//     the namespace set. Unchanged services share their *DNSService and
//     their shards with the previous table.

import (
	"net/netip"
	"slices"
	"strings"
)

// DNSService is what cluster DNS publishes for one Service, in the record
// shapes of CoreDNS's kubernetes plugin. Immutable once in a Table, and
// shared between tables while the service does not change.
type DNSService struct {
	// Name is the service's namespace and name (lowercase, as the API
	// server requires).
	Name ServiceName
	// ClusterIPs are the service's ClusterIPs in spec order (one per
	// family); empty for headless and ExternalName services.
	ClusterIPs []netip.Addr
	// Headless is true for clusterIP: None: A and AAAA records name the
	// endpoints, not a ClusterIP.
	Headless bool
	// ExternalName is the target of an ExternalName service's CNAME; empty
	// for every other type.
	ExternalName string
	// Ports are the service's TCP and UDP ports in spec order, for SRV
	// records (SCTP and invalid ports are left out). Name may be empty for
	// a single unnamed port.
	Ports []DNSPort
	// PublishNotReadyAddresses is the service's field of that name: a
	// headless service then publishes endpoints that are not ready.
	PublishNotReadyAddresses bool
	// Endpoints are, for a headless service, the endpoints DNS publishes:
	// the ready ones, or all with PublishNotReadyAddresses; one per
	// address (the first slice by name wins), sorted by address. Nil for
	// other services.
	Endpoints []DNSEndpoint
}

// DNSPort is one port of a service or endpoint, as SRV records name it.
type DNSPort struct {
	Name     string
	Protocol Protocol
	Port     uint16
}

// DNSEndpoint is one endpoint of a headless service.
type DNSEndpoint struct {
	Addr netip.Addr
	// Hostname is the EndpointSlice endpoint's hostname ("" when unset).
	Hostname string
	// Label is the endpoint's own DNS label: Hostname, or else the address
	// with '.' or ':' replaced by '-' (CoreDNS's rule), as in
	// "10-0-0-1.db.ns.svc.cluster.local".
	Label string
	// Ready is the endpoint's ready condition; false only for services
	// with PublishNotReadyAddresses.
	Ready bool
	// Ports are the ports of the endpoint's slice, with the endpoint's
	// port numbers (SRV records of a headless service use them).
	Ports []DNSPort
}

// DNSService returns the DNS view of the Service namespace/name. Names are
// matched exactly: Kubernetes names are lowercase, so a DNS caller lowers
// the query first. Lock-free.
func (t *Table) DNSService(namespace, name string) (*DNSService, bool) {
	if t == nil {
		return nil, false
	}
	n := ServiceName{namespace, name}
	s := t.dns[nameShard(n)][n]
	return s, s != nil
}

// DNSByIP returns the service whose ClusterIP ip is, for PTR records. When
// two services claim one ClusterIP (which the API server prevents, but
// files can say), the lower name wins.
func (t *Table) DNSByIP(ip netip.Addr) (ServiceName, bool) {
	if t == nil || ip.Zone() != "" {
		return ServiceName{}, false
	}
	k := makeKey(ip, 0, 0)
	n, ok := t.ptr[ipShard(&k.addr)][k]
	return n, ok
}

// DNSNamespace reports whether any service of the DNS view is in namespace
// ns (so "ns.svc.<domain>" exists as a name).
func (t *Table) DNSNamespace(ns string) bool {
	if t == nil {
		return false
	}
	_, ok := t.namespaces[ns]
	return ok
}

// DNSLen returns the number of services in the DNS view.
func (t *Table) DNSLen() int {
	if t == nil {
		return 0
	}
	return t.nDNS
}

// PortOwner returns the service that has a port ip:port in either protocol
// (whatever its verdict), for a local server at that address to step aside
// for it. Lock-free and allocation-free.
func (t *Table) PortOwner(ip netip.Addr, port uint16) (ServiceName, bool) {
	for _, proto := range [2]Protocol{UDP, TCP} {
		if p, v := t.Lookup(proto, ip, port); p != nil && v != NotService && v != UnknownPort {
			return p.Name.Service(), true
		}
	}
	return ServiceName{}, false
}

// buildDNS returns the DNS view of a service from its info and slices
// (sorted by name): the info's template, completed with the published
// endpoints for a headless service. Pure.
func buildDNS(info *svcInfo, sl []*sliceInfo) *DNSService {
	if info == nil || !info.hasDNS {
		return nil
	}
	tmpl := &info.dns
	if !tmpl.Headless {
		return tmpl
	}
	var eps []DNSEndpoint
	for _, s := range sl {
		var ports []DNSPort
		for _, sp := range s.ports {
			ports = append(ports, DNSPort{Name: sp.name, Protocol: sp.proto, Port: sp.port})
		}
		for i := range s.endpoints {
			se := &s.endpoints[i]
			if !se.ready && !tmpl.PublishNotReadyAddresses {
				continue
			}
			eps = append(eps, DNSEndpoint{Addr: se.addr, Hostname: se.hostname, Ready: se.ready, Ports: ports})
		}
	}
	// One per address: the first slice by name wins (a stable sort keeps
	// slice order among equal addresses); the ports of later copies join.
	slices.SortStableFunc(eps, func(a, b DNSEndpoint) int { return a.Addr.Compare(b.Addr) })
	out := eps[:0]
	for _, e := range eps {
		if n := len(out); n > 0 && out[n-1].Addr == e.Addr {
			last := &out[n-1]
			for _, p := range e.Ports {
				if !slices.Contains(last.Ports, p) {
					last.Ports = append(slices.Clip(last.Ports), p)
				}
			}
			continue
		}
		e.Label = e.Hostname
		if e.Label == "" {
			e.Label = dashedAddr(e.Addr)
		}
		out = append(out, e)
	}
	d := *tmpl
	d.Endpoints = slices.Clip(out)
	if len(d.Endpoints) == 0 {
		d.Endpoints = nil
	}
	return &d
}

// dashedAddr is an address as a DNS label: "10.0.0.1" -> "10-0-0-1",
// "fd00::1" -> "fd00--1".
func dashedAddr(a netip.Addr) string {
	return strings.Map(func(r rune) rune {
		if r == '.' || r == ':' {
			return '-'
		}
		return r
	}, a.String())
}

func (s *DNSService) equal(o *DNSService) bool {
	if s == o {
		return true
	}
	if s == nil || o == nil {
		return false
	}
	return s.Name == o.Name && s.Headless == o.Headless && s.ExternalName == o.ExternalName &&
		s.PublishNotReadyAddresses == o.PublishNotReadyAddresses &&
		slices.Equal(s.ClusterIPs, o.ClusterIPs) && slices.Equal(s.Ports, o.Ports) &&
		slices.EqualFunc(s.Endpoints, o.Endpoints, func(a, b DNSEndpoint) bool {
			return a.Addr == b.Addr && a.Hostname == b.Hostname && a.Label == b.Label &&
				a.Ready == b.Ready && slices.Equal(a.Ports, b.Ports)
		})
}

// applyDNS writes a service's new DNS view into the table being built when
// it differs from the one applied before (step 3). Called with mu held.
func (t *Tracker) applyDNS(b *tableBuilder, name ServiceName, st *svcState, fresh *DNSService) {
	old := st.dns
	if old.equal(fresh) {
		return
	}
	b.setDNS(name, fresh)
	var oldIPs, newIPs []netip.Addr
	if old != nil {
		oldIPs = old.ClusterIPs
	}
	if fresh != nil {
		newIPs = fresh.ClusterIPs
	}
	for _, ip := range oldIPs {
		if !slices.Contains(newIPs, ip) {
			t.unclaimPTR(b, ip, name)
		}
	}
	for _, ip := range newIPs {
		if !slices.Contains(oldIPs, ip) {
			t.claimPTR(b, ip, name)
		}
	}
	switch {
	case old == nil && fresh != nil:
		if t.nsRefs[name.Namespace]++; t.nsRefs[name.Namespace] == 1 {
			b.setNamespace(name.Namespace, true)
		}
	case old != nil && fresh == nil:
		if t.nsRefs[name.Namespace]--; t.nsRefs[name.Namespace] == 0 {
			delete(t.nsRefs, name.Namespace)
			b.setNamespace(name.Namespace, false)
		}
	}
	st.dns = fresh
}

// claimPTR makes name the owner of ip's PTR record unless a lower name
// owns it; the loser waits in ptrWaiting (as claim does for ports).
func (t *Tracker) claimPTR(b *tableBuilder, ip netip.Addr, name ServiceName) {
	cur, ok := b.getPTR(ip)
	switch {
	case !ok:
		b.setPTR(ip, name, true)
	case name.less(cur):
		t.ptrWaiting[ip] = append(t.ptrWaiting[ip], cur)
		b.setPTR(ip, name, true)
	default:
		t.ptrWaiting[ip] = append(t.ptrWaiting[ip], name)
	}
}

// unclaimPTR releases name's claim on ip, promoting the lowest waiting name.
func (t *Tracker) unclaimPTR(b *tableBuilder, ip netip.Addr, name ServiceName) {
	waiting := t.ptrWaiting[ip]
	if cur, _ := b.getPTR(ip); cur != name {
		if i := slices.Index(waiting, name); i >= 0 {
			waiting = slices.Delete(waiting, i, i+1)
		}
	} else if len(waiting) == 0 {
		b.setPTR(ip, ServiceName{}, false)
	} else {
		bi := 0
		for i, n := range waiting {
			if n.less(waiting[bi]) {
				bi = i
			}
		}
		b.setPTR(ip, waiting[bi], true)
		waiting = slices.Delete(waiting, bi, bi+1)
	}
	if len(waiting) == 0 {
		delete(t.ptrWaiting, ip)
	} else {
		t.ptrWaiting[ip] = waiting
	}
}

// setDNS sets (or, with d nil, removes) a service of the DNS view, copying
// its shard the first time this build writes it.
func (b *tableBuilder) setDNS(n ServiceName, d *DNSService) {
	b.touched = true
	i := nameShard(n)
	if !b.ownDNS[i] {
		b.ownDNS[i] = true
		b.t.dns[i] = cloneMap(b.t.dns[i], b.grow)
	}
	m := b.t.dns[i]
	before := len(m)
	if d == nil {
		delete(m, n)
	} else {
		m[n] = d
	}
	b.t.nDNS += len(m) - before
}

func (b *tableBuilder) getPTR(ip netip.Addr) (ServiceName, bool) {
	k := makeKey(ip, 0, 0)
	n, ok := b.t.ptr[ipShard(&k.addr)][k]
	return n, ok
}

func (b *tableBuilder) setPTR(ip netip.Addr, n ServiceName, set bool) {
	b.touched = true
	k := makeKey(ip, 0, 0)
	i := ipShard(&k.addr)
	if !b.ownPTR[i] {
		b.ownPTR[i] = true
		b.t.ptr[i] = cloneMap(b.t.ptr[i], b.grow)
	}
	if set {
		b.t.ptr[i][k] = n
	} else {
		delete(b.t.ptr[i], k)
	}
}

func (b *tableBuilder) setNamespace(ns string, present bool) {
	b.touched = true
	if !b.ownNamespaces {
		b.ownNamespaces = true
		b.t.namespaces = cloneMap(b.t.namespaces, 1)
	}
	if present {
		b.t.namespaces[ns] = struct{}{}
	} else {
		delete(b.t.namespaces, ns)
	}
}

// cloneMap copies m with room for grow more entries.
func cloneMap[K comparable, V any](m map[K]V, grow int) map[K]V {
	out := make(map[K]V, len(m)+grow)
	for k, v := range m {
		out[k] = v
	}
	return out
}

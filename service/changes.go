package service

// Changes: what a build reports to OnSync, service by service and Port by
// Port, for the proxy to act on (affinity of removed endpoints, UDP flows
// to end).
//
// 1. applyService (build.go) pairs each Port with its predecessor by
//    identity (findPort).
// 2. newPortChange records a Port added, removed or changed: the endpoints
//    that came and went (diffSorted) and, for UDP, the addresses whose flows
//    must end (staleUDP).
// 3. buildLocked sorts the Port changes (either).

import (
	"net/netip"
	"slices"
	"time"
)

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
	// that entered or left the port's usable endpoints — those of any of
	// its sets (Endpoints, ExternalEndpoints, ClusterEndpoints), kube-proxy's
	// allLocallyReachableEndpoints, whose KUBE-SEP chains (and recent lists)
	// the sets share — sorted. A removed port removes all of its endpoints.
	// The proxy drops the affinity state of removed endpoints. Read-only:
	// they may share memory with the Ports' EndpointKeys.
	EndpointsAdded, EndpointsRemoved []string
	// StaleUDP, for a UDP port, are the endpoints whose flows must end: they
	// served (or were usable) before and serve no more, sorted by key.
	// As kube-proxy's cleanup (pkg/proxy/conntrack/cleanup.go), nothing is
	// stale while no endpoint of the port serves; unlike it, a removed port
	// makes all of its endpoints stale (the ClusterIP is gone, and the
	// proxy would otherwise keep relaying its flows until they time out).
	StaleUDP []netip.AddrPort
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
		c.EndpointsAdded = usableKeys(cur)
	case cur == nil:
		c.EndpointsRemoved = usableKeys(old)
	default:
		c.EndpointsAdded, c.EndpointsRemoved = diffSorted(usableKeys(old), usableKeys(cur))
	}
	if c.Protocol == UDP && old != nil {
		c.StaleUDP = staleUDP(old, cur)
	}
	return c
}

func (c *PortChange) either() *Port {
	if c.New != nil {
		return c.New
	}
	return c.Old
}

// usableKeys returns the keys of every endpoint of p's sets, sorted and
// distinct: EndpointKeys itself unless an external set holds others.
func usableKeys(p *Port) []string {
	keys := p.EndpointKeys
	for _, other := range [2][]string{p.ExternalEndpointKeys, p.ClusterEndpointKeys} {
		if len(other) == 0 || sameStrings(keys, other) {
			continue
		}
		keys = mergeSorted(keys, other)
	}
	return keys
}

// sameStrings reports whether a and b are the same slice (shared memory).
func sameStrings(a, b []string) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// mergeSorted returns the sorted union of two sorted, distinct lists.
func mergeSorted(a, b []string) []string {
	out := make([]string, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case j == len(b) || (i < len(a) && a[i] < b[j]):
			out = append(out, a[i])
			i++
		case i == len(a) || b[j] < a[i]:
			out = append(out, b[j])
			j++
		default:
			out = append(out, a[i])
			i++
			j++
		}
	}
	return out
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

// staleUDP returns the endpoints whose UDP flows end when old becomes cur
// (nil: removed): those of old's serving or usable endpoints (of any set:
// internal, external or cluster) that are not serving in cur, unless
// nothing serves in cur. Serving holds every serving endpoint whatever the
// policies, so an endpoint that serves external traffic only keeps its
// flows as long as it serves.
func staleUDP(old, cur *Port) []netip.AddrPort {
	if cur != nil && len(cur.Serving) == 0 {
		return nil
	}
	before := slices.Clone(old.Serving)
	for _, set := range [3][]Endpoint{old.Endpoints, old.ExternalEndpoints, old.ClusterEndpoints} {
		for i := range set {
			before = append(before, set[i].Addr)
		}
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

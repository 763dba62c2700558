package service

// Why an endpoint of a service port is not among those a new flow may use
// (userproxy explain): the candidates are gathered from the service's
// slices as a build gathers them (categorize.go, step 2), and each one the
// port's set leaves out gets the reason categorize had, in its words.

import (
	"fmt"
	"slices"
)

// LeftOut is an endpoint of a service port that a set leaves out, and why.
type LeftOut struct {
	Endpoint Endpoint
	Why      string
}

// LeftOut returns the endpoints of p's slices that set (one of p's
// endpoint sets: Endpoints, ExternalEndpoints or ClusterEndpoints) does
// not hold, each with the reason; external says set is for traffic to an
// external destination (NodePort, external or load-balancer IP) from
// elsewhere, to which externalTrafficPolicy applies. It reads the slices
// the Tracker holds now, which may be newer than the table p is from.
func (t *Tracker) LeftOut(p *Port, set []Endpoint, external bool) []LeftOut {
	t.mu.Lock()
	st := t.services[p.Name.Service()]
	var cands []Endpoint
	if st != nil {
		var sc scratch // this call's own: what it returns is not reused
		cands = gatherEndpoints(st.slices, p.Family, DNSPort{Name: p.Name.Port, Protocol: p.Protocol}, t.node, &sc)
	}
	node := t.node
	t.mu.Unlock()
	in := make(map[string]bool, len(set))
	for i := range set {
		in[set[i].Key()] = true
	}
	setReady := slices.ContainsFunc(set, func(e Endpoint) bool { return e.Ready })
	var out []LeftOut
	for _, e := range cands {
		if in[e.Key()] {
			continue
		}
		out = append(out, LeftOut{Endpoint: e, Why: whyLeftOut(&e, p, external, setReady, node)})
	}
	return out
}

// whyLeftOut is the first rule of categorize (or of the external set,
// external.go) that keeps e out; setReady says the set holds ready
// endpoints, which keep the terminating ones out.
func whyLeftOut(e *Endpoint, p *Port, external, setReady bool, node nodeInfo) string {
	local := p.InternalTrafficPolicyLocal && !external || p.ExternalPolicyLocal && external
	switch {
	case !e.Ready && !(e.Serving && e.Terminating):
		return "not ready (conditions.ready and serving false)"
	case !e.Ready && setReady:
		return "terminating: used only while no endpoint is ready"
	case local && !e.Local:
		policy := "internalTrafficPolicy"
		if external {
			policy = "externalTrafficPolicy"
		}
		return fmt.Sprintf("on node %q, not this one (%q), and %s is Local", e.NodeName, node.name, policy)
	case p.Topology == TopologyPreferSameNode && !slices.Contains(e.NodeHints, node.name):
		return fmt.Sprintf("its hints send it to nodes %v, not this one (%q)", e.NodeHints, node.name)
	case p.Topology == TopologyPreferSameZone && !slices.Contains(e.ZoneHints, node.zone):
		return fmt.Sprintf("its hints send it to zones %v, not this node's (%q)", e.ZoneHints, node.zone)
	case !e.Ready:
		return "terminating, and ready endpoints exist elsewhere in the cluster"
	}
	return "not in this set"
}

package proxy

// What a new flow would meet (userproxy explain), told by the code that
// decides it: Explain runs Admit's and route's steps on the live table
// and scheduling state without counting, picking or refreshing anything:
//
//  1. the source: one no reply can reach is dropped (Admit);
//  2. the destination (resolve.go): a ClusterIP, an external or
//     load-balancer IP, or a NodePort; the service port; the endpoint set
//     and why (the traffic policies, the short-circuit for local sources,
//     loadBalancerSourceRanges), with the topology mode, node and zone;
//  3. the verdict: FORWARD, a local handler (cluster DNS), REJECT or DROP,
//     with the flows_total result a refusal is counted as;
//  4. for FORWARD: the usable endpoints with each one's chance under the
//     lottery (its exact 31-bit odds) or the IPVS scheduler's connection
//     counts, those left out and why (the caller's LeftOut: the Tracker's),
//     and the endpoint affinity or a persistence template pins the client
//     to, if any.

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// ExplainQuery is a flow to explain.
type ExplainQuery struct {
	Protocol service.Protocol
	// Client is the flow's source; Destination its destination. With
	// NodePort, Destination's port is a NodePort on one of the node's
	// NodePort addresses (the address only picks the family).
	Client      netip.Addr
	Destination netip.AddrPort
	NodePort    bool
	// LeftOut lists the endpoints of a port that set leaves out, with the
	// reason (service.Tracker.LeftOut); nil leaves them unlisted.
	LeftOut func(p *service.Port, set []service.Endpoint, external bool) []service.LeftOut
}

// Explanation is Explain's answer.
type Explanation struct {
	Steps []string `json:"steps"`
	// Verdict is FORWARD, LOCAL (served in process), REJECT or DROP;
	// Result, for a refusal, the userproxy_flows_total result it counts.
	Verdict string `json:"verdict"`
	Result  string `json:"result,omitempty"`
	// Port is the service port ("namespace/name:port"), if any.
	Port      string              `json:"port,omitempty"`
	Endpoints []ExplainedEndpoint `json:"endpoints,omitempty"`
	LeftOut   []ExplainedEndpoint `json:"leftOut,omitempty"`
	// Scheduler is "random" (the lottery) or the IPVS scheduler's name.
	Scheduler string `json:"scheduler,omitempty"`
	// Pinned is the endpoint ClientIP affinity or an IPVS persistence
	// template sends the client to.
	Pinned string `json:"pinned,omitempty"`
}

// ExplainedEndpoint is an endpoint with what Explain says of it.
type ExplainedEndpoint struct {
	Address string `json:"address"`
	Node    string `json:"node,omitempty"`
	Zone    string `json:"zone,omitempty"`
	// Chance is the probability the lottery picks it (random), 0 under an
	// IPVS scheduler; Active and Inactive are its IPVS connection counts.
	Chance   float64 `json:"chance,omitempty"`
	Active   int32   `json:"active,omitempty"`
	Inactive int32   `json:"inactive,omitempty"`
	Why      string  `json:"why,omitempty"`
}

// Explain answers q from the live table and state. It picks, counts and
// refreshes nothing; looking the client up in the affinity lists reaps a
// stale entry, as the kernel's own rcheck --reap would on its next packet.
func (p *Proxy) Explain(q ExplainQuery) Explanation {
	var e Explanation
	say := func(format string, a ...any) { e.Steps = append(e.Steps, fmt.Sprintf(format, a...)) }
	if unusableSource(q.Client) {
		say("the client %s is an address no reply can reach: the flow is dropped (the client's host needs an address the route to the service can use)", q.Client)
		e.Verdict, e.Result = "DROP", ResultDroppedUnusableSource.String()
		return e
	}
	t := p.table.Load()
	if t == nil {
		say("no service table yet (the source has not synced): every flow is refused")
		e.Verdict, e.Result = "REJECT", ResultRejectedNoService.String()
		return e
	}
	var tg target
	if q.NodePort {
		fam := service.IPv4
		if q.Destination.Addr().Is6() && !q.Destination.Addr().Is4In6() {
			fam = service.IPv6
		}
		tg = p.resolveNodePort(t, q.Protocol, fam, q.Client, q.Destination.Port())
	} else {
		tg = p.resolve(t, q.Protocol, q.Client, q.Destination)
	}
	// The verdict is the admission's own (decide); the rest says why.
	d, r, local := p.decide(t, q.Protocol, &tg, q.Destination)
	switch {
	case local:
		say("%s/%s is served in process (cluster DNS)", q.Destination, q.Protocol)
		e.Verdict = "LOCAL"
		return e
	case d != netstack.Accept:
		e.Verdict, e.Result = "REJECT", r.String()
		if d == netstack.Drop {
			e.Verdict = "DROP"
		}
	}
	if tg.port == nil {
		switch {
		case tg.v == service.UnknownPort:
			say("%s is a service's address, but no service port is %d/%s: REJECT (ICMP port unreachable)", q.Destination.Addr(), q.Destination.Port(), q.Protocol)
		case q.NodePort:
			say("no service has NodePort %d/%s: REJECT", q.Destination.Port(), q.Protocol)
		default:
			say("no service has %s (not a ClusterIP, external or load-balancer IP): REJECT", q.Destination.Addr())
		}
		return e
	}
	port := tg.port
	e.Port = port.Name.String()
	switch {
	case q.NodePort:
		say("NodePort %d/%s is the service port %s", q.Destination.Port(), q.Protocol, port.Name)
	case port.ClusterIP == q.Destination.Addr():
		say("%s is the ClusterIP of the service port %s (%s)", q.Destination, port.Name, q.Protocol)
	default:
		say("%s is an external or load-balancer IP of the service port %s (%s)", q.Destination, port.Name, q.Protocol)
	}
	say("%s", policies(port, tg))
	eps, keys := tg.endpoints()
	if q.LeftOut != nil {
		for _, lo := range q.LeftOut(port, eps, tg.set == setExternal) {
			e.LeftOut = append(e.LeftOut, ExplainedEndpoint{Address: lo.Endpoint.Key(), Node: lo.Endpoint.NodeName, Zone: lo.Endpoint.Zone, Why: lo.Why})
		}
	}
	switch r {
	case ResultProxied:
	case ResultDroppedSourceRange:
		say("the client %s is outside the loadBalancerSourceRanges %v: DROP (kube-proxy's KUBE-PROXY-FIREWALL)", q.Client, port.SourceRanges)
		return e
	case ResultDroppedLocalPolicy:
		say("no endpoint on this node, and the policy is Local: DROP%s", nodePortNote(q))
		return e
	case ResultNoWay:
		say("every endpoint is reached only through the API server, which carries TCP only: REJECT")
		return e
	default:
		say("no usable endpoint: REJECT (ICMP port unreachable)%s", nodePortNote(q))
		return e
	}
	e.Verdict = "FORWARD"
	s := (*p.states.Load())[keyOf(port)]
	var set *endpointSet
	if s != nil && s.port == port {
		set = s.sets[tg.set]
	}
	cfg := p.schedulerOf(port)
	e.Scheduler = cfg.Name
	if e.Scheduler == "" {
		e.Scheduler = "random"
	}
	for i, ep := range eps {
		x := ExplainedEndpoint{Address: keys[i], Node: ep.NodeName, Zone: ep.Zone}
		if set != nil && set.sched != nil && i < len(set.dests) {
			x.Active, x.Inactive = set.dests[i].conns.Load()
		}
		e.Endpoints = append(e.Endpoints, x)
	}
	if e.Scheduler == "random" {
		for i, pr := range p.lottery.Probabilities(len(eps)) {
			e.Endpoints[i].Chance = pr
		}
		var rules []string
		for i := range eps {
			rules = append(rules, balancer.ProbabilityString(len(eps)-i))
		}
		say("kube-proxy's lottery over %d endpoints in key order: rule i matches with probability 1/(n-i) (%s), so each endpoint gets 1/%d", len(eps), strings.Join(rules, ", "), len(eps))
	} else {
		say("the IPVS scheduler %s picks among %d endpoints by their connection counts", e.Scheduler, len(eps))
	}
	switch {
	case port.Affinity.ClientIP && s != nil && s.picker != nil && s.picker.Affinity() != nil:
		if i, ok := s.picker.Affinity().Check(keys, q.Client); ok {
			e.Pinned = keys[i]
			say("ClientIP affinity (%v): %s is pinned to %s", port.Affinity.Timeout, q.Client, keys[i])
		} else {
			say("ClientIP affinity (%v): %s is not pinned yet; its first flow's endpoint will hold it", port.Affinity.Timeout, q.Client)
		}
	case set != nil && set.persist != nil:
		if i, ok := set.persist.Peek(q.Client, set.beps); ok {
			e.Pinned = keys[i]
			say("IPVS persistence: %s has a template to %s", q.Client, keys[i])
		} else {
			say("IPVS persistence: %s has no live template; the scheduler picks", q.Client)
		}
	}
	return e
}

// nodePortNote is what a refused TCP flow to a NodePort meets instead of
// kube-proxy's DROP or REJECT: the node's socket completed the handshake
// before the proxy could decide, so the connection is reset (a documented
// difference, docs/conformance.md).
func nodePortNote(q ExplainQuery) string {
	if q.NodePort && q.Protocol == service.TCP {
		return "; on a NodePort the handshake completes first, so userproxy resets the connection instead"
	}
	return ""
}

// policies says which endpoint set a flow to tg uses, and why.
func policies(port *service.Port, tg target) string {
	var b strings.Builder
	switch tg.set {
	case setFromHost:
		b.WriteString("the client is this host or one of its pods: every cluster endpoint is used whatever externalTrafficPolicy says (kube-proxy's short-circuit)")
	case setExternal:
		if port.ExternalPolicyLocal {
			b.WriteString("externalTrafficPolicy Local: only this node's endpoints")
		} else {
			b.WriteString("externalTrafficPolicy Cluster: every usable endpoint")
		}
	default:
		if port.InternalTrafficPolicyLocal {
			b.WriteString("internalTrafficPolicy Local: only this node's endpoints")
		} else {
			b.WriteString("internalTrafficPolicy Cluster: every usable endpoint")
		}
	}
	switch port.Topology {
	case service.TopologyPreferSameZone:
		b.WriteString("; topology hints: this node's zone")
	case service.TopologyPreferSameNode:
		b.WriteString("; topology hints: this node")
	}
	return b.String()
}

// Destination reads a destination of userproxy explain: "IP:PORT", or a
// service's name, "NAME.NAMESPACE[.svc[.DOMAIN]]:PORT" with the port's
// number or name, which is the ClusterIP of that service port (IPv4 first).
func (p *Proxy) Destination(s, domain string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
	host, port, ok := strings.Cut(s, ":")
	if !ok || port == "" {
		return netip.AddrPort{}, fmt.Errorf("destination %q: want IP:PORT or NAME.NAMESPACE[.svc[.%s]]:PORT", s, domain)
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(host, "."), "."+domain), ".svc")
	name, ns, ok := strings.Cut(host, ".")
	if !ok || name == "" || ns == "" || strings.Contains(ns, ".") {
		return netip.AddrPort{}, fmt.Errorf("destination %q: want NAME.NAMESPACE[.svc[.%s]]:PORT for a service", s, domain)
	}
	t := p.table.Load()
	if t == nil {
		return netip.AddrPort{}, fmt.Errorf("destination %q: no service table yet", s)
	}
	ports := t.Service(service.ServiceName{Namespace: ns, Name: name})
	if len(ports) == 0 {
		return netip.AddrPort{}, fmt.Errorf("destination %q: no service %s/%s", s, ns, name)
	}
	for _, pt := range ports {
		if fmt.Sprint(pt.Port) == port || pt.Name.Port == port {
			if pt.ClusterIP.IsValid() {
				return netip.AddrPortFrom(pt.ClusterIP, pt.Port), nil
			}
		}
	}
	return netip.AddrPort{}, fmt.Errorf("destination %q: service %s/%s has no port %s with a ClusterIP", s, ns, name, port)
}

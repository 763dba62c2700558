package proxy

// What a new flow's destination is (kube-proxy pkg/proxy/iptables/proxier.go,
// the KUBE-SERVICES, KUBE-EXT-*, KUBE-FW-* and KUBE-NODEPORTS chains):
//
//  1. A ClusterIP:port: the port's internal set (Endpoints, Verdict).
//  2. Else an externalIP or load-balancer IP:port (LookupExternal):
//     a. an LB IP with loadBalancerSourceRanges drops a source outside them
//        (KUBE-FW, then KUBE-PROXY-FIREWALL's DROP);
//     b. a flow from this host or one of its pods (Config.LocalSource) uses
//        the cluster set whatever the external policy (the KUBE-EXT
//        "short-circuit" rules);
//     c. else the external set (ExternalEndpoints, ExternalVerdict):
//        externalTrafficPolicy Local keeps this node's endpoints and drops
//        the flow when there are none.
//  3. A NodePort (from a NodePort front end, resolveNodePort): 2b and 2c;
//     source ranges do not apply to NodePorts.
//  4. Nothing: REJECT (UnknownPort when the address is a service's).

import (
	"net/netip"

	"github.com/userproxy/userproxy/service"
)

// setKind names which of a port's endpoint sets a flow picks from.
type setKind uint8

const (
	setInternal setKind = iota // Endpoints: ClusterIP traffic
	setExternal                // ExternalEndpoints: external traffic
	setFromHost                // ClusterEndpoints: external traffic from this host
)

// target is a resolved destination: the port, the set and the verdict.
// dropped is set for a source that loadBalancerSourceRanges refuse.
type target struct {
	port    *service.Port
	set     setKind
	v       service.Verdict
	dropped bool
}

// refusal is the flows_total result of a target that is not Forward.
func (tg *target) refusal() Result {
	switch {
	case tg.dropped:
		return ResultDroppedSourceRange
	case tg.v.Drop():
		return ResultDroppedLocalPolicy
	case tg.v == service.NoEndpoints:
		return ResultRejectedNoEndpoints
	}
	return ResultRejectedNoService
}

// endpoints returns the set's endpoints and their keys.
func (tg *target) endpoints() ([]service.Endpoint, []string) {
	switch tg.set {
	case setExternal:
		return tg.port.ExternalEndpoints, tg.port.ExternalEndpointKeys
	case setFromHost:
		return tg.port.ClusterEndpoints, tg.port.ClusterEndpointKeys
	}
	return tg.port.Endpoints, tg.port.EndpointKeys
}

// resolve answers steps 1, 2 and 4 for a flow from src to dst.
func (p *Proxy) resolve(t *service.Table, proto service.Protocol, src netip.Addr, dst netip.AddrPort) target {
	port, v := t.Lookup(proto, dst.Addr(), dst.Port())
	if port != nil || (v != service.NotService && v != service.UnknownPort) {
		return target{port: port, v: v}
	}
	ext, ev := t.LookupExternal(proto, dst.Addr(), dst.Port())
	if ext == nil {
		if ev == service.UnknownPort {
			v = ev
		}
		return target{v: v}
	}
	if ext.Firewalls(dst.Addr()) && !ext.AllowsSource(src) {
		return target{port: ext, set: setExternal, v: service.NoLocalEndpoints, dropped: true}
	}
	return p.external(ext, ev, src)
}

// resolveNodePort answers step 3 for a flow from src to NodePort port of
// family fam.
func (p *Proxy) resolveNodePort(t *service.Table, proto service.Protocol, fam service.Family, src netip.Addr, port uint16) target {
	ext, ev := t.LookupNodePort(proto, fam, port)
	if ext == nil {
		return target{v: ev}
	}
	return p.external(ext, ev, src)
}

// external is 2b and 2c for a port found by an external destination.
func (p *Proxy) external(port *service.Port, v service.Verdict, src netip.Addr) target {
	if p.cfg.LocalSource != nil && p.cfg.LocalSource(src.Unmap()) {
		_, _, hv := port.ExternalFromHost()
		return target{port: port, set: setFromHost, v: hv}
	}
	return target{port: port, set: setExternal, v: v}
}

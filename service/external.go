package service

// External traffic: NodePorts, externalIPs and load-balancer IPs, the
// destinations kube-proxy's iptables mode captures outside the ClusterIP.
//
//  1. newExternalInfo keeps what a Service says about them, leniently, as
//     kube-proxy's newBaseServiceInfo (pkg/proxy/serviceport.go) and
//     pkg/proxy/util (MapIPsByIPFamily, MapCIDRsByIPFamily, IsVIPMode) read
//     it: invalid entries skipped, ingress IPs with ipMode Proxy not taken,
//     source ranges trimmed.
//  2. forFamily splits them per IP family, once per family of a service
//     (one kube-proxy proxier per family).
//  3. setExternal gives a Port its external endpoint sets and verdict, as
//     syncProxyRules (pkg/proxy/iptables/proxier.go) chooses them from
//     CategorizeEndpoints (pkg/proxy/topology.go): hasExternalEndpoints,
//     externalPolicyChain, and the KUBE-EXT short-circuit to the cluster
//     chain for traffic from this host.
//  4. externalKeys lists the lookup keys a Port claims (build.go claim);
//     LookupExternal and LookupNodePort answer a new flow; ExternalAddrs
//     lists the addresses the TUN needs routes for.

import (
	"net/netip"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// externalInfo is what the Tracker keeps of a Service's external
// destinations (svcInfo.ext), of both families.
type externalInfo struct {
	// policyLocal is kube-proxy's ExternalPolicyLocal
	// (pkg/api/v1/service/util.go): externalTrafficPolicy Local on an
	// externally accessible service.
	policyLocal bool
	// healthCheckNodePort is set when kube-proxy's NeedsHealthCheck holds
	// (type LoadBalancer and policyLocal) and the port is valid.
	healthCheckNodePort uint16
	// externalIPs and lbIPs keep spec (status) order, without repeats.
	externalIPs, lbIPs []netip.Addr
	sourceRanges       []netip.Prefix
}

// externallyAccessible is kube-proxy's apiservice.ExternallyAccessible: a
// NodePort or LoadBalancer service, or a ClusterIP one with externalIPs
// (type unset counts as ClusterIP, the API server's default).
func externallyAccessible(s *v1.Service) bool {
	switch s.Spec.Type {
	case v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer:
		return true
	case v1.ServiceTypeClusterIP, "":
		return len(s.Spec.ExternalIPs) > 0
	}
	return false
}

// newExternalInfo converts a Service's external fields (step 1).
func newExternalInfo(s *v1.Service) externalInfo {
	var e externalInfo
	e.policyLocal = externallyAccessible(s) && s.Spec.ExternalTrafficPolicy == v1.ServiceExternalTrafficPolicyLocal
	if e.policyLocal && s.Spec.Type == v1.ServiceTypeLoadBalancer && s.Spec.HealthCheckNodePort > 0 && s.Spec.HealthCheckNodePort <= 65535 {
		e.healthCheckNodePort = uint16(s.Spec.HealthCheckNodePort)
	}
	for _, str := range s.Spec.ExternalIPs {
		if ip, ok := parseLenientIP(str); ok && !slices.Contains(e.externalIPs, ip) {
			e.externalIPs = append(e.externalIPs, ip)
		}
	}
	for _, ing := range s.Status.LoadBalancer.Ingress {
		// pkg/proxy/util IsVIPMode: unset is VIP.
		if ing.IP == "" || (ing.IPMode != nil && *ing.IPMode != v1.LoadBalancerIPModeVIP) {
			continue
		}
		if ip, ok := parseLenientIP(ing.IP); ok && !slices.Contains(e.lbIPs, ip) {
			e.lbIPs = append(e.lbIPs, ip)
		}
	}
	for _, str := range s.Spec.LoadBalancerSourceRanges {
		// The API server lets these be space-padded; kube-proxy trims them.
		pfx, err := netip.ParsePrefix(strings.TrimSpace(str))
		if err != nil || pfx.Addr().Is4In6() {
			continue
		}
		if pfx = pfx.Masked(); !slices.Contains(e.sourceRanges, pfx) {
			e.sourceRanges = append(e.sourceRanges, pfx)
		}
	}
	return e
}

// parseLenientIP parses an external or ingress IP as kube-proxy's
// MapIPsByIPFamily does, skipping what it cannot use: a zone never parses,
// and an IPv4-mapped IPv6 address is the IPv4 address (net.IP's view).
// Unlike ParseIPSloppy, IPv4 with leading zeros is refused (the API server
// refuses it in new objects too).
func parseLenientIP(s string) (netip.Addr, bool) {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// familyExternal is the part of an externalInfo of one IP family (step 2).
type familyExternal struct {
	externalIPs, lbIPs []netip.Addr
	sourceRanges       []netip.Prefix
}

// forFamily returns e's addresses and ranges of family fam; nil when none.
// The slices are shared by every Port of that family.
func (e *externalInfo) forFamily(fam Family) familyExternal {
	return familyExternal{
		externalIPs:  addrsOf(e.externalIPs, fam),
		lbIPs:        addrsOf(e.lbIPs, fam),
		sourceRanges: prefixesOf(e.sourceRanges, fam),
	}
}

func addrsOf(all []netip.Addr, fam Family) []netip.Addr {
	var out []netip.Addr
	for _, a := range all {
		if familyOf(a) == fam {
			out = append(out, a)
		}
	}
	return out
}

func prefixesOf(all []netip.Prefix, fam Family) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range all {
		if familyOf(p.Addr()) == fam {
			out = append(out, p)
		}
	}
	return out
}

// hasExternal reports whether p has an external destination: kube-proxy's
// per-port ExternallyAccessible (serviceport.go).
func (p *Port) hasExternal() bool {
	return p.NodePort != 0 || len(p.ExternalIPs) > 0 || len(p.LoadBalancerIPs) > 0
}

// setExternal fills p's external endpoint sets and verdict (step 3), once
// p.Endpoints, p.EndpointKeys and p.Verdict are set. eps are all of p's
// endpoints, sorted. kube-proxy (proxier.go syncProxyRules):
//
//   - the cluster set is CategorizeEndpoints' clusterEndpoints: what
//     Endpoints holds under internalTrafficPolicy Cluster;
//   - hasExternalEndpoints is hasEndpoints, unless ExternalPolicyLocal and
//     no local endpoint: then external flows are dropped
//     (NoLocalEndpoints) — no endpoints at all rejects (NoEndpoints);
//   - the external policy chain is the local set under
//     ExternalPolicyLocal (local Ready endpoints, else local Serving and
//     Terminating ones, hints ignored), else the cluster set.
//
// A set equal to Endpoints shares its memory.
func setExternal(p *Port, eps []Endpoint, node nodeInfo, sc *scratch) {
	if !p.hasExternal() {
		p.ExternalVerdict = NotService
		return
	}
	clusterVerdict := p.Verdict
	if p.InternalTrafficPolicyLocal {
		p.ClusterEndpoints, _, clusterVerdict = categorize(eps, false, node)
		p.ClusterEndpointKeys = endpointKeys(p.ClusterEndpoints, sc)
	} else {
		p.ClusterEndpoints, p.ClusterEndpointKeys = p.Endpoints, p.EndpointKeys
	}
	switch {
	case p.ExternalPolicyLocal == p.InternalTrafficPolicyLocal:
		// Both Local (the same local set) or both Cluster.
		p.ExternalEndpoints, p.ExternalEndpointKeys, p.ExternalVerdict = p.Endpoints, p.EndpointKeys, p.Verdict
	case !p.ExternalPolicyLocal:
		p.ExternalEndpoints, p.ExternalEndpointKeys, p.ExternalVerdict = p.ClusterEndpoints, p.ClusterEndpointKeys, clusterVerdict
	default:
		p.ExternalEndpoints, _, p.ExternalVerdict = categorize(eps, true, node)
		p.ExternalEndpointKeys = endpointKeys(p.ExternalEndpoints, sc)
	}
}

// ExternalFromHost returns what a new flow from this host (or a pod on it)
// to one of p's external destinations uses: the cluster set, whatever the
// traffic policies. kube-proxy sends such traffic from the KUBE-EXT chain
// to the cluster policy chain ("route LOCAL traffic for ... external
// destinations", and "pod traffic for ... external destinations" with a
// local-traffic detector), simulating a trip out to the load balancer and
// back. The verdict is Forward, or NoEndpoints when the service has no
// usable endpoint anywhere (REJECT); NotService when p has no external
// destination.
func (p *Port) ExternalFromHost() (eps []Endpoint, keys []string, v Verdict) {
	if !p.hasExternal() {
		return nil, nil, NotService
	}
	if len(p.ClusterEndpoints) == 0 {
		return nil, nil, NoEndpoints
	}
	return p.ClusterEndpoints, p.ClusterEndpointKeys, Forward
}

// AllowsSource reports whether loadBalancerSourceRanges let a flow from src
// reach p through a load-balancer IP: true when p has no source range of its
// family, else when a range contains src (kube-proxy's KUBE-FW chain; the
// rest is dropped by KUBE-PROXY-FIREWALL). Firewalls says whether the check
// applies to a destination.
//
// kube-proxy also lets in a source equal to one of the LB IPs when a range
// contains the node's IP (a VIP bound on the node loops back with itself as
// source). The table does not know the node's IPs and does not model that;
// a flow from this host reaches the TUN with the host's own address as
// source, which a range must then contain.
func (p *Port) AllowsSource(src netip.Addr) bool {
	if len(p.SourceRanges) == 0 {
		return true
	}
	src = src.Unmap()
	for _, r := range p.SourceRanges {
		if r.Contains(src) {
			return true
		}
	}
	return false
}

// Firewalls reports whether a new flow to dst (one of p's external
// destinations) is subject to AllowsSource: dst is one of p's
// LoadBalancerIPs, p has source ranges, and p's service has endpoints
// (kube-proxy writes KUBE-FW only then: usesFWChain). NodePorts and
// externalIPs are never filtered; an address that is both an externalIP and
// an LB IP of p is matched by the externalIP rule first, which kube-proxy
// writes before the load-balancer ones, and is not filtered either.
func (p *Port) Firewalls(dst netip.Addr) bool {
	return len(p.SourceRanges) > 0 && p.ExternalVerdict != NoEndpoints &&
		slices.Contains(p.LoadBalancerIPs, dst) && !slices.Contains(p.ExternalIPs, dst)
}

// externalAddrs returns the distinct externalIPs and LB IPs of ports, in
// first-seen order (the external markers of a service).
func externalAddrs(ports []*Port) []netip.Addr {
	var out []netip.Addr
	for _, p := range ports {
		for _, list := range [2][]netip.Addr{p.ExternalIPs, p.LoadBalancerIPs} {
			for _, a := range list {
				if !slices.Contains(out, a) {
					out = append(out, a)
				}
			}
		}
	}
	return out
}

// portKeys appends to dst every lookup key p claims (step 4): its ClusterIP
// key, one per distinct external address, and its NodePort key.
func portKeys(dst []lookupKey, p *Port) []lookupKey {
	dst = append(dst, makeKey(p.ClusterIP, p.Port, p.Protocol))
	for _, a := range p.ExternalIPs {
		dst = append(dst, makeExternalKey(a, p.Port, p.Protocol))
	}
	for _, a := range p.LoadBalancerIPs {
		if !slices.Contains(p.ExternalIPs, a) {
			dst = append(dst, makeExternalKey(a, p.Port, p.Protocol))
		}
	}
	if p.NodePort != 0 {
		dst = append(dst, makeNodePortKey(p.Family, p.NodePort, p.Protocol))
	}
	return dst
}

// LookupExternal answers a new flow of protocol proto to ip:port where ip
// is an externalIP or a load-balancer IP, as Lookup does for ClusterIPs:
// the *Port and its ExternalVerdict (Forward: pick one of
// ExternalEndpoints; NoEndpoints: REJECT; NoLocalEndpoints: DROP), or nil
// with UnknownPort (the address belongs to some proxied service port, but
// not with this port and protocol: REJECT, as for a ClusterIP — the TUN is
// routed the whole address and nothing else would answer) or NotService.
//
// The caller then applies, in kube-proxy's order: for an LB IP with source
// ranges, AllowsSource (Firewalls says when); for a flow from this host,
// ExternalFromHost instead of ExternalEndpoints. Two service ports claiming
// one ip:port/protocol: the lower name (namespace, name, port name) wins,
// as for ClusterIPs. An address that is both a ClusterIP and an external
// address is looked up with Lookup first; LookupExternal answers when Lookup
// says NotService or UnknownPort and it knows the address.
//
// O(1), lock-free and allocation-free, like Lookup.
func (t *Table) LookupExternal(proto Protocol, ip netip.Addr, port uint16) (*Port, Verdict) {
	if t == nil || ip.Zone() != "" {
		return nil, NotService
	}
	p, v := t.find(makeExternalKey(ip, port, proto))
	if p != nil {
		return p, p.ExternalVerdict
	}
	return nil, v
}

// LookupNodePort answers a new flow of protocol proto to NodePort port on a
// node address of family fam (kube-proxy's KUBE-NODEPORTS, one proxier per
// family): the *Port and its ExternalVerdict, or nil and NotService when no
// service port has that NodePort (the flow is not the proxy's: the host's
// own sockets answer it). A dual-stack service's NodePort answers for both
// families, each with the Port of that family. NodePorts are never subject
// to source ranges. O(1), lock-free and allocation-free.
func (t *Table) LookupNodePort(proto Protocol, fam Family, port uint16) (*Port, Verdict) {
	if t == nil || port == 0 || proto == 0 {
		return nil, NotService
	}
	k := makeNodePortKey(fam, port, proto)
	if p := t.index[ipShard(&k.addr)][k]; p != nil {
		return p, p.ExternalVerdict
	}
	return nil, NotService
}

// ExternalAddrs returns every externalIP and load-balancer IP of a proxied
// service port, sorted and distinct: the addresses the TUN must be routed.
// The slice is shared between tables while it does not change and must not
// be modified.
func (t *Table) ExternalAddrs() []netip.Addr {
	if t == nil {
		return nil
	}
	return t.extAddrs
}

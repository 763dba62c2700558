package rules

// External destinations: what syncProxyRules (kubernetes
// pkg/proxy/iptables/proxier.go) writes for NodePorts, external IPs and
// load-balancer IPs, beside the ClusterIP rules of iptables.go.
//
//  1. per service port with such a destination (writeExternalCaptures):
//     the KUBE-SERVICES rules sending each external IP to the port's
//     KUBE-EXT chain and each load-balancer IP to it (or to KUBE-FW when
//     loadBalancerSourceRanges apply, with the drop of what KUBE-FW lets
//     through in the filter table's KUBE-PROXY-FIREWALL); the
//     KUBE-NODEPORTS rules of the NodePort; the KUBE-EXTERNAL-SERVICES
//     REJECT (no endpoints) or DROP (Local policy, no local endpoint) for
//     each destination; the filter KUBE-NODEPORTS ACCEPT of the health
//     check node port;
//  2. the KUBE-EXT chain (writeExternalChain): the masquerade mark under
//     Cluster policy, or under Local policy the short-circuit of pod and
//     host traffic to the KUBE-SVC chain; then the jump to the policy
//     chain;
//  3. the KUBE-FW chain (writeFirewallChain): each source range on to
//     KUBE-EXT, the rest falls through;
//  4. once per family, the tail of KUBE-SERVICES that sends local
//     destinations to KUBE-NODEPORTS, as --nodeport-addresses says
//     (nodePortAddresses, writeNodePortsTail).

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/userproxy/userproxy/service"
)

const (
	prefixEXT = "KUBE-EXT-"
	prefixFW  = "KUBE-FW-"

	// The nfacct counters kube-proxy creates (pkg/proxy/metrics), counted
	// by the INVALID drop and the localhost NodePort rules.
	nfacctInvalidDropped    = "ct_state_invalid_dropped_pkts"
	nfacctLocalhostNodePort = "localhost_nps_accepted_pkts"

	// ipv4Loopback is what localhost NodePorts (route_localnet) answer on.
	ipv4Loopback = "127.0.0.0/8"
)

// ExternalChain returns the KUBE-EXT-… chain kube-proxy names for a service
// port's external destinations (serviceExternalChainName).
func ExternalChain(name service.PortName, proto service.Protocol) string {
	return prefixEXT + portProtoHash(name.String(), protoName(proto))
}

// FirewallChain returns the KUBE-FW-… chain kube-proxy names for a service
// port's loadBalancerSourceRanges (serviceFirewallChainName).
func FirewallChain(name service.PortName, proto service.Protocol) string {
	return prefixFW + portProtoHash(name.String(), protoName(proto))
}

// writeExternalCaptures writes step 1 for p, after its ClusterIP rule.
func (b *portRules) writeExternalCaptures(filter, nat *ruleTable, p *service.Port, s *portSets) {
	name := p.Name.String()
	proto := protoName(p.Protocol)
	ext := ExternalChain(p.Name, p.Protocol)

	// What the filter table does with external traffic no chain takes:
	// REJECT without endpoints; DROP under Local policy without a local
	// endpoint (traffic from this host was short-circuited by KUBE-EXT).
	refuseComment, refuseTarget := "", ""
	switch {
	case !s.hasEndpoints:
		refuseComment, refuseTarget = `"`+name+` has no endpoints"`, "REJECT"
	case !s.hasExternal:
		refuseComment, refuseTarget = `"`+name+` has no local endpoints"`, "DROP"
	}

	for _, ip := range p.ExternalIPs {
		if s.hasEndpoints {
			b.dstRule(nat, chainServices, `"`+name+` external IP"`, proto, ip, p.Port, ext)
		}
		if refuseTarget != "" {
			b.dstRule(filter, chainExternalServices, refuseComment, proto, ip, p.Port, refuseTarget)
		}
	}

	lbTarget := ext
	if s.usesFirewallChain {
		lbTarget = FirewallChain(p.Name, p.Protocol)
	}
	for _, ip := range p.LoadBalancerIPs {
		if s.hasEndpoints {
			b.dstRule(nat, chainServices, `"`+name+` loadbalancer IP"`, proto, ip, p.Port, lbTarget)
		}
		if s.usesFirewallChain {
			b.dstRule(filter, chainProxyFirewall, `"`+name+` traffic not accepted by `+lbTarget+`"`, proto, ip, p.Port, "DROP")
		}
	}
	if refuseTarget != "" {
		for _, ip := range p.LoadBalancerIPs {
			b.dstRule(filter, chainExternalServices, refuseComment, proto, ip, p.Port, refuseTarget)
		}
	}

	if p.NodePort != 0 {
		np := strconv.Itoa(int(p.NodePort))
		nameSave := saveString(name)
		if s.hasEndpoints {
			// NodePorts are not subject to loadBalancerSourceRanges. The
			// localhost rule only counts what route_localnet lets in.
			if b.localhostNodePorts && b.opts.NFAcct {
				nat.add(chainNodePorts,
					"-m comment --comment "+name+" -m "+proto+" -p "+proto+" -d "+ipv4Loopback+" --dport "+np+
						" -m nfacct --nfacct-name "+nfacctLocalhostNodePort+" -j "+ext,
					"-d "+ipv4Loopback+" -p "+proto+" -m comment --comment "+nameSave+" -m "+proto+" --dport "+np+
						" -m nfacct --nfacct-name "+saveStringSpaced(nfacctLocalhostNodePort)+" -j "+ext)
			}
			nat.add(chainNodePorts,
				"-m comment --comment "+name+" -m "+proto+" -p "+proto+" --dport "+np+" -j "+ext,
				"-p "+proto+" -m comment --comment "+nameSave+" -m "+proto+" --dport "+np+" -j "+ext)
		}
		if refuseTarget != "" {
			filter.add(chainExternalServices,
				"-m comment --comment "+refuseComment+" -m addrtype --dst-type LOCAL -m "+proto+" -p "+proto+" --dport "+np+" -j "+refuseTarget,
				"-p "+proto+" -m comment --comment "+saveString(strings.Trim(refuseComment, `"`))+" -m addrtype --dst-type LOCAL -m "+proto+
					" --dport "+np+" -j "+b.savedTarget(refuseTarget))
		}
	}

	// The health check node port is accepted whatever the endpoints.
	if p.HealthCheckNodePort != 0 {
		hc := strconv.Itoa(int(p.HealthCheckNodePort))
		c := name + " health check node port"
		filter.add(chainNodePorts,
			`-m comment --comment "`+c+`" -m tcp -p tcp --dport `+hc+" -j ACCEPT",
			"-p tcp -m comment --comment "+saveString(c)+" -m tcp --dport "+hc+" -j ACCEPT")
	}
}

// writeExternalChain writes step 2: the KUBE-EXT chain every external
// destination of p jumps to.
func (b *portRules) writeExternalChain(nat *ruleTable, p *service.Port, s *portSets) {
	name := p.Name.String()
	ext := ExternalChain(p.Name, p.Protocol)
	nat.declare(ext)
	rule := func(comment, match, target string) {
		c := comment + " for " + name + " external destinations"
		nat.add(ext,
			`-m comment --comment "`+c+`" `+match+"-j "+target,
			"-m comment --comment "+saveString(c)+" "+match+"-j "+target)
	}
	if !p.ExternalPolicyLocal {
		// The endpoint may be on another node: masquerade.
		rule("masquerade traffic", "", chainMarkMasq)
	} else {
		// Traffic from pods on this node goes to the cluster chain, as if
		// it had gone out to the load balancer and come back (needs a
		// local traffic detector: --cluster-cidr here).
		if b.clusterCIDR.IsValid() {
			c := "pod traffic for " + name + " external destinations"
			nat.add(ext,
				`-m comment --comment "`+c+`" -s `+b.clusterCIDR.String()+" -j "+s.clusterChain,
				"-s "+b.clusterCIDR.String()+" -m comment --comment "+saveString(c)+" -j "+s.clusterChain)
		}
		// Traffic from the host itself has a local source address (the
		// external IP, say): masquerade it, and send it to the cluster
		// chain too.
		const local = "-m addrtype --src-type LOCAL "
		rule("masquerade LOCAL traffic", local, chainMarkMasq)
		rule("route LOCAL traffic", local, s.clusterChain)
	}
	if s.hasExternal {
		nat.add(ext, "-j "+s.externalPolicyChain, "-j "+s.externalPolicyChain)
	}
}

// writeFirewallChain writes step 3: KUBE-FW passes the source ranges on to
// KUBE-EXT; what falls off its end was not DNATed and meets the DROP in
// KUBE-PROXY-FIREWALL. kube-proxy also passes traffic from the LB IPs
// themselves when a range contains its node IP; we know no node IP (as
// kube-proxy without one) and write no such rule.
func (b *portRules) writeFirewallChain(nat *ruleTable, p *service.Port, s *portSets) {
	name := p.Name.String()
	fw := FirewallChain(p.Name, p.Protocol)
	ext := ExternalChain(p.Name, p.Protocol)
	nat.declare(fw)
	c := name + " loadbalancer IP"
	for _, r := range p.SourceRanges {
		nat.add(fw,
			`-m comment --comment "`+c+`" -s `+r.String()+" -j "+ext,
			"-s "+r.String()+" -m comment --comment "+saveString(c)+" -j "+ext)
	}
	last := "other traffic to " + name + " will be dropped by " + chainProxyFirewall
	nat.add(fw, `-m comment --comment "`+last+`"`, "-m comment --comment "+saveString(last))
}

// nodePortAddresses is kube-proxy's NodePortAddresses for one family
// (pkg/proxy/util/nodeport_addresses.go NewNodePortAddresses).
type nodePortAddresses struct {
	cidrs                []netip.Prefix
	matchAll             bool
	containsIPv4Loopback bool
}

// newNodePortAddresses keeps the CIDRs of family fam; none of them (or a
// zero-length one, which ends the list) matches all local addresses.
func newNodePortAddresses(fam service.Family, all []netip.Prefix) nodePortAddresses {
	var npa nodePortAddresses
	var cidrs []netip.Prefix
	for _, c := range all {
		if c.IsValid() && (c.Addr().Is4() == (fam == service.IPv4)) {
			cidrs = append(cidrs, c.Masked())
		}
	}
	if len(cidrs) == 0 {
		zero := netip.PrefixFrom(netip.IPv6Unspecified(), 0)
		if fam == service.IPv4 {
			zero = netip.PrefixFrom(netip.IPv4Unspecified(), 0)
		}
		cidrs = []netip.Prefix{zero}
	}
	loopback := netip.MustParseAddr("127.0.0.0")
	for _, c := range cidrs {
		if c.Addr().Is4() && (c.Addr().IsLoopback() || c.Contains(loopback)) {
			npa.containsIPv4Loopback = true
		}
		if c.Bits() == 0 {
			npa.cidrs, npa.matchAll = []netip.Prefix{c}, true
			break
		}
		npa.cidrs = append(npa.cidrs, c)
	}
	return npa
}

// nodeIPs are the local addresses the CIDRs contain (GetNodeIPs), sorted
// and distinct (kube-proxy's order is a map's).
func (npa *nodePortAddresses) nodeIPs(local []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range local {
		a = a.Unmap().WithZone("")
		if slices.ContainsFunc(npa.cidrs, func(c netip.Prefix) bool { return c.Contains(a) }) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// writeNodePortsTail writes step 4, the last rule(s) of KUBE-SERVICES.
func (b *portRules) writeNodePortsTail(nat *ruleTable, fam service.Family, npa *nodePortAddresses) {
	const npComment = `"kubernetes service nodeports; NOTE: this must be the last rule in this chain"`
	if npa.matchAll {
		// Localhost NodePorts never work for IPv6, and for IPv4 only with
		// route_localnet, which kube-proxy sets for localhost NodePorts.
		notDst := ""
		switch {
		case fam == service.IPv6:
			notDst = "::1/128"
		case !b.localhostNodePorts:
			notDst = ipv4Loopback
		}
		if notDst != "" {
			nat.add(chainServices,
				"-m comment --comment "+npComment+" -m addrtype --dst-type LOCAL ! -d "+notDst+" -j "+chainNodePorts,
				"! -d "+notDst+" -m comment --comment "+npComment+" -m addrtype --dst-type LOCAL -j "+chainNodePorts)
		} else {
			r := "-m comment --comment " + npComment + " -m addrtype --dst-type LOCAL -j " + chainNodePorts
			nat.add(chainServices, r, r)
		}
		return
	}
	// One rule per node address in --nodeport-addresses; loopback ones
	// only where localhost NodePorts work.
	for _, ip := range npa.nodeIPs(b.opts.LocalAddrs) {
		if ip.IsLoopback() && (fam == service.IPv6 || !b.localhostNodePorts) {
			continue
		}
		nat.add(chainServices,
			"-m comment --comment "+npComment+" -d "+ip.String()+" -j "+chainNodePorts,
			"-d "+ip.String()+"/"+strconv.Itoa(b.nw.hostBits)+" -m comment --comment "+npComment+" -j "+chainNodePorts)
	}
}

package rules

// The rules printer: the iptables rules kube-proxy's iptables mode would write
// for a service table, so that our behaviour can be held against a node
// running kube-proxy (`userproxy rules`, /debug/rules) and the kernel path
// can be set up from the same objects in a differential test.
//
//  1. per IP family (kube-proxy runs one proxier per family), the Ports of
//     that family in Table.Ports order;
//  2. the rules of syncProxyRules (kubernetes pkg/proxy/iptables/proxier.go)
//     for each port: the KUBE-SERVICES capture of the ClusterIP, or a
//     filter-table REJECT (no endpoints) or DROP (internalTrafficPolicy
//     Local without a local endpoint); the captures of its NodePort,
//     external IPs and load-balancer IPs, with their KUBE-EXT and KUBE-FW
//     chains and filter-table REJECT, DROP and ACCEPT rules (external.go);
//     the KUBE-SVC chain (cluster endpoints) and KUBE-SVL chain (local
//     endpoints, for either Local policy) with the ClientIP affinity checks
//     and the statistic cascade (writeServiceToEndpointRules); one KUBE-SEP
//     chain per endpoint either uses;
//  3. the static rules around them (KUBE-POSTROUTING, KUBE-MARK-MASQ,
//     KUBE-FORWARD with the INVALID drop, KUBE-FIREWALL for localhost
//     NodePorts, the nodeports tail rule(s) of --nodeport-addresses);
//  4. printed as iptables-save prints them back (FormatSave) or as
//     kube-proxy hands them to iptables-restore (FormatRestore).
//
// What is not printed: the KUBE-FW rules that let in traffic from a
// load-balancer IP itself when a source range contains the node's IP
// (kube-proxy's allowFromNode: no node IP is known here, as for a
// kube-proxy without one), the mangle table's KUBE-PROXY-CANARY, and the
// removal (-X) of stale chains. Chains that kube-proxy builds from a map
// (the KUBE-SEP chains of a port using both its cluster and local
// endpoints, the nodeports tail rules of --nodeport-addresses) are in
// sorted order, where kube-proxy's order varies from sync to sync.

import (
	"bufio"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/service"
)

// Format chooses the text Write prints.
type Format uint8

const (
	// FormatSave prints what iptables-save (ip6tables-save for IPv6) prints
	// on a node after kube-proxy wrote the rules: the kernel's canonical
	// argument order, addresses with their prefix length, and the values as
	// the kernel stores them (a probability of 0.3333333333 is printed
	// back as 0.33333333349, the 31-bit threshold over 2^31; --or-mark as
	// --set-xmark; REJECT with its --reject-with; recent with its --mask
	// and --rsource). Chains are declared built-in first, then user chains
	// sorted by name, and each chain's rules follow in that order, as
	// iptables-save groups them. Checked against iptables-save v1.8.9
	// (nf_tables): restoring this output and saving it again gives the same
	// lines, the two "#" comment lines aside.
	FormatSave Format = iota
	// FormatRestore prints the iptables-restore input kube-proxy itself
	// writes (syncProxyRules): its argument order, probabilities as
	// balancer.ProbabilityString prints them ("%0.10f" of 1/n), chains
	// and rules in the order the proxier emits them.
	FormatRestore
)

// String returns "save" or "restore".
func (f Format) String() string {
	if f == FormatRestore {
		return "restore"
	}
	return "save"
}

// ParseFormat parses "save" or "restore" ("" is "save").
func ParseFormat(s string) (Format, error) {
	switch s {
	case "", "save":
		return FormatSave, nil
	case "restore":
		return FormatRestore, nil
	}
	return 0, fmt.Errorf("unknown rules format %q: want save or restore", s)
}

// Options tunes Write. The zero value prints both families in
// FormatSave, for kube-proxy's default flags.
type Options struct {
	// Format is the text to print.
	Format Format
	// Family restricts the output to service.IPv4 or service.IPv6. Zero
	// prints IPv4, then IPv6 when the table has IPv6 ports; each family is
	// a section of its own (a complete iptables-restore input), as one
	// would get from iptables-save and ip6tables-save.
	Family service.Family
	// ClusterCIDRs is kube-proxy's --cluster-cidr (detect-local-mode
	// ClusterCIDR): for each family that has a CIDR here, the service chain
	// marks traffic to the ClusterIP from outside the CIDR for masquerade
	// (`! -s CIDR -j KUBE-MARK-MASQ`). Without one, kube-proxy has no local
	// traffic detector and writes no such rule.
	ClusterCIDRs []netip.Prefix
	// MasqueradeAll is kube-proxy's --masquerade-all: every packet to a
	// ClusterIP is marked for masquerade (the rule has no -s).
	MasqueradeAll bool
	// TCPBeLiberal says nf_conntrack_tcp_be_liberal is set (our
	// --conntrack-tcp-be-liberal); kube-proxy then writes no rule dropping
	// INVALID packets.
	TCPBeLiberal bool
	// NodePortAddresses is kube-proxy's --nodeport-addresses: the CIDRs
	// (of both families; a "primary" entry is the caller's to resolve into
	// the node's IPs) whose local addresses NodePorts answer on. A family
	// with no CIDR here, or with a zero-length one (0.0.0.0/0, ::/0),
	// answers on every local address: the `-m addrtype --dst-type LOCAL`
	// jump to KUBE-NODEPORTS. Otherwise KUBE-SERVICES jumps to it for each
	// of LocalAddrs in a CIDR (`-d IP`), as kube-proxy does for the
	// addresses it finds on the node's interfaces. IPv4 localhost
	// NodePorts (127.0.0.0/8, route_localnet, and kube-proxy's copy of
	// kubelet's KUBE-FIREWALL rule) are on when no IPv4 CIDR is given or
	// one contains a loopback address.
	NodePortAddresses []netip.Prefix
	// LocalAddrs are the node's interface addresses (net.InterfaceAddrs),
	// matched against NodePortAddresses; unused when those match all.
	LocalAddrs []netip.Addr
	// NoLocalhostNodePorts is kube-proxy's
	// --iptables-localhost-nodeports=false: no IPv4 NodePorts on loopback
	// addresses whatever NodePortAddresses say.
	NoLocalhostNodePorts bool
	// NFAcct says kube-proxy's nfacct counters exist (it creates them when
	// the kernel has nfnetlink_acct): the INVALID drop then counts into
	// ct_state_invalid_dropped_pkts, and each NodePort gets a rule
	// counting localhost NodePort packets into localhost_nps_accepted_pkts
	// before its plain rule. Off, kube-proxy writes neither match.
	NFAcct bool
	// JumpRules adds the rules that hook kube-proxy's chains into the
	// built-in chains (PREROUTING and OUTPUT to KUBE-SERVICES, FORWARD to
	// KUBE-FORWARD, ...). kube-proxy creates them with single iptables
	// calls that prepend them, not through iptables-restore; they are
	// printed as they end up on a node where nothing else prepended rules
	// (FormatSave) or as "-I" lines that give the same result
	// (FormatRestore). Needed to make the rules take effect in a network
	// namespace of their own.
	JumpRules bool
}

// Chain names, as pkg/proxy/iptables/proxier.go spells them.
const (
	chainServices         = "KUBE-SERVICES"
	chainExternalServices = "KUBE-EXTERNAL-SERVICES"
	chainNodePorts        = "KUBE-NODEPORTS"
	chainPostrouting      = "KUBE-POSTROUTING"
	chainMarkMasq         = "KUBE-MARK-MASQ"
	chainForward          = "KUBE-FORWARD"
	chainProxyFirewall    = "KUBE-PROXY-FIREWALL"
	chainKubeletFirewall  = "KUBE-FIREWALL"

	prefixSVC = "KUBE-SVC-"
	prefixSVL = "KUBE-SVL-"
	prefixSEP = "KUBE-SEP-"
)

// masqueradeBit is kube-proxy's default --iptables-masquerade-bit.
const masqueradeBit = 14

// largeClusterEndpoints is proxier.go's largeClusterEndpointsThreshold: with
// more endpoints than this in one family, kube-proxy leaves the comments off
// the KUBE-SVC and KUBE-SEP rules.
const largeClusterEndpoints = 1000

// portProtoHash is kube-proxy's portProtoHash (pkg/proxy/iptables/proxier.go):
// the first 16 characters of the standard base32 encoding of
// sha256(servicePortName + protocol), where the name is
// ServicePortName.String() and the protocol is lower case. Iptables chain
// names must be at most 28 characters.
func portProtoHash(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
	}
	return base32.StdEncoding.EncodeToString(h.Sum(nil))[:16]
}

// protoName is the protocol as kube-proxy passes it to the hash and to -p:
// strings.ToLower(string(v1.Protocol)).
func protoName(p service.Protocol) string { return strings.ToLower(p.String()) }

// ServiceChain returns the KUBE-SVC-… chain kube-proxy names for a service
// port with Cluster traffic policy (servicePortPolicyClusterChain).
func ServiceChain(name service.PortName, proto service.Protocol) string {
	return prefixSVC + portProtoHash(name.String(), protoName(proto))
}

// LocalServiceChain returns the KUBE-SVL-… chain kube-proxy names for a
// service port with Local traffic policy (servicePortPolicyLocalChainName).
func LocalServiceChain(name service.PortName, proto service.Protocol) string {
	return prefixSVL + portProtoHash(name.String(), protoName(proto))
}

// EndpointChain returns the KUBE-SEP-… chain of one endpoint of a service port
// (servicePortEndpointChainName); endpoint is "ip:port", or "[ip]:port" for
// IPv6 — service.Endpoint.Key, which is kube-proxy's Endpoint.String.
func EndpointChain(name service.PortName, proto service.Protocol, endpoint string) string {
	return prefixSEP + portProtoHash(name.String(), protoName(proto), endpoint)
}

// Write writes the rules kube-proxy's iptables mode would write for the
// service ports of t (nil is an empty table), as opts says, in a
// deterministic order: families IPv4 then IPv6, tables filter then nat,
// service ports in Table.Ports order. Each family's section is a complete
// iptables-restore (ip6tables-restore) input, headed by a "#" comment line.
// It returns the first error writing to w.
func Write(w io.Writer, t *service.Table, opts Options) error {
	ports := t.Ports()
	var families []service.Family
	switch opts.Family {
	case service.IPv4, service.IPv6:
		families = []service.Family{opts.Family}
	case 0:
		families = []service.Family{service.IPv4}
		if slices.ContainsFunc(ports, func(p *service.Port) bool { return p.Family == service.IPv6 }) {
			families = append(families, service.IPv6)
		}
	default:
		return fmt.Errorf("rules: for IP family %d: want 4, 6 or 0 for both", opts.Family)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	for _, fam := range families {
		fr := buildFamily(fam, ports, &opts)
		if opts.Format == FormatRestore {
			fr.writeRestore(bw)
		} else {
			fr.writeSave(bw)
		}
	}
	return bw.Flush()
}

// rule is one rule in both spellings. body follows "-A chain " (or
// "-I chain " for a prepended jump rule in FormatRestore).
type rule struct {
	chain         string
	restore, save string
}

// ruleTable is what one iptables table gets from one family's proxier.
type ruleTable struct {
	name string
	// builtin are the table's built-in chains, in the kernel's order.
	builtin []string
	// chains are the user chains, in the order kube-proxy declares them.
	chains []string
	// rules are in the order kube-proxy writes them.
	rules []rule
	// jumps are the prepended jump rules, in the order kube-proxy
	// prepends them (so the last is first in its chain).
	jumps []rule
}

func (rt *ruleTable) declare(chain string) { rt.chains = append(rt.chains, chain) }

func (rt *ruleTable) add(chain, restore, save string) {
	rt.rules = append(rt.rules, rule{chain: chain, restore: restore, save: save})
}

// familyRules is the output of one proxier (one IP family).
type familyRules struct {
	family      service.Family
	filter, nat ruleTable
}

// familyNet holds the family-dependent spellings.
type familyNet struct {
	hostBits   int    // 32 or 128: the prefix length iptables-save prints
	recentMask string // xt_recent's default --mask, as saved
	rejectWith string // REJECT's default --reject-with, as saved
	saveCmd    string // the tool whose output FormatSave mimics
	restoreCmd string
}

func netOf(fam service.Family) familyNet {
	if fam == service.IPv6 {
		return familyNet{128, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "icmp6-port-unreachable",
			"ip6tables-save", "ip6tables-restore"}
	}
	return familyNet{32, "255.255.255.255", "icmp-port-unreachable", "iptables-save", "iptables-restore"}
}

// buildFamily computes the rules of one family, following syncProxyRules
// (pkg/proxy/iptables/proxier.go) step by step.
func buildFamily(fam service.Family, all []*service.Port, opts *Options) *familyRules {
	nw := netOf(fam)
	mark := uint32(1) << masqueradeBit
	markRestore := fmt.Sprintf("%#08x", mark) // kube-proxy's masqueradeMark: "0x00004000"
	markSave := fmt.Sprintf("0x%x", mark)
	fr := &familyRules{
		family: fam,
		filter: ruleTable{name: "filter", builtin: []string{"INPUT", "FORWARD", "OUTPUT"}},
		nat:    ruleTable{name: "nat", builtin: []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"}},
	}
	filter, nat := &fr.filter, &fr.nat

	// The top-level chains.
	for _, c := range []string{chainServices, chainExternalServices, chainForward, chainNodePorts, chainProxyFirewall} {
		filter.declare(c)
	}
	for _, c := range []string{chainServices, chainNodePorts, chainPostrouting, chainMarkMasq} {
		nat.declare(c)
	}
	nat.add(chainPostrouting,
		fmt.Sprintf("-m mark ! --mark %s/%s -j RETURN", markRestore, markRestore),
		fmt.Sprintf("-m mark ! --mark %s/%s -j RETURN", markSave, markSave))
	nat.add(chainPostrouting,
		"-j MARK --xor-mark "+markRestore,
		fmt.Sprintf("-j MARK --set-xmark %s/0x0", markSave))
	nat.add(chainPostrouting,
		`-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`,
		`-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	nat.add(chainMarkMasq,
		"-j MARK --or-mark "+markRestore,
		fmt.Sprintf("-j MARK --set-xmark %s/%s", markSave, markSave))

	// Localhost NodePorts (route_localnet) are on for IPv4 unless turned
	// off or --nodeport-addresses leaves out loopback (NewProxier); then
	// kube-proxy duplicates kubelet's anti-martian rule.
	npa := newNodePortAddresses(fam, opts.NodePortAddresses)
	localhostNodePorts := fam == service.IPv4 && !opts.NoLocalhostNodePorts && npa.containsIPv4Loopback
	if localhostNodePorts {
		filter.declare(chainKubeletFirewall)
		filter.add(chainKubeletFirewall,
			`-m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
			`! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`)
	} else if opts.JumpRules {
		// The jump below needs the chain; kube-proxy's EnsureChain made it.
		filter.declare(chainKubeletFirewall)
	}

	var ports []*service.Port
	endpoints := 0
	for _, p := range all {
		if p.Family == fam {
			ports = append(ports, p)
			endpoints += len(p.Endpoints)
		}
	}
	b := portRules{nw: nw, opts: opts, largeCluster: endpoints > largeClusterEndpoints, localhostNodePorts: localhostNodePorts}
	for _, c := range opts.ClusterCIDRs {
		if (c.Addr().Is4() && fam == service.IPv4) || (c.Addr().Is6() && !c.Addr().Is4In6() && fam == service.IPv6) {
			b.clusterCIDR = c.Masked()
			break
		}
	}
	for _, p := range ports {
		b.write(filter, nat, p)
	}

	// The tail of KUBE-SERVICES: local destinations go on to the nodeports
	// chain.
	b.writeNodePortsTail(nat, fam, &npa)

	// KUBE-FORWARD: drop INVALID packets unless the conntrack is liberal
	// (kubernetes issues 74839 and 117924), then accept marked and
	// tracked traffic.
	if !opts.TCPBeLiberal {
		if opts.NFAcct {
			filter.add(chainForward,
				"-m conntrack --ctstate INVALID -m nfacct --nfacct-name "+nfacctInvalidDropped+" -j DROP",
				"-m conntrack --ctstate INVALID -m nfacct --nfacct-name "+saveStringSpaced(nfacctInvalidDropped)+" -j DROP")
		} else {
			r := "-m conntrack --ctstate INVALID -j DROP"
			filter.add(chainForward, r, r)
		}
	}
	filter.add(chainForward,
		fmt.Sprintf(`-m comment --comment "kubernetes forwarding rules" -m mark --mark %s/%s -j ACCEPT`, markRestore, markRestore),
		fmt.Sprintf(`-m comment --comment "kubernetes forwarding rules" -m mark --mark %s/%s -j ACCEPT`, markSave, markSave))
	r := `-m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`
	filter.add(chainForward, r, r)

	if opts.JumpRules {
		addJumpRules(filter, nat)
	}
	return fr
}

// addJumpRules adds proxier.go's iptablesJumpChains and
// iptablesKubeletJumpChains, in that order (each is prepended to its chain).
func addJumpRules(filter, nat *ruleTable) {
	const newOnly = "-m conntrack --ctstate NEW "
	jumps := []struct {
		t            *ruleTable
		from, to     string
		extra, commt string
	}{
		{filter, "INPUT", chainExternalServices, newOnly, "kubernetes externally-visible service portals"},
		{filter, "FORWARD", chainExternalServices, newOnly, "kubernetes externally-visible service portals"},
		{filter, "INPUT", chainNodePorts, "", "kubernetes health check service ports"},
		{filter, "FORWARD", chainServices, newOnly, "kubernetes service portals"},
		{filter, "OUTPUT", chainServices, newOnly, "kubernetes service portals"},
		{filter, "FORWARD", chainForward, "", "kubernetes forwarding rules"},
		{filter, "INPUT", chainProxyFirewall, newOnly, "kubernetes load balancer firewall"},
		{filter, "OUTPUT", chainProxyFirewall, newOnly, "kubernetes load balancer firewall"},
		{filter, "FORWARD", chainProxyFirewall, newOnly, "kubernetes load balancer firewall"},
		{nat, "OUTPUT", chainServices, "", "kubernetes service portals"},
		{nat, "PREROUTING", chainServices, "", "kubernetes service portals"},
		{nat, "POSTROUTING", chainPostrouting, "", "kubernetes postrouting rules"},
		{filter, "INPUT", chainKubeletFirewall, "", ""},
		{filter, "OUTPUT", chainKubeletFirewall, "", ""},
	}
	for _, j := range jumps {
		body := j.extra
		if j.commt != "" {
			body += `-m comment --comment "` + j.commt + `" `
		}
		body += "-j " + j.to
		j.t.jumps = append(j.t.jumps, rule{chain: j.from, restore: body, save: body})
	}
}

// portRules writes the rules of one service port.
type portRules struct {
	nw           familyNet
	opts         *Options
	clusterCIDR  netip.Prefix // of this family; invalid when none
	largeCluster bool
	// localhostNodePorts is the proxier's localhostNodePorts after
	// NewProxier's checks: IPv4, not turned off, and --nodeport-addresses
	// containing an IPv4 loopback address.
	localhostNodePorts bool
}

// write writes one service port's rules in the order of syncProxyRules'
// loop body: the filter and nat captures of the ClusterIP, the external
// IPs, the load-balancer IPs, the NodePort and the health check node port;
// then the masquerade rule of the internal chain, the KUBE-EXT and KUBE-FW
// chains (external.go), the KUBE-SVC and KUBE-SVL chains, and one KUBE-SEP
// chain per endpoint either of them uses.
func (b *portRules) write(filter, nat *ruleTable, p *service.Port) {
	s := setsOf(p)
	name := p.Name.String()
	proto := protoName(p.Protocol)

	// 1. Capture the ClusterIP, or refuse traffic to it in the filter
	// table: REJECT without endpoints, DROP when the Local policy finds
	// none on this node.
	if s.hasInternal {
		b.dstRule(nat, chainServices, `"`+name+` cluster IP"`, proto, p.ClusterIP, p.Port, s.internalChain)
	} else if !s.hasEndpoints {
		b.dstRule(filter, chainServices, `"`+name+` has no endpoints"`, proto, p.ClusterIP, p.Port, "REJECT")
	} else {
		b.dstRule(filter, chainServices, `"`+name+` has no local endpoints"`, proto, p.ClusterIP, p.Port, "DROP")
	}

	// 2. Capture the external destinations (external.go).
	if s.external {
		b.writeExternalCaptures(filter, nat, p, &s)
	}

	// 3. Masquerade off-cluster traffic to the ClusterIP.
	if s.hasInternal && (b.opts.MasqueradeAll || b.clusterCIDR.IsValid()) {
		ip := p.ClusterIP.String()
		ipSave := ip + "/" + strconv.Itoa(b.nw.hostBits)
		dport := strconv.Itoa(int(p.Port))
		clusterComment := `"` + name + ` cluster IP"`
		notSrc, notSrcSave := "", ""
		if !b.opts.MasqueradeAll {
			notSrc = " ! -s " + b.clusterCIDR.String()
			notSrcSave = "! -s " + b.clusterCIDR.String() + " "
		}
		nat.add(s.internalChain,
			fmt.Sprintf("-m comment --comment %s -m %s -p %s -d %s --dport %s%s -j %s", clusterComment, proto, proto, ip, dport, notSrc, chainMarkMasq),
			fmt.Sprintf("%s-d %s -p %s -m comment --comment %s -m %s --dport %s -j %s", notSrcSave, ipSave, proto, saveString(name+" cluster IP"), proto, dport, chainMarkMasq))
	}

	// 4. The external destination and firewall chains (external.go).
	if s.usesExternalChain {
		b.writeExternalChain(nat, p, &s)
	}
	if s.usesFirewallChain {
		b.writeFirewallChain(nat, p, &s)
	}

	// 5. The policy chains (writeServiceToEndpointRules): affinity checks
	// first, then the cascade.
	if s.usesClusterChain {
		b.writeServiceChain(nat, p, s.clusterChain, s.clusterKeys)
	}
	if s.usesLocalChain {
		b.writeServiceChain(nat, p, s.localChain, s.localKeys)
	}

	// 6. One chain per endpoint the policy chains use (kube-proxy's
	// allLocallyReachableEndpoints): masquerade hairpin traffic, remember
	// the client for affinity, DNAT.
	for _, e := range s.reachable {
		b.writeEndpointChain(nat, p, e)
	}
}

// portSets are the endpoint sets and chains of one service port, as
// syncProxyRules derives them from CategorizeEndpoints and the port's
// traffic policies (pkg/proxy/iptables/proxier.go; UsesClusterEndpoints
// and UsesLocalEndpoints in pkg/proxy/serviceport.go).
type portSets struct {
	// external is the port's ExternallyAccessible: it has a NodePort,
	// an external IP or a load-balancer IP of this family.
	external bool
	// hasEndpoints: usable endpoints anywhere; hasInternal: for
	// ClusterIP traffic; hasExternal: for external traffic from elsewhere.
	hasEndpoints, hasInternal, hasExternal bool

	clusterChain, localChain string
	// internalChain is the ClusterIP's target; externalPolicyChain is the
	// target of the KUBE-EXT chain's last rule.
	internalChain, externalPolicyChain string

	clusterKeys, localKeys               []string
	usesClusterChain, usesLocalChain     bool
	usesExternalChain, usesFirewallChain bool
	// reachable are the endpoints of the chains in use, each once, in key
	// order.
	reachable []keyedEndpoint
}

type keyedEndpoint struct {
	key  string
	addr netip.Addr
}

func setsOf(p *service.Port) portSets {
	s := portSets{
		external:     p.ExternalVerdict != service.NotService,
		hasInternal:  p.Verdict == service.Forward && len(p.EndpointKeys) > 0,
		clusterChain: ServiceChain(p.Name, p.Protocol),
		localChain:   LocalServiceChain(p.Name, p.Protocol),
	}
	s.hasEndpoints = s.hasInternal || p.Verdict == service.NoLocalEndpoints
	s.hasExternal = p.ExternalVerdict == service.Forward && len(p.ExternalEndpointKeys) > 0
	s.internalChain, s.externalPolicyChain = s.clusterChain, s.clusterChain
	if p.InternalTrafficPolicyLocal {
		s.internalChain = s.localChain
	}
	if p.ExternalPolicyLocal {
		s.externalPolicyChain = s.localChain
	}

	// The cluster set is used by Cluster internal policy and, for any
	// externally accessible port, by the KUBE-EXT chain (directly, or for
	// the short-circuit of local traffic); the local set by Local internal
	// policy, and by Local external policy on such a port.
	var clusterEps, localEps []service.Endpoint
	switch {
	case s.external:
		clusterEps, s.clusterKeys = p.ClusterEndpoints, p.ClusterEndpointKeys
	case !p.InternalTrafficPolicyLocal:
		clusterEps, s.clusterKeys = p.Endpoints, p.EndpointKeys
	}
	switch {
	case p.InternalTrafficPolicyLocal:
		localEps, s.localKeys = p.Endpoints, p.EndpointKeys
	case p.ExternalPolicyLocal && s.external:
		localEps, s.localKeys = p.ExternalEndpoints, p.ExternalEndpointKeys
	}
	s.usesClusterChain = len(s.clusterKeys) > 0
	s.usesLocalChain = len(s.localKeys) > 0
	s.usesExternalChain = s.hasEndpoints && s.external
	s.usesFirewallChain = s.hasEndpoints && len(p.LoadBalancerIPs) > 0 && len(p.SourceRanges) > 0

	for i, k := range s.clusterKeys {
		s.reachable = append(s.reachable, keyedEndpoint{k, clusterEps[i].Addr.Addr()})
	}
	for i, k := range s.localKeys {
		if !slices.Contains(s.clusterKeys, k) {
			s.reachable = append(s.reachable, keyedEndpoint{k, localEps[i].Addr.Addr()})
		}
	}
	if len(s.clusterKeys) > 0 && len(s.localKeys) > 0 {
		slices.SortFunc(s.reachable, func(a, b keyedEndpoint) int { return strings.Compare(a.key, b.key) })
	}
	return s
}

// writeServiceChain declares a KUBE-SVC or KUBE-SVL chain and writes its
// rules (writeServiceToEndpointRules): the affinity checks, then the
// statistic cascade over keys.
func (b *portRules) writeServiceChain(nat *ruleTable, p *service.Port, chain string, keys []string) {
	name := p.Name.String()
	nat.declare(chain)
	sepChains := make([]string, len(keys))
	for i, key := range keys {
		sepChains[i] = EndpointChain(p.Name, p.Protocol, key)
	}
	if p.Affinity.ClientIP {
		seconds := strconv.Itoa(int(p.Affinity.Timeout.Seconds()))
		for i, key := range keys {
			c, cs := b.comment(`"` + name + " -> " + key + `"`)
			sep := sepChains[i]
			nat.add(chain,
				c+"-m recent --name "+sep+" --rcheck --seconds "+seconds+" --reap -j "+sep,
				cs+"-m recent --rcheck --seconds "+seconds+" --reap --name "+sep+" --mask "+b.nw.recentMask+" --rsource -j "+sep)
		}
	}
	n := len(keys)
	for i, key := range keys {
		c, cs := b.comment(`"` + name + " -> " + key + `"`)
		stat, statSave := "", ""
		if i < n-1 {
			stat = "-m statistic --mode random --probability " + balancer.ProbabilityString(n-i) + " "
			statSave = "-m statistic --mode random --probability " + savedProbability(n-i) + " "
		}
		nat.add(chain, c+stat+"-j "+sepChains[i], cs+statSave+"-j "+sepChains[i])
	}
}

// writeEndpointChain declares one KUBE-SEP chain and writes its two rules.
func (b *portRules) writeEndpointChain(nat *ruleTable, p *service.Port, e keyedEndpoint) {
	proto := protoName(p.Protocol)
	sep := EndpointChain(p.Name, p.Protocol, e.key)
	nat.declare(sep)
	epIP := e.addr.String()
	c, cs := b.comment(p.Name.String())
	nat.add(sep,
		c+"-s "+epIP+" -j "+chainMarkMasq,
		"-s "+epIP+"/"+strconv.Itoa(b.nw.hostBits)+" "+cs+"-j "+chainMarkMasq)
	recent, recentSave := "", ""
	if p.Affinity.ClientIP {
		recent = "-m recent --name " + sep + " --set "
		recentSave = "-m recent --set --name " + sep + " --mask " + b.nw.recentMask + " --rsource "
	}
	nat.add(sep,
		c+recent+"-m "+proto+" -p "+proto+" -j DNAT --to-destination "+e.key,
		"-p "+proto+" "+cs+recentSave+"-m "+proto+" -j DNAT --to-destination "+e.key)
}

// dstRule writes a rule of the shape kube-proxy uses for every capture of
// a service address: comment, protocol, destination ip, destination port,
// target. comment is as kube-proxy writes it (quoted when it has spaces).
func (b *portRules) dstRule(rt *ruleTable, chain, comment, proto string, ip netip.Addr, port uint16, target string) {
	dport := strconv.Itoa(int(port))
	a := ip.String()
	rt.add(chain,
		fmt.Sprintf("-m comment --comment %s -m %s -p %s -d %s --dport %s -j %s", comment, proto, proto, a, dport, target),
		fmt.Sprintf("-d %s/%d -p %s -m comment --comment %s -m %s --dport %s -j %s",
			a, b.nw.hostBits, proto, saveString(strings.Trim(comment, `"`)), proto, dport, b.savedTarget(target)))
}

// savedTarget is a filter target as iptables-save prints it: REJECT with
// its default --reject-with.
func (b *portRules) savedTarget(target string) string {
	if target == "REJECT" {
		return target + " --reject-with " + b.nw.rejectWith
	}
	return target
}

// comment returns the comment match of a KUBE-SVC or KUBE-SEP rule in both
// spellings, with a trailing space: kube-proxy's appendServiceCommentLocked,
// which leaves it out in large clusters. c is as kube-proxy writes it
// (quoted by the caller when it has spaces).
func (b *portRules) comment(c string) (restore, save string) {
	if b.largeCluster {
		return "", ""
	}
	return "-m comment --comment " + c + " ", "-m comment --comment" + saveStringSpaced(strings.Trim(c, `"`)) + " "
}

// savedProbability is how iptables-save prints the probability 1/k after
// iptables stored it: libxt_statistic.c prints the 31-bit threshold over
// 2^31 with "%.11f".
func savedProbability(k int) string {
	return strconv.FormatFloat(float64(balancer.Threshold(k))/(1<<31), 'f', 11, 64)
}

// saveString quotes s as libxtables' xtables_save_string does: bare when it
// is made only of letters, digits, underscores and dashes, else in double
// quotes, with double quotes, backslashes and single quotes escaped by a
// backslash.
func saveString(s string) string {
	return strings.TrimPrefix(saveStringSpaced(s), " ")
}

func saveStringSpaced(s string) string {
	bare := s != ""
	for _, r := range s {
		if !(r == '_' || r == '-' || (r >= '0' && r <= '9') || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z')) {
			bare = false
			break
		}
	}
	if bare {
		return " " + s
	}
	var sb strings.Builder
	sb.WriteString(` "`)
	for _, r := range s {
		if r == '"' || r == '\\' || r == '\'' {
			sb.WriteByte('\\')
		}
		sb.WriteRune(r)
	}
	sb.WriteByte('"')
	return sb.String()
}

// writeRestore prints the family as kube-proxy's iptables-restore input:
// filter then nat, each with its chain lines then its rules, in the order
// the proxier writes them; jump rules, when asked for, as -I lines.
func (fr *familyRules) writeRestore(w *bufio.Writer) {
	nw := netOf(fr.family)
	fmt.Fprintf(w, "# %s input that kube-proxy's iptables proxier writes (%s), by userproxy\n", nw.restoreCmd, fr.family)
	for _, rt := range []*ruleTable{&fr.filter, &fr.nat} {
		w.WriteString("*" + rt.name + "\n")
		for _, c := range rt.chains {
			w.WriteString(":" + c + " - [0:0]\n")
		}
		for _, r := range rt.rules {
			w.WriteString("-A " + r.chain + " " + r.restore + "\n")
		}
		for _, r := range rt.jumps {
			w.WriteString("-I " + r.chain + " " + r.restore + "\n")
		}
		w.WriteString("COMMIT\n")
	}
}

// writeSave prints the family as iptables-save prints it: per table, the
// built-in chains with policy ACCEPT, then the user chains sorted by name,
// then every chain's rules in that chain order.
func (fr *familyRules) writeSave(w *bufio.Writer) {
	nw := netOf(fr.family)
	for _, rt := range []*ruleTable{&fr.filter, &fr.nat} {
		fmt.Fprintf(w, "# Generated by userproxy as %s would print kube-proxy's rules (%s)\n", nw.saveCmd, fr.family)
		w.WriteString("*" + rt.name + "\n")
		user := slices.Clone(rt.chains)
		slices.Sort(user)
		user = slices.Compact(user)
		for _, c := range rt.builtin {
			w.WriteString(":" + c + " ACCEPT [0:0]\n")
		}
		for _, c := range user {
			w.WriteString(":" + c + " - [0:0]\n")
		}
		byChain := make(map[string][]string, len(user)+len(rt.builtin))
		// Prepended jumps: the last one prepended comes first.
		for i := len(rt.jumps) - 1; i >= 0; i-- {
			byChain[rt.jumps[i].chain] = append(byChain[rt.jumps[i].chain], rt.jumps[i].save)
		}
		for _, r := range rt.rules {
			byChain[r.chain] = append(byChain[r.chain], r.save)
		}
		for _, c := range slices.Concat(rt.builtin, user) {
			for _, body := range byChain[c] {
				w.WriteString("-A " + c + " " + body + "\n")
			}
		}
		w.WriteString("COMMIT\n")
	}
}

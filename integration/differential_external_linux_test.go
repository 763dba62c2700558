//go:build linux

package integration

// The kernel differential suite for external traffic (issue 16): NodePorts,
// externalIPs and LB IPs, sent by a client outside the node (XK, XU in the
// diagram of differential_topology_linux_test.go) and by the node itself,
// through kube-proxy's rules in K and userproxy in U. The kernel side is
// what pkg/proxy/iptables/proxier.go's syncProxyRules writes for them:
// KUBE-SERVICES' captures of the external IPs and LB IPs and its last rule
// to KUBE-NODEPORTS (the --nodeport-addresses match), KUBE-EXT-* (masquerade
// under Cluster policy; under Local the short-circuit of LOCAL sources to
// the cluster chain), KUBE-FW-* with KUBE-PROXY-FIREWALL's DROP, and
// KUBE-EXTERNAL-SERVICES' REJECT and DROP.
//
//  1. A NodePort from outside, split over 3 endpoints.
//  2. externalTrafficPolicy Cluster and Local from outside; Local without a
//     local endpoint.
//  3. externalIPs and LB IPs from the node itself, and the short-circuit
//     of a Local service's external destinations for the node's own
//     traffic.
//  4. loadBalancerSourceRanges.
//  5. No endpoints.

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/userproxy/userproxy/proxy"
)

const (
	// extSplitConns is how many connections each path makes to the
	// NodePort of scenario 1.
	extSplitConns = 1200
	// extPolicyConns is how many connections each path makes per
	// destination in scenarios 2 and 3: an endpoint of four missing from a
	// uniform split has a chance of 4*(3/4)^300, ~1e-37, and a 2:1 split
	// of two endpoints fails the uniform test at p ~1e-8.
	extPolicyConns = 300
	// extPolicyAlpha is the significance level of each of the 27
	// chi-square checks of scenarios 2 and 3 (9 destinations x 3 checks):
	// about 0.03% in all that some check fails by chance, beside the
	// 0.01% of scenario 1's nine checks at splitAlpha.
	extPolicyAlpha = 1e-5
	// extDropWait is how long a dial waits before it counts as dropped.
	extDropWait = 2 * time.Second
)

// The Services of TestDifferentialExternal. Endpoints 0 and 1 are on this
// node (diffNode), 2 and 3 on diffOtherNode where a Service has both.
var (
	extSplit   = diffService{name: "np", clusterIP: "10.96.6.1", nodePort: 30080, endpoints: firstBackends(3)}
	extCluster = diffService{name: "cluster", clusterIP: "10.96.6.2", nodePort: 30081,
		lbIPs: []netip.Addr{diffExtVIP(1)}, externalIPs: []netip.Addr{diffExtVIP(11)},
		endpoints: firstBackends(2), otherNode: []netip.Addr{diffBackend(2), diffBackend(3)}}
	extLocal = diffService{name: "local", clusterIP: "10.96.6.3", nodePort: 30082, extLocal: true,
		lbIPs: []netip.Addr{diffExtVIP(2)}, externalIPs: []netip.Addr{diffExtVIP(12)},
		endpoints: firstBackends(2), otherNode: []netip.Addr{diffBackend(2), diffBackend(3)}}
	extLocalNone = diffService{name: "localnone", clusterIP: "10.96.6.4", nodePort: 30083, extLocal: true,
		lbIPs: []netip.Addr{diffExtVIP(3)}, otherNode: firstBackends(2)}
	extRanged = diffService{name: "ranged", clusterIP: "10.96.6.5", nodePort: 30084,
		lbIPs: []netip.Addr{diffExtVIP(4)}, ranges: []netip.Prefix{netip.PrefixFrom(diffExtClient, 32)},
		endpoints: firstBackends(2)}
	extNone = diffService{name: "none", clusterIP: "10.96.6.6", nodePort: 30085,
		lbIPs: []netip.Addr{diffExtVIP(5)}, externalIPs: []netip.Addr{diffExtVIP(15)}}
)

// diffExtVIP returns 198.51.100.(192+i), an external IP or LB IP.
func diffExtVIP(i int) netip.Addr {
	a := diffExtVIPs.Addr().As4()
	a[3] += byte(i)
	return netip.AddrFrom4(a)
}

// extPaths returns the external clients, the kernel's first.
func (tp *diffTopo) extPaths() []*diffPath { return []*diffPath{tp.extKernel, tp.extOurs} }

// nodePortAddr is the node IP with a NodePort.
func nodePortAddr(s diffService) string {
	return netip.AddrPortFrom(diffNodeIP, uint16(s.nodePort)).String()
}

// vipAddr is an external IP or LB IP with the service port.
func vipAddr(a netip.Addr) string { return netip.AddrPortFrom(a, 80).String() }

// attempt dials addr from src and, when the dial succeeds, reads to the
// end: how the client saw the connection end — "answered by ENDPOINT",
// ECONNREFUSED (an ICMP port unreachable), timeout (the SYN dropped), or
// ECONNRESET: a RST after the handshake, which the client's connect reports
// when the RST beats the dialer's check of the socket (as in every run so
// far), and the first read otherwise.
func (p *diffPath) attempt(src netip.Addr, addr string) string {
	c, err := p.dial(src, addr, extDropWait)
	if errors.Is(err, syscall.ECONNRESET) {
		return "ECONNRESET"
	}
	if err != nil {
		return dialOutcome(nil, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(extDropWait))
	b, err := io.ReadAll(c)
	switch {
	case errors.Is(err, syscall.ECONNRESET):
		return "ECONNRESET"
	case err != nil:
		return "connected, then " + err.Error()
	case len(b) == 0:
		return "connected, then EOF"
	}
	return "answered by " + string(b)
}

// attempts runs attempt on both paths (p[0] the kernel's, p[1] ours).
func attempts(p []*diffPath, src netip.Addr, addr string) [2]string {
	return [2]string{p[0].attempt(src, addr), p[1].attempt(src, addr)}
}

// kernelRule is the packet counter of K's rules in chain (a prefix) of
// table whose text has every one of parts.
func (tp *diffTopo) kernelRule(table, chain string, parts ...string) int {
	return ruleCounter(tp.iptablesSave(table), chain, parts...)
}

// oursFlows is userproxy_flows_total{protocol="tcp",result=r} now.
func (tp *diffTopo) oursFlows(r proxy.Result) int { return flowsCounter(tp.metrics(), r) }

// failedOn says, for a split that failed on path p, what userproxy counted:
// its TCP flow results other than zero, which tell a refusal's reason (no
// route, the in-flight limit, a failed dial) when its log at info does not.
func (tp *diffTopo) failedOn(p *diffPath) string {
	if p != tp.ours && p != tp.extOurs {
		return ""
	}
	var seen []string
	for _, line := range strings.Split(tp.metrics(), "\n") {
		if strings.HasPrefix(line, `userproxy_flows_total{protocol="tcp"`) && !strings.HasSuffix(line, " 0") {
			seen = append(seen, line)
		}
	}
	return "; userproxy counted: " + strings.Join(seen, ", ")
}

// TestDifferentialExternal runs scenarios 1-5 of this file on one topology
// with external clients; each logs "kernel: ... | userproxy: ...".
func TestDifferentialExternal(t *testing.T) {
	tp := newDiffTopoWith(t, []diffService{extSplit, extCluster, extLocal, extLocalNone, extRanged, extNone},
		diffOptions{external: true})
	// The hooks `--jump-rules` prints, and the --nodeport-addresses match.
	nat := tp.iptablesSave("nat")
	for _, want := range []string{
		`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
		`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`,
		"-A KUBE-SERVICES -d " + diffNodeIP.String() + "/32 ",
	} {
		if !strings.Contains(nat, want) {
			t.Fatalf("K's nat table lacks %q:\n%s", want, nat)
		}
	}
	t.Logf("randomness: the kernel's get_random_u32 (xt_statistic) and userproxy's runtime ChaCha8 source; neither is seedable, so the counts are logged")

	t.Run("1_nodeport_split", func(t *testing.T) { tp.nodePortSplit(t) })
	t.Run("2_traffic_policy", func(t *testing.T) { tp.trafficPolicy(t) })
	t.Run("2_local_without_local_endpoint", func(t *testing.T) { tp.localWithoutLocal(t) })
	t.Run("3_from_this_host", func(t *testing.T) { tp.fromThisHost(t) })
	t.Run("4_source_ranges", func(t *testing.T) { tp.sourceRanges(t) })
	t.Run("5_no_endpoints", func(t *testing.T) { tp.noEndpoints(t) })
}

// Scenario 1: extSplitConns connections from the external client to
// NODE_IP:30080 on each path; both splits over the 3 endpoints uniform and
// not told apart (compareSplits). The kernel's flows are masqueraded
// (KUBE-EXT's mark, KUBE-POSTROUTING's MASQUERADE): its counter shows each
// connection's first packet.
func (tp *diffTopo) nodePortSplit(t *testing.T) {
	addr := nodePortAddr(extSplit)
	probes := tp.natProbes(t, "PREROUTING", diffExtClient, addr)
	masq0 := tp.kernelRule("nat", "KUBE-POSTROUTING", "-j MASQUERADE")
	var counts [2][]int
	for i, p := range tp.extPaths() {
		start := time.Now()
		c, err := p.split(diffExtClient, addr, len(extSplit.endpoints), extSplitConns)
		if err != nil {
			t.Fatalf("%s: %s from %s: %v (counts so far %v)%s", p.name, addr, diffExtClient, err, c, tp.failedOn(p))
		}
		counts[i] = c
		t.Logf("%s: %d connections to NodePort %s in %v", p.name, extSplitConns, addr, time.Since(start).Round(time.Millisecond))
	}
	masq := tp.kernelRule("nat", "KUBE-POSTROUTING", "-j MASQUERADE") - masq0
	// Cluster policy masquerades external traffic.
	seen := probes.expect(t, "KUBE-POSTROUTING's MASQUERADE", masq, extSplitConns, true)
	v, err := compareSplits(counts[0], counts[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NodePort %s from %s, 3 endpoints: kernel: %v %v (masqueraded %d; %s) | userproxy: %v %v | two-sample %v",
		addr, diffExtClient, counts[0], v.kernel, masq, seen, counts[1], v.ours, v.between)
	if !v.ok() {
		t.Errorf("%v", v.failures)
	}
}

// Scenario 2: the Cluster and the Local service, each through its NodePort
// and its LB IP, from the external client. Cluster reaches all four
// endpoints, uniformly; Local only the two on this node, uniformly, on both
// paths.
func (tp *diffTopo) trafficPolicy(t *testing.T) {
	for _, tc := range []struct {
		svc  diffService
		via  string
		addr string
	}{
		{extCluster, "NodePort", nodePortAddr(extCluster)},
		{extCluster, "LB IP", vipAddr(extCluster.lbIPs[0])},
		{extLocal, "NodePort", nodePortAddr(extLocal)},
		{extLocal, "LB IP", vipAddr(extLocal.lbIPs[0])},
	} {
		var counts [2][]int
		probes := tp.natProbes(t, "PREROUTING", diffExtClient, tc.addr)
		masq0 := tp.kernelRule("nat", "KUBE-POSTROUTING", "-j MASQUERADE")
		for i, p := range tp.extPaths() {
			c, err := p.split(diffExtClient, tc.addr, 4, extPolicyConns)
			if err != nil {
				t.Fatalf("%s: %s %s: %v (counts so far %v)%s", p.name, tc.svc.name, tc.addr, err, c, tp.failedOn(p))
			}
			counts[i] = c
		}
		masq := tp.kernelRule("nat", "KUBE-POSTROUTING", "-j MASQUERADE") - masq0
		// The kernel masquerades under Cluster policy only: under Local
		// the endpoint sees the client's address (KUBE-EXT marks nothing
		// for a source that is not LOCAL).
		seen := probes.expect(t, tc.svc.name+" via "+tc.via+": KUBE-POSTROUTING's MASQUERADE", masq, extPolicyConns, !tc.svc.extLocal)
		// The endpoints the policy allows: the first two under Local.
		allowed := 4
		if tc.svc.extLocal {
			allowed = 2
		}
		v, err := compareSplitsAt(counts[0][:allowed], counts[1][:allowed], extPolicyAlpha)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s (externalTrafficPolicy %s) via %s %s from %s, endpoints %s: kernel: %v %v (masqueraded %d; %s) | userproxy: %v %v (dialled from %s) | two-sample %v",
			tc.svc.name, policyName(tc.svc), tc.via, tc.addr, diffExtClient, endpointNodes(tc.svc), counts[0], v.kernel, masq, seen, counts[1], v.ours, diffOursAddr, v.between)
		if !v.ok() {
			t.Errorf("%s via %s: %v", tc.svc.name, tc.via, v.failures)
		}
		for i, p := range tp.extPaths() {
			for ep := allowed; ep < 4; ep++ {
				if counts[i][ep] != 0 {
					t.Errorf("%s: %s via %s reached %s, on %s, %d times: Local policy keeps this node's endpoints",
						p.name, tc.svc.name, tc.via, diffBackend(ep), diffOtherNode, counts[i][ep])
				}
			}
		}
	}
}

func policyName(s diffService) string {
	if s.extLocal {
		return "Local"
	}
	return "Cluster"
}

// endpointNodes describes where a service's endpoints are.
func endpointNodes(s diffService) string {
	return fmt.Sprintf("%v on %s, %v on %s", s.endpoints, diffNode, s.otherNode, diffOtherNode)
}

// Scenario 2, Local policy without an endpoint on this node: through the
// LB IP both paths drop the SYN (the kernel: KUBE-EXTERNAL-SERVICES' DROP
// in FORWARD; ours: the gate), so the client times out. Through the
// NodePort the kernel drops it too (the same chain, from INPUT, `-m
// addrtype --dst-type LOCAL`), while our host socket has completed the
// handshake before the proxy decides and resets the connection: the
// documented difference.
func (tp *diffTopo) localWithoutLocal(t *testing.T) {
	const comment = `"default/localnone:p has no local endpoints"`
	lb := extLocalNone.lbIPs[0]
	d0, o0 := tp.kernelRule("filter", "KUBE-EXTERNAL-SERVICES", comment, "-d "+lb.String()+"/32", "-j DROP"), tp.oursFlows(proxy.ResultDroppedLocalPolicy)
	got := attempts(tp.extPaths(), diffExtClient, vipAddr(lb))
	d1, o1 := tp.kernelRule("filter", "KUBE-EXTERNAL-SERVICES", comment, "-d "+lb.String()+"/32", "-j DROP"), tp.oursFlows(proxy.ResultDroppedLocalPolicy)
	t.Logf("LB IP %s of %s (Local, endpoints only on %s) from %s: kernel: %s after %v (KUBE-EXTERNAL-SERVICES DROP +%d packets) | userproxy: %s after %v (flows dropped_local_policy +%d)",
		vipAddr(lb), extLocalNone.name, diffOtherNode, diffExtClient, got[0], extDropWait, d1-d0, got[1], extDropWait, o1-o0)
	if got[0] != "timeout" || got[1] != "timeout" {
		t.Errorf("LB IP: want a timeout (DROP) on both paths")
	}
	if d1 <= d0 || o1 <= o0 {
		t.Errorf("LB IP: the drop was not counted: kernel +%d, userproxy +%d", d1-d0, o1-o0)
	}

	np := nodePortAddr(extLocalNone)
	n0, m0 := tp.kernelRule("filter", "KUBE-EXTERNAL-SERVICES", comment, "--dst-type LOCAL", fmt.Sprintf("--dport %d", extLocalNone.nodePort), "-j DROP"), tp.oursFlows(proxy.ResultDroppedLocalPolicy)
	got = attempts(tp.extPaths(), diffExtClient, np)
	n1, m1 := tp.kernelRule("filter", "KUBE-EXTERNAL-SERVICES", comment, "--dst-type LOCAL", fmt.Sprintf("--dport %d", extLocalNone.nodePort), "-j DROP"), tp.oursFlows(proxy.ResultDroppedLocalPolicy)
	t.Logf("NodePort %s of %s from %s: kernel: %s after %v (KUBE-EXTERNAL-SERVICES DROP +%d packets) | userproxy: %s (host socket; flows dropped_local_policy +%d)",
		np, extLocalNone.name, diffExtClient, got[0], extDropWait, n1-n0, got[1], m1-m0)
	if got[0] != "timeout" || n1 <= n0 {
		t.Errorf("NodePort, kernel: want a timeout, counted by the DROP rule")
	}
	if got[1] != "ECONNRESET" || m1-m0 != 1 {
		t.Errorf("NodePort, userproxy: want the documented reset after the handshake, counted once as dropped_local_policy")
	}
}

// Scenario 3: the node's own client (K, U: 192.0.2.1, one of the node's
// addresses) reaches the externalIP and the LB IP of the Cluster service,
// and those of the Local service through the short-circuit (KUBE-EXT's
// `-m addrtype --src-type LOCAL` jump to the cluster chain; ours:
// Config.LocalSource): all four endpoints on both; and the LB IP of the
// Local service without a local endpoint, whose two remote endpoints
// answer.
// Under Local policy the short-circuit rule must count every packet K's nat
// table saw from the client to the address (natProbe).
func (tp *diffTopo) fromThisHost(t *testing.T) {
	for _, tc := range []struct {
		svc  diffService
		via  string
		addr netip.Addr
		n    int // endpoints expected: the first n backends
	}{
		{extCluster, "externalIP", extCluster.externalIPs[0], 4},
		{extCluster, "LB IP", extCluster.lbIPs[0], 4},
		{extLocal, "externalIP", extLocal.externalIPs[0], 4},
		{extLocal, "LB IP", extLocal.lbIPs[0], 4},
		{extLocalNone, "LB IP", extLocalNone.lbIPs[0], 2},
	} {
		probes := tp.natProbes(t, "OUTPUT", diffClient, vipAddr(tc.addr))
		short0 := tp.kernelRule("nat", "KUBE-EXT-", `"route LOCAL traffic for default/`+tc.svc.name+`:p external destinations"`)
		var counts [2][]int
		for i, p := range tp.paths() {
			c, err := p.split(diffClient, vipAddr(tc.addr), 4, extPolicyConns)
			if err != nil {
				t.Fatalf("%s: %s %s from %s: %v (counts so far %v)", p.name, tc.svc.name, tc.via, diffClient, err, c)
			}
			counts[i] = c
		}
		short := tp.kernelRule("nat", "KUBE-EXT-", `"route LOCAL traffic for default/`+tc.svc.name+`:p external destinations"`) - short0
		v, err := compareSplitsAt(counts[0][:tc.n], counts[1][:tc.n], extPolicyAlpha)
		if err != nil {
			t.Fatal(err)
		}
		// The short-circuit exists under Local policy only.
		var seen string
		if tc.svc.extLocal {
			seen = probes.expect(t, "the short-circuit rule", short, extPolicyConns, true)
		} else {
			_, _, seen = probes.check(t, extPolicyConns)
		}
		t.Logf("%s (externalTrafficPolicy %s) via %s %s from this host (%s), endpoints %s: kernel: %v %v (short-circuit rule +%d; %s) | userproxy: %v %v | two-sample %v",
			tc.svc.name, policyName(tc.svc), tc.via, vipAddr(tc.addr), diffClient, endpointNodes(tc.svc), counts[0], v.kernel, short, seen, counts[1], v.ours, v.between)
		if !v.ok() {
			t.Errorf("%s via %s: %v", tc.svc.name, tc.via, v.failures)
		}
		for i, p := range tp.paths() {
			if extra := sum(counts[i][tc.n:]); extra != 0 {
				t.Errorf("%s: %s via %s answered by %d connections from endpoints it does not have", p.name, tc.svc.name, tc.via, extra)
			}
		}
	}
}

// natProbe is a pair of target-less rules at the head of a chain of K's
// nat table that count the TCP packets from src to dst (an address and
// port) that nat sees: SYNs, and the rest. nat rules see a packet only
// while its conntrack entry has no NAT binding (nf_nat_inet_fn): each
// connection's first SYN, a SYN that starts a second entry for the same
// connection (302 SYNs for 300 connections in one run here, with no SYN
// retransmission's second of delay), and a mid-stream packet whose entry
// is gone (nf_conntrack_tcp_loose, on by default, lets it start one:
// nf_conntrack_proto_tcp.c, tcp_new). kube-proxy's per-connection rules
// count every one of them, so their counters are checked against these
// rather than against the connections made.
type natProbe struct {
	tp       *diffTopo
	chain    string
	src, dst string
}

// natProbes adds the probes to chain (OUTPUT for this host's clients,
// PREROUTING for external ones); they are removed when t ends.
func (tp *diffTopo) natProbes(t *testing.T, chain string, src netip.Addr, dst string) natProbe {
	t.Helper()
	p := natProbe{tp, chain, src.String(), dst}
	for _, syn := range []bool{true, false} {
		p.iptables(t, "-I", syn)
		t.Cleanup(func() { p.iptables(t, "-D", syn) })
	}
	return p
}

func (p natProbe) comment(syn bool) string {
	if syn {
		return "upxtest probe syn " + p.src + " " + p.dst
	}
	return "upxtest probe other " + p.src + " " + p.dst
}

func (p natProbe) iptables(t *testing.T, op string, syn bool) {
	t.Helper()
	dst := netip.MustParseAddrPort(p.dst)
	args := []string{"netns", "exec", p.tp.kernel.nsName, "iptables", "-t", "nat", op, p.chain,
		"-s", p.src + "/32", "-d", dst.Addr().String() + "/32", "-p", "tcp", "--dport", strconv.Itoa(int(dst.Port()))}
	if !syn {
		args = append(args, "!")
	}
	args = append(args, "--syn", "-m", "comment", "--comment", p.comment(syn))
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("iptables %s of a nat probe in %s: %v: %s", op, p.tp.kernel.nsName, err, out)
	}
}

// expect checks a kube-proxy rule's count over conns connections
// through the probes (see check): the rule counted every packet nat saw
// (every) or none. It returns what nat saw, for the log.
func (p natProbe) expect(t *testing.T, rule string, counted, conns int, every bool) string {
	t.Helper()
	syns, others, seen := p.check(t, conns)
	want := 0
	if every {
		want = syns + others
	}
	if counted != want {
		t.Errorf("kernel: %s counted %d packets, want %d (%s from %s to %s)", rule, counted, want, seen, p.src, p.dst)
	}
	return seen
}

// check returns what the probes counted, after checking that nat saw each
// of conns connections' SYNs, and a second entry's SYN for at most 1% of
// them (2 in 300 in the worst run here).
func (p natProbe) check(t *testing.T, conns int) (syns, others int, seen string) {
	t.Helper()
	syns, others = p.counts()
	seen = fmt.Sprintf("nat saw %d SYNs, %d other packets", syns, others)
	if syns < conns || syns > conns+max(conns/100, 1) {
		t.Errorf("kernel: %s from %s to %s for %d connections", seen, p.src, p.dst, conns)
	}
	return syns, others, seen
}

// counts returns the SYNs and the other packets the probes counted.
func (p natProbe) counts() (syns, others int) {
	save := p.tp.iptablesSave("nat")
	return ruleCounter(save, p.chain, `"`+p.comment(true)+`"`), ruleCounter(save, p.chain, `"`+p.comment(false)+`"`)
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// Scenario 4: the LB IP of a service whose loadBalancerSourceRanges are
// 198.51.100.130/32 answers that client and drops 198.51.100.131 on both
// paths (kernel: KUBE-FW falls through, KUBE-PROXY-FIREWALL drops; ours:
// the gate); the ranges do not apply to the NodePort, which answers both.
func (tp *diffTopo) sourceRanges(t *testing.T) {
	lb := vipAddr(extRanged.lbIPs[0])
	np := nodePortAddr(extRanged)
	const fwComment = `"default/ranged:p traffic not accepted by KUBE-FW-`
	allowed := attempts(tp.extPaths(), diffExtClient, lb)
	f0, o0 := tp.kernelRule("filter", "KUBE-PROXY-FIREWALL", fwComment, "-j DROP"), tp.oursFlows(proxy.ResultDroppedSourceRange)
	refused := attempts(tp.extPaths(), diffExtOther, lb)
	f1, o1 := tp.kernelRule("filter", "KUBE-PROXY-FIREWALL", fwComment, "-j DROP"), tp.oursFlows(proxy.ResultDroppedSourceRange)
	nodePort := attempts(tp.extPaths(), diffExtOther, np)
	t.Logf("LB IP %s, loadBalancerSourceRanges %v: from %s kernel: %s | userproxy: %s; from %s kernel: %s after %v (KUBE-PROXY-FIREWALL DROP +%d packets) | userproxy: %s after %v (flows dropped_source_range +%d); NodePort %s from %s kernel: %s | userproxy: %s",
		lb, extRanged.ranges, diffExtClient, allowed[0], allowed[1], diffExtOther, refused[0], extDropWait, f1-f0, refused[1], extDropWait, o1-o0,
		np, diffExtOther, nodePort[0], nodePort[1])
	for i, p := range tp.extPaths() {
		if !answered(allowed[i]) {
			t.Errorf("%s: %s inside the ranges: %s, want an endpoint's answer", p.name, diffExtClient, allowed[i])
		}
		if refused[i] != "timeout" {
			t.Errorf("%s: %s outside the ranges: %s, want a timeout (DROP)", p.name, diffExtOther, refused[i])
		}
		if !answered(nodePort[i]) {
			t.Errorf("%s: NodePort from %s: %s, want an endpoint's answer (source ranges are for LB IPs only)", p.name, diffExtOther, nodePort[i])
		}
	}
	if f1 <= f0 || o1 <= o0 {
		t.Errorf("the drop was not counted: kernel +%d, userproxy +%d", f1-f0, o1-o0)
	}
}

func answered(outcome string) bool {
	ep, ok := strings.CutPrefix(outcome, "answered by ")
	if !ok {
		return false
	}
	_, err := netip.ParseAddr(ep)
	return err == nil
}

// Scenario 5: a service without endpoints. From outside, its LB IP and its
// externalIP are refused on both paths with an ICMP port unreachable
// (kernel: KUBE-EXTERNAL-SERVICES' REJECT in FORWARD; ours: the gate's
// REJECT), so the client sees ECONNREFUSED. Its NodePort: the kernel
// REJECTs (the same chain from INPUT) -> ECONNREFUSED; our host socket
// resets after the handshake. From this host, the kernel has no rule for
// the external destinations (KUBE-EXTERNAL-SERVICES is hooked from INPUT
// and FORWARD, not OUTPUT): the SYN leaves untranslated and, here, nothing
// answers; ours REJECTs it.
func (tp *diffTopo) noEndpoints(t *testing.T) {
	const comment = `"default/none:p has no endpoints"`
	for _, dst := range []struct {
		via, addr, match string
	}{
		{"LB IP", vipAddr(extNone.lbIPs[0]), "-d " + extNone.lbIPs[0].String() + "/32"},
		{"externalIP", vipAddr(extNone.externalIPs[0]), "-d " + extNone.externalIPs[0].String() + "/32"},
		{"NodePort", nodePortAddr(extNone), fmt.Sprintf("--dport %d", extNone.nodePort)},
	} {
		r0, o0 := tp.kernelRule("filter", "KUBE-EXTERNAL-SERVICES", comment, dst.match, "-j REJECT"), tp.oursFlows(proxy.ResultRejectedNoEndpoints)
		got := attempts(tp.extPaths(), diffExtClient, dst.addr)
		r1, o1 := tp.kernelRule("filter", "KUBE-EXTERNAL-SERVICES", comment, dst.match, "-j REJECT"), tp.oursFlows(proxy.ResultRejectedNoEndpoints)
		t.Logf("%s %s of %s (no endpoints) from %s: kernel: %s (KUBE-EXTERNAL-SERVICES REJECT +%d packets) | userproxy: %s (flows rejected_no_endpoints +%d)",
			dst.via, dst.addr, extNone.name, diffExtClient, got[0], r1-r0, got[1], o1-o0)
		want := [2]string{"ECONNREFUSED", "ECONNREFUSED"}
		if dst.via == "NodePort" {
			want[1] = "ECONNRESET" // the documented difference: a RST after the handshake
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", dst.via, got, want)
		}
		if r1-r0 != 1 || o1-o0 != 1 {
			t.Errorf("%s: the refusal was not counted once: kernel REJECT +%d, userproxy rejected_no_endpoints +%d", dst.via, r1-r0, o1-o0)
		}
	}

	for _, a := range []netip.Addr{extNone.lbIPs[0], extNone.externalIPs[0]} {
		o0 := tp.oursFlows(proxy.ResultRejectedNoEndpoints)
		got := attempts(tp.paths(), diffClient, vipAddr(a))
		o1 := tp.oursFlows(proxy.ResultRejectedNoEndpoints)
		untranslated, err := tp.kernelUntranslated(netip.AddrPortFrom(a, 80))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s of %s (no endpoints) from this host (%s): kernel: %s (no rule in OUTPUT's chains; conntrack shows it untranslated: %v) | userproxy: %s (flows rejected_no_endpoints +%d)",
			vipAddr(a), extNone.name, diffClient, got[0], untranslated, got[1], o1-o0)
		if got[0] != "timeout" || !untranslated {
			t.Errorf("kernel: want the SYN to leave untranslated and time out")
		}
		if got[1] != "ECONNREFUSED" || o1-o0 != 1 {
			t.Errorf("userproxy: want ECONNREFUSED, counted as rejected_no_endpoints")
		}
	}
}

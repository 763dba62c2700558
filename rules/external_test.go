package rules_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// Builders for the external destinations of a Service.

func nodePortType(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort }

// loadBalancer makes s a LoadBalancer with these ingress IPs.
func loadBalancer(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		for _, ip := range ips {
			s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, v1.LoadBalancerIngress{IP: ip})
		}
	}
}

func externalIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

func etpLocal(s *v1.Service) {
	s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
}

func healthCheckNodePort(port int32) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.HealthCheckNodePort = port }
}

func sourceRanges(r ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = r }
}

// withNodePort gives a service port its NodePort.
func withNodePort(sp v1.ServicePort, np int32) v1.ServicePort {
	sp.NodePort = np
	return sp
}

// rulesByChain groups the "-A" lines of out by chain, each chain's lines
// in output order, keeping only the chains in keep (all when nil).
func rulesByChain(out string, keep func(chain string) bool) map[string][]string {
	got := map[string][]string{}
	table := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "*") {
			table = l[1:]
			continue
		}
		rest, ok := strings.CutPrefix(l, "-A ")
		if !ok {
			continue
		}
		chain, _, _ := strings.Cut(rest, " ")
		if keep == nil || keep(chain) {
			got[table+" "+chain] = append(got[table+" "+chain], l)
		}
	}
	return got
}

// TestChainNamesExternal: the KUBE-EXT and KUBE-FW names in kube-proxy's
// expected output of TestOverallIPTablesRules
// (pkg/proxy/iptables/proxier_test.go).
func TestChainNamesExternal(t *testing.T) {
	pn := func(ns, name string) service.PortName {
		return service.PortName{Namespace: ns, Name: name, Port: "p80"}
	}
	for _, tt := range []struct{ got, want string }{
		{rules.ExternalChain(pn("ns2", "svc2"), service.TCP), "KUBE-EXT-GNZBNJ2PO5MGZ6GT"},
		{rules.ExternalChain(pn("ns3", "svc3"), service.TCP), "KUBE-EXT-X27LE4BHSL4DOUIK"},
		{rules.ExternalChain(pn("ns4", "svc4"), service.TCP), "KUBE-EXT-4SW47YFZTEDKD3PK"},
		{rules.ExternalChain(pn("ns5", "svc5"), service.TCP), "KUBE-EXT-NUKIZ6OKUXPJNT4C"},
		{rules.FirewallChain(pn("ns5", "svc5"), service.TCP), "KUBE-FW-NUKIZ6OKUXPJNT4C"},
	} {
		if tt.got != tt.want {
			t.Errorf("chain name %s, want %s", tt.got, tt.want)
		}
	}
}

// overallObjects are the Services and EndpointSlices of kube-proxy's
// TestOverallIPTablesRules (pkg/proxy/iptables/proxier_test.go): a
// ClusterIP service; a LoadBalancer with Local policy, an external IP and
// a health check node port whose only endpoint is on another node; a
// NodePort service; a service with an external IP and one local and one
// remote endpoint; a LoadBalancer with Cluster policy, source ranges and
// ClientIP affinity; a service without endpoints. The node is "node-a".
func overallObjects() []any {
	p80 := sport("p80", tcp, 80)
	return []any{
		svc("ns1/svc1", "172.30.0.41", ports(p80)),
		slice("ns1/svc1-1", "svc1", ipv4, "p80", tcp, 80, eps("10.180.0.1")...),
		svc("ns2/svc2", "172.30.0.42", ports(withNodePort(p80, 3001)), loadBalancer("1.2.3.4"), etpLocal,
			externalIPs("192.168.99.22"), healthCheckNodePort(30000)),
		slice("ns2/svc2-1", "svc2", ipv4, "p80", tcp, 80, eps("10.180.0.2")...),
		svc("ns3/svc3", "172.30.0.43", ports(withNodePort(p80, 3003)), nodePortType),
		slice("ns3/svc3-1", "svc3", ipv4, "p80", tcp, 80, eps("10.180.0.3")...),
		svc("ns4/svc4", "172.30.0.44", ports(p80), nodePortType, externalIPs("192.168.99.33")),
		slice("ns4/svc4-1", "svc4", ipv4, "p80", tcp, 80, ep("10.180.0.4", onNode("other")), ep("10.180.0.5", onNode("node-a"))),
		svc("ns5/svc5", "172.30.0.45", ports(withNodePort(p80, 3002)), loadBalancer("5.6.7.8"),
			healthCheckNodePort(30000), sourceRanges(" 203.0.113.0/25"), clientIP(10800)),
		slice("ns5/svc5-1", "svc5", ipv4, "p80", tcp, 80, eps("10.180.0.3")...),
		svc("ns6/svc6", "172.30.0.46", ports(p80)),
	}
}

// TestWriteKubeProxyOverall holds FormatRestore against the expected
// output of kube-proxy's TestOverallIPTablesRules, chain by chain (the
// test sorts chains; within a chain the order is the proxier's), with its
// fake proxier's settings: --cluster-cidr 10.0.0.0/8, nodeport addresses
// matching all, localhost NodePorts and the nfacct counters on.
// kube-proxy's fake has no --random-fully and a mark of 0x4000, where
// the proxier's own "%#08x" gives 0x00004000: those two chains are left
// out, and KUBE-FORWARD carries our mark.
func TestWriteKubeProxyOverall(t *testing.T) {
	tbl := table(t, overallObjects()...)
	out := writeRules(t, tbl, rules.Options{
		Format:       rules.FormatRestore,
		Family:       service.IPv4,
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		NFAcct:       true,
	})
	want := map[string][]string{
		"filter KUBE-NODEPORTS": {
			`-A KUBE-NODEPORTS -m comment --comment "ns2/svc2:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT`,
		},
		"filter KUBE-SERVICES": {
			`-A KUBE-SERVICES -m comment --comment "ns6/svc6:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.46 --dport 80 -j REJECT`,
		},
		"filter KUBE-EXTERNAL-SERVICES": {
			`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j DROP`,
			`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP`,
			`-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 3001 -j DROP`,
		},
		"filter KUBE-FIREWALL": {
			`-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`,
		},
		"filter KUBE-FORWARD": {
			`-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP`,
			`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x00004000/0x00004000 -j ACCEPT`,
			`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`,
		},
		"filter KUBE-PROXY-FIREWALL": {
			`-A KUBE-PROXY-FIREWALL -m comment --comment "ns5/svc5:p80 traffic not accepted by KUBE-FW-NUKIZ6OKUXPJNT4C" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j DROP`,
		},
		"nat KUBE-NODEPORTS": {
			`-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3001 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-GNZBNJ2PO5MGZ6GT`,
			`-A KUBE-NODEPORTS -m comment --comment ns2/svc2:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT`,
			`-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3003 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK`,
			`-A KUBE-NODEPORTS -m comment --comment ns3/svc3:p80 -m tcp -p tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK`,
			`-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp -d 127.0.0.0/8 --dport 3002 -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-EXT-NUKIZ6OKUXPJNT4C`,
			`-A KUBE-NODEPORTS -m comment --comment ns5/svc5:p80 -m tcp -p tcp --dport 3002 -j KUBE-EXT-NUKIZ6OKUXPJNT4C`,
		},
		"nat KUBE-SERVICES": {
			`-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O`,
			`-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT`,
			`-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 external IP" -m tcp -p tcp -d 192.168.99.22 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT`,
			`-A KUBE-SERVICES -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT`,
			`-A KUBE-SERVICES -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 -j KUBE-SVC-X27LE4BHSL4DOUIK`,
			`-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK`,
			`-A KUBE-SERVICES -m comment --comment "ns4/svc4:p80 external IP" -m tcp -p tcp -d 192.168.99.33 --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK`,
			`-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 -j KUBE-SVC-NUKIZ6OKUXPJNT4C`,
			`-A KUBE-SERVICES -m comment --comment "ns5/svc5:p80 loadbalancer IP" -m tcp -p tcp -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C`,
			`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
		},
		"nat KUBE-EXT-4SW47YFZTEDKD3PK": {
			`-A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ`,
			`-A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK`,
		},
		"nat KUBE-EXT-GNZBNJ2PO5MGZ6GT": {
			`-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -s 10.0.0.0/8 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT`,
			`-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ`,
			`-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT`,
		},
		"nat KUBE-EXT-NUKIZ6OKUXPJNT4C": {
			`-A KUBE-EXT-NUKIZ6OKUXPJNT4C -m comment --comment "masquerade traffic for ns5/svc5:p80 external destinations" -j KUBE-MARK-MASQ`,
			`-A KUBE-EXT-NUKIZ6OKUXPJNT4C -j KUBE-SVC-NUKIZ6OKUXPJNT4C`,
		},
		"nat KUBE-EXT-X27LE4BHSL4DOUIK": {
			`-A KUBE-EXT-X27LE4BHSL4DOUIK -m comment --comment "masquerade traffic for ns3/svc3:p80 external destinations" -j KUBE-MARK-MASQ`,
			`-A KUBE-EXT-X27LE4BHSL4DOUIK -j KUBE-SVC-X27LE4BHSL4DOUIK`,
		},
		"nat KUBE-FW-NUKIZ6OKUXPJNT4C": {
			`-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-NUKIZ6OKUXPJNT4C`,
			`-A KUBE-FW-NUKIZ6OKUXPJNT4C -m comment --comment "other traffic to ns5/svc5:p80 will be dropped by KUBE-PROXY-FIREWALL"`,
		},
		"nat KUBE-SEP-C6EBXVWJJZMIWKLZ": {
			`-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -s 10.180.0.5 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-C6EBXVWJJZMIWKLZ -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.5:80`,
		},
		"nat KUBE-SEP-I77PXRDZVX7PMWMN": {
			`-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-I77PXRDZVX7PMWMN -m comment --comment ns5/svc5:p80 -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80`,
		},
		"nat KUBE-SEP-OYPFS5VJICHGATKP": {
			`-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-OYPFS5VJICHGATKP -m comment --comment ns3/svc3:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80`,
		},
		"nat KUBE-SEP-RS4RBKLTHTF2IUXJ": {
			`-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-RS4RBKLTHTF2IUXJ -m comment --comment ns2/svc2:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80`,
		},
		"nat KUBE-SEP-SXIVWICOYRO3J4NJ": {
			`-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80`,
		},
		"nat KUBE-SEP-UKSFD7AGPMPPLUHC": {
			`-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -s 10.180.0.4 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-UKSFD7AGPMPPLUHC -m comment --comment ns4/svc4:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.4:80`,
		},
		"nat KUBE-SVC-4SW47YFZTEDKD3PK": {
			`-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp -p tcp -d 172.30.0.44 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-UKSFD7AGPMPPLUHC`,
			`-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ`,
		},
		"nat KUBE-SVC-GNZBNJ2PO5MGZ6GT": {
			`-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ`,
		},
		"nat KUBE-SVC-NUKIZ6OKUXPJNT4C": {
			`-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 cluster IP" -m tcp -p tcp -d 172.30.0.45 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -m recent --name KUBE-SEP-I77PXRDZVX7PMWMN --rcheck --seconds 10800 --reap -j KUBE-SEP-I77PXRDZVX7PMWMN`,
			`-A KUBE-SVC-NUKIZ6OKUXPJNT4C -m comment --comment "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-I77PXRDZVX7PMWMN`,
		},
		"nat KUBE-SVC-X27LE4BHSL4DOUIK": {
			`-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 cluster IP" -m tcp -p tcp -d 172.30.0.43 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-X27LE4BHSL4DOUIK -m comment --comment "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP`,
		},
		"nat KUBE-SVC-XPGD46QRK7WJZT7O": {
			`-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ`,
		},
	}
	got := rulesByChain(out, func(c string) bool { return c != "KUBE-POSTROUTING" && c != "KUBE-MARK-MASQ" })
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rules per chain (-want +got):\n%s\nfull output:\n%s", diff, out)
	}
	// kube-proxy's chain lines: no KUBE-SVL chain (svc2 has no local
	// endpoint, svc4 uses Cluster policy).
	for _, c := range []string{":KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]\n", ":KUBE-FW-NUKIZ6OKUXPJNT4C - [0:0]\n"} {
		if !strings.Contains(out, c) {
			t.Errorf("output lacks the chain line %q", c)
		}
	}
	if strings.Contains(out, "KUBE-SVL-") {
		t.Errorf("output has a KUBE-SVL chain:\n%s", out)
	}
}

// extraLines keeps the lines of Write's output that a table without
// services does not have (with the same options), and the table markers.
func extraLines(t *testing.T, tbl *service.Table, opts rules.Options) string {
	t.Helper()
	skeleton := map[string]bool{}
	for _, l := range strings.Split(writeRules(t, nil, opts), "\n") {
		skeleton[l] = !strings.HasPrefix(l, "*")
	}
	var b strings.Builder
	for _, l := range strings.Split(writeRules(t, tbl, opts), "\n") {
		if l != "" && !skeleton[l] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// TestWriteExternalGolden pins, as iptables-save prints them, the lines
// external destinations add, for the shapes of kube-proxy's own cases
// (pkg/proxy/iptables/proxier_test.go: TestOverallIPTablesRules,
// TestLoadBalancer, TestNoEndpointsReject, the externalTrafficPolicy and
// loadBalancerSourceRanges tests), with --cluster-cidr 10.0.0.0/8 on node
// "node-a".
func TestWriteExternalGolden(t *testing.T) {
	p80 := sport("p80", tcp, 80)
	cidr := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00:10::/64")}
	tests := []struct {
		name string
		objs []any
		fam  service.Family
		want string
	}{{
		name: "NodePort, Cluster policy: KUBE-NODEPORTS to KUBE-EXT, masquerade, KUBE-SVC",
		objs: []any{
			svc("ns1/np", "172.30.0.41", ports(withNodePort(p80, 30080)), nodePortType),
			slice("ns1/np-1", "np", ipv4, "p80", tcp, 8080, eps("10.180.0.1", "10.180.0.2")...),
		},
		want: wantNodePort,
	}, {
		name: "LoadBalancer, Local policy, a local and a remote endpoint: short-circuit to KUBE-SVC, the rest to KUBE-SVL",
		objs: []any{
			svc("ns1/lb", "172.30.0.41", ports(withNodePort(p80, 30080)), loadBalancer("1.2.3.4"), etpLocal, healthCheckNodePort(30000)),
			slice("ns1/lb-1", "lb", ipv4, "p80", tcp, 80, ep("10.180.0.1", onNode("node-a")), ep("10.180.0.2", onNode("other"))),
		},
		want: wantLBLocal,
	}, {
		name: "external IP of a ClusterIP service",
		objs: []any{
			svc("ns4/svc4", "172.30.0.44", ports(p80), externalIPs("192.168.99.33")),
			slice("ns4/svc4-1", "svc4", ipv4, "p80", tcp, 80, eps("10.180.0.4")...),
		},
		want: wantExternalIP,
	}, {
		name: "loadBalancerSourceRanges: KUBE-FW, and the drop in KUBE-PROXY-FIREWALL; the NodePort is not filtered",
		objs: []any{
			svc("ns1/svc1", "172.30.0.41", ports(withNodePort(p80, 3001)), loadBalancer("1.2.3.4", "5.6.7.8"),
				sourceRanges("192.168.0.0/24", " 203.0.113.0/25")),
			slice("ns1/svc1-1", "svc1", ipv4, "p80", tcp, 80, eps("10.180.0.1")...),
		},
		want: wantSourceRanges,
	}, {
		name: "no endpoints: REJECT the ClusterIP, external IP, LB IP and NodePort in the filter table",
		objs: []any{
			svc("ns1/svc1", "172.30.0.41", ports(withNodePort(p80, 3001)), loadBalancer("1.2.3.4"), externalIPs("192.168.99.11")),
		},
		want: wantNoEndpoints,
	}, {
		name: "Local policy without a local endpoint: DROP external traffic, short-circuit the host's and pods'",
		objs: []any{
			svc("ns2/svc2", "172.30.0.42", ports(withNodePort(p80, 3001)), loadBalancer("1.2.3.4"), etpLocal,
				externalIPs("192.168.99.22"), healthCheckNodePort(30000)),
			slice("ns2/svc2-1", "svc2", ipv4, "p80", tcp, 80, eps("10.180.0.2")...),
		},
		want: wantNoLocal,
	}, {
		name: "IPv6: /128, and the IPv6 source range only",
		objs: []any{
			svc("ns1/svc1", "fd00:30::41", ports(withNodePort(p80, 3001)), loadBalancer("2001:db8::1", "1.2.3.4"),
				sourceRanges("2001:db8:1::/48", "203.0.113.0/25"), externalIPs("2001:db8::99")),
			slice("ns1/svc1-1", "svc1", ipv6, "p80", tcp, 80, eps("fd00:10::1")...),
		},
		fam:  service.IPv6,
		want: wantIPv6,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fam := tt.fam
			if fam == 0 {
				fam = service.IPv4
			}
			got := extraLines(t, table(t, tt.objs...), rules.Options{Family: fam, ClusterCIDRs: cidr})
			if diff := cmp.Diff(strings.TrimPrefix(tt.want, "\n"), got); diff != "" {
				t.Errorf("lines (-want +got):\n%s", diff)
			}
		})
	}
}

// The expected lines of TestWriteExternalGolden.
const (
	// NodePort, Cluster policy.
	wantNodePort = `
*filter
*nat
:KUBE-EXT-KP4WNIAONBKYQZEC - [0:0]
:KUBE-SEP-35RQT6QX5H622WOV - [0:0]
:KUBE-SEP-WROMC6TCZSUIHVBU - [0:0]
:KUBE-SVC-KP4WNIAONBKYQZEC - [0:0]
-A KUBE-EXT-KP4WNIAONBKYQZEC -m comment --comment "masquerade traffic for ns1/np:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-KP4WNIAONBKYQZEC -j KUBE-SVC-KP4WNIAONBKYQZEC
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns1/np:p80" -m tcp --dport 30080 -j KUBE-EXT-KP4WNIAONBKYQZEC
-A KUBE-SEP-35RQT6QX5H622WOV -s 10.180.0.1/32 -m comment --comment "ns1/np:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-35RQT6QX5H622WOV -p tcp -m comment --comment "ns1/np:p80" -m tcp -j DNAT --to-destination 10.180.0.1:8080
-A KUBE-SEP-WROMC6TCZSUIHVBU -s 10.180.0.2/32 -m comment --comment "ns1/np:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-WROMC6TCZSUIHVBU -p tcp -m comment --comment "ns1/np:p80" -m tcp -j DNAT --to-destination 10.180.0.2:8080
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/np:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-KP4WNIAONBKYQZEC
-A KUBE-SVC-KP4WNIAONBKYQZEC ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/np:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-KP4WNIAONBKYQZEC -m comment --comment "ns1/np:p80 -> 10.180.0.1:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-35RQT6QX5H622WOV
-A KUBE-SVC-KP4WNIAONBKYQZEC -m comment --comment "ns1/np:p80 -> 10.180.0.2:8080" -j KUBE-SEP-WROMC6TCZSUIHVBU
`
	// LoadBalancer, Local policy, local and remote endpoints (the health check node port is accepted in the filter table).
	wantLBLocal = `
*filter
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns1/lb:p80 health check node port" -m tcp --dport 30000 -j ACCEPT
*nat
:KUBE-EXT-NLSY6DROL7JRYYAN - [0:0]
:KUBE-SEP-EDQELLBVZU3X5V76 - [0:0]
:KUBE-SEP-SYUG2TT4ZNUF7P74 - [0:0]
:KUBE-SVC-NLSY6DROL7JRYYAN - [0:0]
:KUBE-SVL-NLSY6DROL7JRYYAN - [0:0]
-A KUBE-EXT-NLSY6DROL7JRYYAN -s 10.0.0.0/8 -m comment --comment "pod traffic for ns1/lb:p80 external destinations" -j KUBE-SVC-NLSY6DROL7JRYYAN
-A KUBE-EXT-NLSY6DROL7JRYYAN -m comment --comment "masquerade LOCAL traffic for ns1/lb:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-NLSY6DROL7JRYYAN -m comment --comment "route LOCAL traffic for ns1/lb:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-NLSY6DROL7JRYYAN
-A KUBE-EXT-NLSY6DROL7JRYYAN -j KUBE-SVL-NLSY6DROL7JRYYAN
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns1/lb:p80" -m tcp --dport 30080 -j KUBE-EXT-NLSY6DROL7JRYYAN
-A KUBE-SEP-EDQELLBVZU3X5V76 -s 10.180.0.1/32 -m comment --comment "ns1/lb:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-EDQELLBVZU3X5V76 -p tcp -m comment --comment "ns1/lb:p80" -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-SYUG2TT4ZNUF7P74 -s 10.180.0.2/32 -m comment --comment "ns1/lb:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-SYUG2TT4ZNUF7P74 -p tcp -m comment --comment "ns1/lb:p80" -m tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/lb:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-NLSY6DROL7JRYYAN
-A KUBE-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns1/lb:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-NLSY6DROL7JRYYAN
-A KUBE-SVC-NLSY6DROL7JRYYAN ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/lb:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-NLSY6DROL7JRYYAN -m comment --comment "ns1/lb:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-EDQELLBVZU3X5V76
-A KUBE-SVC-NLSY6DROL7JRYYAN -m comment --comment "ns1/lb:p80 -> 10.180.0.2:80" -j KUBE-SEP-SYUG2TT4ZNUF7P74
-A KUBE-SVL-NLSY6DROL7JRYYAN -m comment --comment "ns1/lb:p80 -> 10.180.0.1:80" -j KUBE-SEP-EDQELLBVZU3X5V76
`
	// an external IP.
	wantExternalIP = `
*filter
*nat
:KUBE-EXT-4SW47YFZTEDKD3PK - [0:0]
:KUBE-SEP-UKSFD7AGPMPPLUHC - [0:0]
:KUBE-SVC-4SW47YFZTEDKD3PK - [0:0]
-A KUBE-EXT-4SW47YFZTEDKD3PK -m comment --comment "masquerade traffic for ns4/svc4:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-4SW47YFZTEDKD3PK -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SEP-UKSFD7AGPMPPLUHC -s 10.180.0.4/32 -m comment --comment "ns4/svc4:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-UKSFD7AGPMPPLUHC -p tcp -m comment --comment "ns4/svc4:p80" -m tcp -j DNAT --to-destination 10.180.0.4:80
-A KUBE-SERVICES -d 172.30.0.44/32 -p tcp -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-4SW47YFZTEDKD3PK
-A KUBE-SERVICES -d 192.168.99.33/32 -p tcp -m comment --comment "ns4/svc4:p80 external IP" -m tcp --dport 80 -j KUBE-EXT-4SW47YFZTEDKD3PK
-A KUBE-SVC-4SW47YFZTEDKD3PK ! -s 10.0.0.0/8 -d 172.30.0.44/32 -p tcp -m comment --comment "ns4/svc4:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-4SW47YFZTEDKD3PK -m comment --comment "ns4/svc4:p80 -> 10.180.0.4:80" -j KUBE-SEP-UKSFD7AGPMPPLUHC
`
	// loadBalancerSourceRanges (TestLoadBalancer).
	wantSourceRanges = `
*filter
-A KUBE-PROXY-FIREWALL -d 1.2.3.4/32 -p tcp -m comment --comment "ns1/svc1:p80 traffic not accepted by KUBE-FW-XPGD46QRK7WJZT7O" -m tcp --dport 80 -j DROP
-A KUBE-PROXY-FIREWALL -d 5.6.7.8/32 -p tcp -m comment --comment "ns1/svc1:p80 traffic not accepted by KUBE-FW-XPGD46QRK7WJZT7O" -m tcp --dport 80 -j DROP
*nat
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
:KUBE-FW-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-FW-XPGD46QRK7WJZT7O -s 192.168.0.0/24 -m comment --comment "ns1/svc1:p80 loadbalancer IP" -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-FW-XPGD46QRK7WJZT7O -s 203.0.113.0/25 -m comment --comment "ns1/svc1:p80 loadbalancer IP" -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "other traffic to ns1/svc1:p80 will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns1/svc1:p80" -m tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -d 5.6.7.8/32 -p tcp -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
`
	// no endpoints (TestNoEndpointsReject).
	wantNoEndpoints = `
*filter
-A KUBE-EXTERNAL-SERVICES -d 192.168.99.11/32 -p tcp -m comment --comment "ns1/svc1:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns1/svc1:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns1/svc1:p80 has no endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 3001 -j REJECT --reject-with icmp-port-unreachable
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
*nat
`
	// Local policy, no local endpoint (svc2 of TestOverallIPTablesRules).
	wantNoLocal = `
*filter
-A KUBE-EXTERNAL-SERVICES -d 192.168.99.22/32 -p tcp -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns2/svc2:p80 has no local endpoints" -m tcp --dport 80 -j DROP
-A KUBE-EXTERNAL-SERVICES -p tcp -m comment --comment "ns2/svc2:p80 has no local endpoints" -m addrtype --dst-type LOCAL -m tcp --dport 3001 -j DROP
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns2/svc2:p80 health check node port" -m tcp --dport 30000 -j ACCEPT
*nat
:KUBE-EXT-GNZBNJ2PO5MGZ6GT - [0:0]
:KUBE-SEP-RS4RBKLTHTF2IUXJ - [0:0]
:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -s 10.0.0.0/8 -m comment --comment "pod traffic for ns2/svc2:p80 external destinations" -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "masquerade LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ
-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -m comment --comment "route LOCAL traffic for ns2/svc2:p80 external destinations" -m addrtype --src-type LOCAL -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns2/svc2:p80" -m tcp --dport 3001 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -s 10.180.0.2/32 -m comment --comment "ns2/svc2:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-RS4RBKLTHTF2IUXJ -p tcp -m comment --comment "ns2/svc2:p80" -m tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SERVICES -d 172.30.0.42/32 -p tcp -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -d 192.168.99.22/32 -p tcp -m comment --comment "ns2/svc2:p80 external IP" -m tcp --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SERVICES -d 1.2.3.4/32 -p tcp -m comment --comment "ns2/svc2:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT ! -s 10.0.0.0/8 -d 172.30.0.42/32 -p tcp -m comment --comment "ns2/svc2:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-GNZBNJ2PO5MGZ6GT -m comment --comment "ns2/svc2:p80 -> 10.180.0.2:80" -j KUBE-SEP-RS4RBKLTHTF2IUXJ
`
	// IPv6.
	wantIPv6 = `
*filter
-A KUBE-PROXY-FIREWALL -d 2001:db8::1/128 -p tcp -m comment --comment "ns1/svc1:p80 traffic not accepted by KUBE-FW-XPGD46QRK7WJZT7O" -m tcp --dport 80 -j DROP
*nat
:KUBE-EXT-XPGD46QRK7WJZT7O - [0:0]
:KUBE-FW-XPGD46QRK7WJZT7O - [0:0]
:KUBE-SEP-RT5VHSJR44ZNF7G5 - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-EXT-XPGD46QRK7WJZT7O -m comment --comment "masquerade traffic for ns1/svc1:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-XPGD46QRK7WJZT7O -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-FW-XPGD46QRK7WJZT7O -s 2001:db8:1::/48 -m comment --comment "ns1/svc1:p80 loadbalancer IP" -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-FW-XPGD46QRK7WJZT7O -m comment --comment "other traffic to ns1/svc1:p80 will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-NODEPORTS -p tcp -m comment --comment "ns1/svc1:p80" -m tcp --dport 3001 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-SEP-RT5VHSJR44ZNF7G5 -s fd00:10::1/128 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-RT5VHSJR44ZNF7G5 -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination [fd00:10::1]:80
-A KUBE-SERVICES -d fd00:30::41/128 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -d 2001:db8::99/128 -p tcp -m comment --comment "ns1/svc1:p80 external IP" -m tcp --dport 80 -j KUBE-EXT-XPGD46QRK7WJZT7O
-A KUBE-SERVICES -d 2001:db8::1/128 -p tcp -m comment --comment "ns1/svc1:p80 loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O ! -s fd00:10::/64 -d fd00:30::41/128 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> [fd00:10::1]:80" -j KUBE-SEP-RT5VHSJR44ZNF7G5
`
)

// TestWriteNodePortAddresses: the KUBE-SERVICES tail and the localhost
// NodePort rules for the cases of --nodeport-addresses
// (pkg/proxy/iptables/proxier.go syncProxyRules and NewProxier;
// pkg/proxy/util/nodeport_addresses.go).
func TestWriteNodePortAddresses(t *testing.T) {
	tbl := table(t,
		svc("ns3/svc3", "172.30.0.43,fd00:30::43", ports(withNodePort(sport("p80", tcp, 80), 3003)), nodePortType),
		slice("ns3/svc3-1", "svc3", ipv4, "p80", tcp, 80, eps("10.180.0.3")...),
		slice("ns3/svc3-2", "svc3", ipv6, "p80", tcp, 80, eps("fd00:10::3")...),
	)
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range s {
			out = append(out, netip.MustParsePrefix(p))
		}
		return out
	}
	local := []netip.Addr{
		netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("10.1.0.7"),
		netip.MustParseAddr("::1"), netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("fe80::1%eth0"),
	}
	const (
		tail       = `-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"`
		martian    = "-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8"
		npRule     = `-A KUBE-NODEPORTS -p tcp -m comment --comment "ns3/svc3:p80" -m tcp --dport 3003 -j KUBE-EXT-X27LE4BHSL4DOUIK`
		npLocalhst = `-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m comment --comment "ns3/svc3:p80" -m tcp --dport 3003 -m nfacct --nfacct-name  localhost_nps_accepted_pkts -j KUBE-EXT-X27LE4BHSL4DOUIK`
	)
	tests := []struct {
		name            string
		opts            rules.Options
		present, absent []string
	}{{
		name:    "default: every local address, localhost NodePorts on",
		opts:    rules.Options{Family: service.IPv4, LocalAddrs: local},
		present: []string{"-A KUBE-SERVICES " + tail + " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n", martian, npRule},
		absent:  []string{"-d 192.168.0.2", "nfacct"},
	}, {
		name:    "only CIDRs of the other family: this one matches all",
		opts:    rules.Options{Family: service.IPv4, NodePortAddresses: pfx("2001:db8::/64"), LocalAddrs: local},
		present: []string{tail + " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n", martian},
	}, {
		name:    "--iptables-localhost-nodeports=false",
		opts:    rules.Options{Family: service.IPv4, NoLocalhostNodePorts: true, NFAcct: true},
		present: []string{"-A KUBE-SERVICES ! -d 127.0.0.0/8 " + tail + " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n", npRule},
		absent:  []string{"KUBE-FIREWALL", npLocalhst},
	}, {
		name: "CIDRs with loopback: one rule per local address, loopback included",
		opts: rules.Options{Family: service.IPv4, NodePortAddresses: pfx("127.0.0.0/8", "192.168.0.0/16", "2001:db8::/64"), LocalAddrs: local, NFAcct: true},
		present: []string{
			"-A KUBE-SERVICES -d 127.0.0.1/32 " + tail + " -j KUBE-NODEPORTS\n-A KUBE-SERVICES -d 192.168.0.2/32 " + tail + " -j KUBE-NODEPORTS\n-A KUBE-SVC-X27LE4BHSL4DOUIK ",
			martian, npLocalhst + "\n" + npRule + "\n",
			"-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP\n",
		},
		absent: []string{"10.1.0.7", "--dst-type LOCAL -j KUBE-NODEPORTS"},
	}, {
		name:    "CIDRs without loopback: no localhost NodePorts, no KUBE-FIREWALL",
		opts:    rules.Options{Family: service.IPv4, NodePortAddresses: pfx("10.0.0.0/8"), LocalAddrs: local, NFAcct: true},
		present: []string{"-A KUBE-SERVICES -d 10.1.0.7/32 " + tail + " -j KUBE-NODEPORTS\n-A KUBE-SVC-X27LE4BHSL4DOUIK ", npRule},
		absent:  []string{"KUBE-FIREWALL", "127.0.0", "192.168.0.2"},
	}, {
		name:    "a zero CIDR matches all",
		opts:    rules.Options{Family: service.IPv4, NodePortAddresses: pfx("10.0.0.0/8", "0.0.0.0/0"), LocalAddrs: local},
		present: []string{tail + " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n", martian},
		absent:  []string{"-d 10.1.0.7"},
	}, {
		name:    "IPv6 default: not ::1",
		opts:    rules.Options{Family: service.IPv6, LocalAddrs: local, NFAcct: true},
		present: []string{"-A KUBE-SERVICES ! -d ::1/128 " + tail + " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n", npRule},
		absent:  []string{"KUBE-FIREWALL", "127.0.0.0/8 -p"},
	}, {
		name:    "IPv6 CIDRs: loopback left out, zones dropped",
		opts:    rules.Options{Family: service.IPv6, NodePortAddresses: pfx("::1/128", "2001:db8::/64", "fe80::/10"), LocalAddrs: local},
		present: []string{"-A KUBE-SERVICES -d 2001:db8::2/128 " + tail + " -j KUBE-NODEPORTS\n-A KUBE-SERVICES -d fe80::1/128 " + tail + " -j KUBE-NODEPORTS\n-A KUBE-SVC-X27LE4BHSL4DOUIK "},
		absent:  []string{"-d ::1/128"},
	}, {
		name:    "restore format",
		opts:    rules.Options{Format: rules.FormatRestore, Family: service.IPv4, NodePortAddresses: pfx("192.168.0.0/16"), LocalAddrs: local},
		present: []string{"-A KUBE-SERVICES " + tail + " -d 192.168.0.2 -j KUBE-NODEPORTS\n"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := writeRules(t, tbl, tt.opts)
			checkContains(t, out, tt.present, tt.absent)
		})
	}
}

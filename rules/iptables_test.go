package rules_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

const (
	tcp  = v1.ProtocolTCP
	udp  = v1.ProtocolUDP
	ipv4 = discoveryv1.AddressTypeIPv4
	ipv6 = discoveryv1.AddressTypeIPv6
)

// TestChainNames holds our chain names against the ones in kube-proxy's own
// expected iptables output (pkg/proxy/iptables/proxier_test.go), and two
// that every cluster with CoreDNS and the API server has.
func TestChainNames(t *testing.T) {
	p80 := service.PortName{Namespace: "ns1", Name: "svc1", Port: "p80"}
	unnamed := service.PortName{Namespace: "ns1", Name: "svc1"}
	tests := []struct {
		got, want string
	}{
		// proxier_test.go: "ns1/svc1:p80 cluster IP" ... -j KUBE-SVC-XPGD46QRK7WJZT7O,
		// and its endpoints 10.180.0.1:80 and 10.180.0.2:80.
		{rules.ServiceChain(p80, service.TCP), "KUBE-SVC-XPGD46QRK7WJZT7O"},
		{rules.EndpointChain(p80, service.TCP, "10.180.0.1:80"), "KUBE-SEP-SXIVWICOYRO3J4NJ"},
		{rules.EndpointChain(p80, service.TCP, "10.180.0.2:80"), "KUBE-SEP-LXVODXWDISEETFEF"},
		// proxier_test.go, the "ns1/svc1" tests of internal and external
		// traffic policy (an unnamed port, Cluster and Local chains).
		{rules.ServiceChain(unnamed, service.TCP), "KUBE-SVC-AQI2S6QIMU7PVVRP"},
		{rules.LocalServiceChain(unnamed, service.TCP), "KUBE-SVL-AQI2S6QIMU7PVVRP"},
		{rules.EndpointChain(unnamed, service.TCP, "10.0.1.1:80"), "KUBE-SEP-3JOIVZTXZZRGORX4"},
		{rules.EndpointChain(unnamed, service.TCP, "10.0.1.2:80"), "KUBE-SEP-IO5XOSKPAXIFQXAJ"},
		{rules.EndpointChain(unnamed, service.TCP, "10.0.1.3:80"), "KUBE-SEP-XGJFVO3L2O5SRFNT"},
		{rules.EndpointChain(unnamed, service.TCP, "10.0.1.5:80"), "KUBE-SEP-EQCHZ7S2PJ72OHAY"},
		// proxier_test.go, TestOverallIPTablesRules: svc2..svc5.
		{rules.ServiceChain(service.PortName{Namespace: "ns2", Name: "svc2", Port: "p80"}, service.TCP), "KUBE-SVC-GNZBNJ2PO5MGZ6GT"},
		{rules.EndpointChain(service.PortName{Namespace: "ns2", Name: "svc2", Port: "p80"}, service.TCP, "10.180.0.2:80"), "KUBE-SEP-RS4RBKLTHTF2IUXJ"},
		{rules.ServiceChain(service.PortName{Namespace: "ns3", Name: "svc3", Port: "p80"}, service.TCP), "KUBE-SVC-X27LE4BHSL4DOUIK"},
		{rules.EndpointChain(service.PortName{Namespace: "ns3", Name: "svc3", Port: "p80"}, service.TCP, "10.180.0.3:80"), "KUBE-SEP-OYPFS5VJICHGATKP"},
		{rules.ServiceChain(service.PortName{Namespace: "ns4", Name: "svc4", Port: "p80"}, service.TCP), "KUBE-SVC-4SW47YFZTEDKD3PK"},
		{rules.EndpointChain(service.PortName{Namespace: "ns4", Name: "svc4", Port: "p80"}, service.TCP, "10.180.0.4:80"), "KUBE-SEP-UKSFD7AGPMPPLUHC"},
		{rules.ServiceChain(service.PortName{Namespace: "ns5", Name: "svc5", Port: "p80"}, service.TCP), "KUBE-SVC-NUKIZ6OKUXPJNT4C"},
		{rules.EndpointChain(service.PortName{Namespace: "ns5", Name: "svc5", Port: "p80"}, service.TCP, "10.180.0.3:80"), "KUBE-SEP-I77PXRDZVX7PMWMN"},
		// Every cluster: the API server and CoreDNS (the protocol is part of
		// the hash: UDP and TCP ports of kube-dns differ).
		{rules.ServiceChain(service.PortName{Namespace: "default", Name: "kubernetes", Port: "https"}, service.TCP), "KUBE-SVC-NPX46M4PTMTKRN6Y"},
		{rules.ServiceChain(service.PortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns"}, service.UDP), "KUBE-SVC-TCOU7JCQXEZGVUNU"},
		{rules.ServiceChain(service.PortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns-tcp"}, service.TCP), "KUBE-SVC-ERIFXISQEP7F7OF4"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("chain name %s, want %s", tt.got, tt.want)
		}
	}
}

// serviceLines keeps the lines of Write output that belong to service
// ports: table markers, KUBE-SVC/SVL/SEP chains and their rules, and the
// KUBE-SERVICES rules other than the nodeports tail.
func serviceLines(out string) string {
	var b strings.Builder
	for _, l := range strings.Split(out, "\n") {
		keep := strings.HasPrefix(l, "*") ||
			strings.HasPrefix(l, ":KUBE-SVC-") || strings.HasPrefix(l, ":KUBE-SVL-") || strings.HasPrefix(l, ":KUBE-SEP-") ||
			strings.HasPrefix(l, "-A KUBE-SVC-") || strings.HasPrefix(l, "-A KUBE-SVL-") || strings.HasPrefix(l, "-A KUBE-SEP-") ||
			(strings.HasPrefix(l, "-A KUBE-SERVICES") && !strings.Contains(l, "KUBE-NODEPORTS"))
		if keep {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func writeRules(t *testing.T, tbl *service.Table, opts rules.Options) string {
	t.Helper()
	var buf bytes.Buffer
	if err := rules.Write(&buf, tbl, opts); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestWriteGolden pins the service-port lines, as iptables-save prints
// them, for the shapes a service port can take. Endpoint order is the
// string order of "ip:port" (10.180.0.10 before 10.180.0.2); rule i of n
// carries 1/(n-i), printed back by iptables-save as its 31-bit threshold.
func TestWriteGolden(t *testing.T) {
	svc1 := func(mods ...func(*v1.Service)) *v1.Service {
		return svc("ns1/svc1", "172.30.0.41", ports(sport("p80", tcp, 80)), mods...)
	}
	slice1 := func(port int32, e ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice("ns1/svc1-a", "svc1", ipv4, "p80", tcp, port, e...)
	}
	tests := []struct {
		name string
		objs []any
		opts rules.Options
		want string
	}{{
		name: "one endpoint",
		objs: []any{svc1(), slice1(80, eps("10.180.0.1")...)},
		want: `
*filter
*nat
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
`,
	}, {
		name: "two endpoints",
		objs: []any{svc1(), slice1(80, eps("10.180.0.2", "10.180.0.1")...)},
		want: `
*filter
*nat
:KUBE-SEP-LXVODXWDISEETFEF - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SEP-LXVODXWDISEETFEF -s 10.180.0.2/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-LXVODXWDISEETFEF -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-LXVODXWDISEETFEF
`,
	}, {
		name: "three endpoints in string order, target port 8080",
		objs: []any{svc1(), slice1(8080, eps("10.180.0.3", "10.180.0.2", "10.180.0.10")...)},
		want: `
*filter
*nat
:KUBE-SEP-NAZVJRW4ZXJURRRS - [0:0]
:KUBE-SEP-Q3UNY2JN2X27RNGC - [0:0]
:KUBE-SEP-VLCBLZ3INDL6LVTP - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SEP-NAZVJRW4ZXJURRRS -s 10.180.0.3/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-NAZVJRW4ZXJURRRS -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.3:8080
-A KUBE-SEP-Q3UNY2JN2X27RNGC -s 10.180.0.10/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-Q3UNY2JN2X27RNGC -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.10:8080
-A KUBE-SEP-VLCBLZ3INDL6LVTP -s 10.180.0.2/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-VLCBLZ3INDL6LVTP -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.2:8080
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.10:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-Q3UNY2JN2X27RNGC
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-VLCBLZ3INDL6LVTP
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.3:8080" -j KUBE-SEP-NAZVJRW4ZXJURRRS
`,
	}, {
		name: "ClientIP affinity: rcheck rules before the cascade, set in the endpoint chains",
		objs: []any{svc1(clientIP(300)), slice1(80, eps("10.180.0.1", "10.180.0.2")...)},
		want: `
*filter
*nat
:KUBE-SEP-LXVODXWDISEETFEF - [0:0]
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SEP-LXVODXWDISEETFEF -s 10.180.0.2/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-LXVODXWDISEETFEF -p tcp -m comment --comment "ns1/svc1:p80" -m recent --set --name KUBE-SEP-LXVODXWDISEETFEF --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m comment --comment "ns1/svc1:p80" -m recent --set --name KUBE-SEP-SXIVWICOYRO3J4NJ --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m recent --rcheck --seconds 300 --reap --name KUBE-SEP-SXIVWICOYRO3J4NJ --mask 255.255.255.255 --rsource -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -m recent --rcheck --seconds 300 --reap --name KUBE-SEP-LXVODXWDISEETFEF --mask 255.255.255.255 --rsource -j KUBE-SEP-LXVODXWDISEETFEF
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-SXIVWICOYRO3J4NJ
-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.2:80" -j KUBE-SEP-LXVODXWDISEETFEF
`,
	}, {
		name: "no endpoints: REJECT in the filter table, nothing in nat",
		objs: []any{svc1()},
		want: `
*filter
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
*nat
`,
	}, {
		name: "internalTrafficPolicy Local, no local endpoint: DROP",
		objs: []any{svc1(itpLocal), slice1(80, eps("10.180.0.1")...)},
		want: `
*filter
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 has no local endpoints" -m tcp --dport 80 -j DROP
*nat
`,
	}, {
		name: "internalTrafficPolicy Local: the KUBE-SVL chain has the local endpoint only; cluster CIDR masquerade",
		objs: []any{svc1(itpLocal), slice1(80, ep("10.180.0.1", onNode("node-a")), ep("10.180.0.2", onNode("other")))},
		opts: rules.Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("fd00::/64"), netip.MustParsePrefix("10.1.2.3/8")}},
		want: `
*filter
*nat
:KUBE-SEP-SXIVWICOYRO3J4NJ - [0:0]
:KUBE-SVL-XPGD46QRK7WJZT7O - [0:0]
-A KUBE-SEP-SXIVWICOYRO3J4NJ -s 10.180.0.1/32 -m comment --comment "ns1/svc1:p80" -j KUBE-MARK-MASQ
-A KUBE-SEP-SXIVWICOYRO3J4NJ -p tcp -m comment --comment "ns1/svc1:p80" -m tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVL-XPGD46QRK7WJZT7O
-A KUBE-SVL-XPGD46QRK7WJZT7O ! -s 10.0.0.0/8 -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVL-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ
`,
	}, {
		name: "dual-stack UDP: an ip6tables-save section with /128, masquerade all",
		objs: []any{
			svc("kube-system/kube-dns", "10.96.0.10,fd00:96::a", ports(sport("dns", udp, 53))),
			slice("kube-system/dns-4", "kube-dns", ipv4, "dns", udp, 53, eps("10.244.0.5")...),
			slice("kube-system/dns-6", "kube-dns", ipv6, "dns", udp, 53, eps("fd00:244::6", "fd00:244::5")...),
		},
		opts: rules.Options{MasqueradeAll: true},
		want: `
*filter
*nat
:KUBE-SEP-LPGSDLJ3FDW46N4W - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
-A KUBE-SEP-LPGSDLJ3FDW46N4W -s 10.244.0.5/32 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-LPGSDLJ3FDW46N4W -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.0.5:53
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> 10.244.0.5:53" -j KUBE-SEP-LPGSDLJ3FDW46N4W
*filter
*nat
:KUBE-SEP-3TLJEYB745AYELR7 - [0:0]
:KUBE-SEP-DZJAPLAQDUBDZXZK - [0:0]
:KUBE-SVC-TCOU7JCQXEZGVUNU - [0:0]
-A KUBE-SEP-3TLJEYB745AYELR7 -s fd00:244::5/128 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-3TLJEYB745AYELR7 -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination [fd00:244::5]:53
-A KUBE-SEP-DZJAPLAQDUBDZXZK -s fd00:244::6/128 -m comment --comment "kube-system/kube-dns:dns" -j KUBE-MARK-MASQ
-A KUBE-SEP-DZJAPLAQDUBDZXZK -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination [fd00:244::6]:53
-A KUBE-SERVICES -d fd00:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-TCOU7JCQXEZGVUNU
-A KUBE-SVC-TCOU7JCQXEZGVUNU -d fd00:96::a/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-MARK-MASQ
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> [fd00:244::5]:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-3TLJEYB745AYELR7
-A KUBE-SVC-TCOU7JCQXEZGVUNU -m comment --comment "kube-system/kube-dns:dns -> [fd00:244::6]:53" -j KUBE-SEP-DZJAPLAQDUBDZXZK
`,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := serviceLines(writeRules(t, table(t, tt.objs...), tt.opts))
			if diff := cmp.Diff(strings.TrimPrefix(tt.want, "\n"), got); diff != "" {
				t.Errorf("service lines (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWriteKubeProxyRestore holds FormatRestore against kube-proxy's
// own expected restore input: proxier_test.go, the internal/external
// traffic policy test "ns1/svc1" (unnamed port, ClusterIP 172.30.1.1:80,
// ClientIP affinity, three usable endpoints, --cluster-cidr 10.0.0.0/8).
// kube-proxy's test sorts rules by chain; within a chain the order is the
// proxier's.
func TestWriteKubeProxyRestore(t *testing.T) {
	tbl := table(t,
		svc("ns1/svc1", "172.30.1.1", ports(sport("", tcp, 80)), clientIP(0)),
		slice("ns1/svc1-1", "svc1", ipv4, "", tcp, 80, eps("10.0.1.1", "10.0.1.2", "10.0.1.5")...),
	)
	out := writeRules(t, tbl, rules.Options{Format: rules.FormatRestore, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	want := map[string][]string{
		"KUBE-SERVICES": {
			`-A KUBE-SERVICES -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp -d 172.30.1.1 --dport 80 -j KUBE-SVC-AQI2S6QIMU7PVVRP`,
			`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`,
		},
		"KUBE-SEP-3JOIVZTXZZRGORX4": {
			`-A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -s 10.0.1.1 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-3JOIVZTXZZRGORX4 -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-3JOIVZTXZZRGORX4 --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.1:80`,
		},
		"KUBE-SEP-EQCHZ7S2PJ72OHAY": {
			`-A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -s 10.0.1.5 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-EQCHZ7S2PJ72OHAY -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-EQCHZ7S2PJ72OHAY --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.5:80`,
		},
		"KUBE-SEP-IO5XOSKPAXIFQXAJ": {
			`-A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -s 10.0.1.2 -j KUBE-MARK-MASQ`,
			`-A KUBE-SEP-IO5XOSKPAXIFQXAJ -m comment --comment ns1/svc1 -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --set -m tcp -p tcp -j DNAT --to-destination 10.0.1.2:80`,
		},
		"KUBE-SVC-AQI2S6QIMU7PVVRP": {
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 cluster IP" -m tcp -p tcp -d 172.30.1.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ`,
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m recent --name KUBE-SEP-3JOIVZTXZZRGORX4 --rcheck --seconds 10800 --reap -j KUBE-SEP-3JOIVZTXZZRGORX4`,
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m recent --name KUBE-SEP-IO5XOSKPAXIFQXAJ --rcheck --seconds 10800 --reap -j KUBE-SEP-IO5XOSKPAXIFQXAJ`,
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -m recent --name KUBE-SEP-EQCHZ7S2PJ72OHAY --rcheck --seconds 10800 --reap -j KUBE-SEP-EQCHZ7S2PJ72OHAY`,
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.1:80" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-3JOIVZTXZZRGORX4`,
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-IO5XOSKPAXIFQXAJ`,
			`-A KUBE-SVC-AQI2S6QIMU7PVVRP -m comment --comment "ns1/svc1 -> 10.0.1.5:80" -j KUBE-SEP-EQCHZ7S2PJ72OHAY`,
		},
	}
	got := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		chain, ok := strings.CutPrefix(l, "-A ")
		if !ok {
			continue
		}
		chain, _, _ = strings.Cut(chain, " ")
		if _, wanted := want[chain]; wanted {
			got[chain] = append(got[chain], l)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("rules per chain (-want +got):\n%s\nfull output:\n%s", diff, out)
	}
	// The chain declarations come before the rules, in the proxier's order.
	for _, decl := range []string{":KUBE-SVC-AQI2S6QIMU7PVVRP - [0:0]\n:KUBE-SEP-3JOIVZTXZZRGORX4 - [0:0]\n:KUBE-SEP-IO5XOSKPAXIFQXAJ - [0:0]\n:KUBE-SEP-EQCHZ7S2PJ72OHAY - [0:0]\n"} {
		if !strings.Contains(out, decl) {
			t.Errorf("output lacks the chain declarations\n%s\nfull output:\n%s", decl, out)
		}
	}
}

// TestWriteSkeleton pins a whole section: the static chains and rules
// kube-proxy writes around the service ports, as iptables-save prints them.
// This is byte for byte what iptables-save v1.8.9 printed after restoring
// it (the "#" lines aside).
func TestWriteSkeleton(t *testing.T) {
	want := `# Generated by userproxy as iptables-save would print kube-proxy's rules (IPv4)
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EXTERNAL-SERVICES - [0:0]
:KUBE-FIREWALL - [0:0]
:KUBE-FORWARD - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-PROXY-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
COMMIT
# Generated by userproxy as iptables-save would print kube-proxy's rules (IPv4)
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SERVICES - [0:0]
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
COMMIT
`
	if diff := cmp.Diff(want, writeRules(t, nil, rules.Options{})); diff != "" {
		t.Errorf("empty table (-want +got):\n%s", diff)
	}
}

// TestWriteOptions checks what each option adds or takes away.
func TestWriteOptions(t *testing.T) {
	tbl := table(t,
		svc("ns1/svc1", "172.30.0.41,fd00::41", ports(sport("p80", tcp, 80))),
		slice("ns1/svc1-a", "svc1", ipv4, "p80", tcp, 80, eps("10.180.0.1")...),
		slice("ns1/svc1-b", "svc1", ipv6, "p80", tcp, 80, eps("fd00:10::1")...),
	)
	const invalidDrop = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n"
	tests := []struct {
		name            string
		opts            rules.Options
		present, absent []string
	}{{
		name: "defaults: both families, INVALID drop, no jumps",
		present: []string{
			"as iptables-save would print", "as ip6tables-save would print", invalidDrop,
			"-A KUBE-SERVICES -d fd00::41/128 -p tcp",
			"-A KUBE-SERVICES ! -d ::1/128 -m comment",
		},
		absent: []string{"-A PREROUTING", "-A INPUT", "KUBE-MARK-MASQ\n-A KUBE-SVC"},
	}, {
		name:    "one family",
		opts:    rules.Options{Family: service.IPv6},
		present: []string{"as ip6tables-save would print", "[fd00:10::1]:80"},
		absent:  []string{"as iptables-save would print", "10.180.0.1", "KUBE-FIREWALL"},
	}, {
		name:   "liberal conntrack: no INVALID drop",
		opts:   rules.Options{TCPBeLiberal: true},
		absent: []string{"INVALID"},
	}, {
		name: "jump rules, iptables-save order",
		opts: rules.Options{Family: service.IPv4, JumpRules: true},
		present: []string{
			"-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
			"-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
			"-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n",
			"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL\n" +
				"-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n" +
				"-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
			"-A INPUT -j KUBE-FIREWALL\n",
		},
	}, {
		name: "jump rules as -I lines for iptables-restore",
		opts: rules.Options{Format: rules.FormatRestore, Family: service.IPv6, JumpRules: true},
		present: []string{
			":KUBE-FIREWALL - [0:0]\n", "-I PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
			"-I OUTPUT -j KUBE-FIREWALL\nCOMMIT\n",
		},
	}, {
		name: "restore format spells what kube-proxy writes",
		opts: rules.Options{Format: rules.FormatRestore, Family: service.IPv4, MasqueradeAll: true},
		present: []string{
			"# iptables-restore input", "-A KUBE-MARK-MASQ -j MARK --or-mark 0x00004000\n",
			"-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment \"ns1/svc1:p80 cluster IP\" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ\n",
			"-A KUBE-SEP-SXIVWICOYRO3J4NJ -m comment --comment ns1/svc1:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ\n",
		},
		absent: []string{"/32", "[0:0]\n-A INPUT"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := writeRules(t, tbl, tt.opts)
			checkContains(t, out, tt.present, tt.absent)
		})
	}
}

// TestWriteLargeCluster: past 1000 endpoints in a family kube-proxy
// drops the comments of KUBE-SVC and KUBE-SEP rules, not the others.
func TestWriteLargeCluster(t *testing.T) {
	objs := []any{svc("ns1/big", "172.30.0.50", ports(sport("p", tcp, 80)))}
	for s := 0; s < 2; s++ {
		var addrs []string
		for i := 0; i < 501; i++ {
			addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d", 100+s, i/250, i%250+1))
		}
		objs = append(objs, slice(fmt.Sprintf("ns1/big-%d", s), "big", ipv4, "p", tcp, 80, eps(addrs...)...))
	}
	out := writeRules(t, table(t, objs...), rules.Options{Family: service.IPv4})
	svcChain := rules.ServiceChain(service.PortName{Namespace: "ns1", Name: "big", Port: "p"}, service.TCP)
	var svcRules, sepRules int
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(l, "-A "+svcChain+" "):
			svcRules++
		case strings.HasPrefix(l, "-A KUBE-SEP-"):
			sepRules++
		default:
			continue
		}
		if strings.Contains(l, "--comment") {
			t.Fatalf("large cluster rule with a comment: %s", l)
		}
	}
	if svcRules != 1002 || sepRules != 2004 {
		t.Errorf("%d service rules and %d endpoint rules, want 1002 and 2004", svcRules, sepRules)
	}
	if !strings.Contains(out, `--comment "ns1/big:p cluster IP"`) {
		t.Error("the KUBE-SERVICES rule lost its comment")
	}
	if !strings.Contains(out, "--probability 0.00099800387 ") {
		t.Errorf("first rule of 1002 lacks probability 1/1002 as saved")
	}
}

func TestWriteErrors(t *testing.T) {
	if err := rules.Write(io.Discard, nil, rules.Options{Family: 5}); err == nil {
		t.Error("family 5: no error")
	}
	broken := errors.New("disk full")
	if err := rules.Write(failWriter{broken}, nil, rules.Options{}); !errors.Is(err, broken) {
		t.Errorf("failing writer: error %v, want %v", err, broken)
	}
	for _, tt := range []struct {
		in   string
		want rules.Format
		ok   bool
	}{{"", rules.FormatSave, true}, {"save", rules.FormatSave, true}, {"restore", rules.FormatRestore, true}, {"xml", 0, false}} {
		got, err := rules.ParseFormat(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseFormat(%q) = %v, %v", tt.in, got, err)
		}
	}
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }

// TestWriteIptablesRoundTrip feeds both formats to the real
// iptables-restore in a network namespace of its own and checks that
// iptables-save prints FormatSave back, line for line. It needs root,
// unshare(1) and iptables; without them it skips, except under CI (CI=1),
// where it fails: CI is root and installs them.
func TestWriteIptablesRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		skipUnlessCI(t, "needs root")
	}
	for _, bin := range []string{"unshare", "iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			skipUnlessCI(t, "needs %s", bin)
		}
	}
	tbl := table(t,
		svc("ns1/svc1", "172.30.0.41,fd00::41", ports(sport("p80", tcp, 80), sport("dns", udp, 53)), clientIP(60)),
		slice("ns1/svc1-a", "svc1", ipv4, "p80", tcp, 8080, eps("10.180.0.1", "10.180.0.2", "10.180.0.10")...),
		slice("ns1/svc1-b", "svc1", ipv6, "p80", tcp, 8080, eps("fd00:10::1", "fd00:10::2")...),
		svc("ns2/local", "172.30.0.42", ports(sport("", tcp, 80)), itpLocal),
		slice("ns2/local-a", "local", ipv4, "", tcp, 80, eps("10.180.0.3")...),
		svc("ns3/none", "172.30.0.43,fd00::43", ports(sport("", udp, 53))),
	)
	// External destinations too (external_test.go): kube-proxy's
	// TestOverallIPTablesRules services, an IPv6 LoadBalancer with Local
	// policy, source ranges, a local endpoint and affinity, and one with
	// no endpoints.
	objs := append(overallObjects(),
		svc("ns7/lb6", "fd00:30::47", ports(withNodePort(sport("p80", tcp, 80), 3007)), loadBalancer("2001:db8::7"), etpLocal,
			externalIPs("2001:db8::77"), sourceRanges("2001:db8:1::/48"), healthCheckNodePort(30007), clientIP(60)),
		slice("ns7/lb6-1", "lb6", ipv6, "p80", tcp, 80, ep("fd00:10::7", onNode("node-a")), ep("fd00:10::8", onNode("other"))),
		svc("ns8/none", "172.30.0.48,fd00:30::48", ports(withNodePort(sport("", udp, 53), 3008)), loadBalancer("1.2.3.8", "2001:db8::8")),
	)
	extTbl := table(t, objs...)
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00:10::/64")}
	local := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("192.168.0.2"), netip.MustParseAddr("2001:db8::2")}
	for _, fam := range []service.Family{service.IPv4, service.IPv6} {
		for _, v := range []struct {
			name string
			tbl  *service.Table
			opts rules.Options
		}{
			{"jumps=false", tbl, rules.Options{}},
			{"jumps=true", tbl, rules.Options{JumpRules: true}},
			{"external", extTbl, rules.Options{JumpRules: true}},
			{"external/nfacct", extTbl, rules.Options{NFAcct: true}},
			{"external/nodeport-addresses", extTbl, rules.Options{JumpRules: true, LocalAddrs: local,
				NodePortAddresses: []netip.Prefix{netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("2001:db8::/64")}}},
			{"external/no-localhost-nodeports", extTbl, rules.Options{NoLocalhostNodePorts: true}},
		} {
			opts := v.opts
			opts.Family, opts.ClusterCIDRs = fam, cidrs
			tbl := v.tbl
			name := fmt.Sprintf("%s/%s", fam, v.name)
			t.Run(name, func(t *testing.T) {
				save := writeRules(t, tbl, opts)
				opts.Format = rules.FormatRestore
				restore := writeRules(t, tbl, opts)
				want := withoutComments(save)
				for _, in := range []string{save, restore} {
					if got := iptablesRoundTrip(t, fam, in, opts.NFAcct); got != want {
						t.Errorf("iptables-save after restoring\n%s\ngave (-want +got):\n%s", in, cmp.Diff(want, got))
					}
				}
			})
		}
	}
}

func withoutComments(s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if !strings.HasPrefix(l, "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// iptablesRoundTrip restores in into a new network namespace and returns
// what iptables-save prints there, without its comment lines.
// With nfacct, it first creates kube-proxy's nfacct counters there.
func iptablesRoundTrip(t *testing.T, fam service.Family, in string, nfacct bool) string {
	t.Helper()
	tool := "iptables"
	if fam == service.IPv6 {
		tool = "ip6tables"
	}
	setup := ""
	if nfacct {
		setup = nfacctSetup(t)
	}
	cmd := exec.Command("unshare", "--net", "sh", "-c", setup+tool+"-restore && "+tool+"-save")
	cmd.Stdin = strings.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if strings.Contains(stderr.String(), "unshare failed") || strings.Contains(stderr.String(), "Operation not permitted") {
			skipUnlessCI(t, "cannot make a network namespace: %s", stderr.String())
		}
		t.Fatalf("%s-restore: %v\n%s", tool, err, stderr.String())
	}
	return withoutComments(string(out))
}

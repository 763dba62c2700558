package service_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

// Service modifiers for external traffic.

func svcType(typ v1.ServiceType) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.Type = typ }
}

// nodePorts sets spec.ports[i].nodePort, in order.
func nodePorts(nps ...int32) func(*v1.Service) {
	return func(s *v1.Service) {
		for i, np := range nps {
			s.Spec.Ports[i].NodePort = np
		}
	}
}

func externalIPs(ips ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.ExternalIPs = ips }
}

// ingress appends a load-balancer ingress IP; mode "" leaves ipMode unset.
func ingress(ip string, mode v1.LoadBalancerIPMode) func(*v1.Service) {
	return func(s *v1.Service) {
		ing := v1.LoadBalancerIngress{IP: ip}
		if mode != "" {
			ing.IPMode = ptr(mode)
		}
		s.Status.LoadBalancer.Ingress = append(s.Status.LoadBalancer.Ingress, ing)
	}
}

func etpLocal(s *v1.Service) { s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal }

func sourceRanges(r ...string) func(*v1.Service) {
	return func(s *v1.Service) { s.Spec.LoadBalancerSourceRanges = r }
}

func dualStack(s *v1.Service) {
	s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
}

// extFlow is a new flow to an external destination, handled the way the
// datapath is to handle it (the order of kube-proxy's chains):
//
//  1. find the Port: LookupNodePort for a NodePort; for an address, Lookup
//     (ClusterIPs) and, when that knows no such port, LookupExternal;
//  2. for an LB IP with source ranges (Firewalls), a source outside them
//     is dropped (KUBE-FW, KUBE-PROXY-FIREWALL);
//  3. a flow from this host uses ExternalFromHost (the KUBE-EXT
//     short-circuit), any other the external verdict and set.
type extFlow struct {
	proto service.Protocol
	// via is "ip" (dst is ip:port), "node4" or "node6" (dst is the
	// NodePort number on a node address of that family).
	via      string
	dst      string
	src      string // "" is 198.51.100.7, a client elsewhere
	fromHost bool
}

func (f extFlow) run(t *testing.T, tbl *service.Table) outcome {
	t.Helper()
	var (
		p        *service.Port
		v        service.Verdict
		external = true
		dstIP    netip.Addr
	)
	switch f.via {
	case "node4", "node6":
		fam := service.IPv4
		if f.via == "node6" {
			fam = service.IPv6
		}
		ap := addrPort(t, "[::]:"+f.dst)
		p, v = tbl.LookupNodePort(f.proto, fam, ap.Port())
	case "ip":
		ap := addrPort(t, f.dst)
		dstIP = ap.Addr()
		p, v = tbl.Lookup(f.proto, dstIP, ap.Port())
		external = false
		if v == service.NotService || v == service.UnknownPort {
			if xp, xv := tbl.LookupExternal(f.proto, dstIP, ap.Port()); xv != service.NotService {
				p, v, external = xp, xv, true
			}
		}
	default:
		t.Fatalf("bad via %q", f.via)
	}
	var o outcome
	var keys []string
	if p != nil {
		o.Port = p.Name.String()
		keys = p.EndpointKeys
		if external {
			if p.ExternalVerdict != v {
				t.Errorf("LookupExternal/LookupNodePort verdict %v, Port.ExternalVerdict %v", v, p.ExternalVerdict)
			}
			keys = p.ExternalEndpointKeys
		}
	}
	src := netip.MustParseAddr("198.51.100.7")
	if f.src != "" {
		src = netip.MustParseAddr(f.src)
	}
	switch {
	case p != nil && external && f.via == "ip" && p.Firewalls(dstIP) && !p.AllowsSource(src):
		o.Action, o.Verdict, o.Firewalled = "DROP", v, true
		return o
	case p != nil && external && f.fromHost:
		_, keys, v = p.ExternalFromHost()
	}
	o.Verdict = v
	switch {
	case v == service.Forward:
		o.Action, o.Endpoints = "FORWARD", keys
	case v.Drop():
		o.Action = "DROP"
	default:
		o.Action = "REJECT"
	}
	return o
}

// TestExternalPacketFlows: kube-proxy's external packet-flow tests
// (pkg/proxy/iptables/proxier_test.go TestExternalTrafficPolicyLocal,
// TestExternalTrafficPolicyCluster, TestNodePorts, TestExternalIPsReject,
// TestLoadBalancer, TestLoadBalancerIngressRouteTypeProxy, and
// TestEndpointSliceWithTerminatingEndpointsTrafficPolicyLocal) rewritten as
// rows of Services, EndpointSlices, a node, and a flow to a NodePort, an
// externalIP or an LB IP.
func TestExternalPacketFlows(t *testing.T) {
	const (
		cip4 = "172.30.0.41"
		cip6 = "fd00:172:30::41"
		eip4 = "192.168.99.11"
		eip6 = "2001:db8::11"
		lb4  = "203.0.113.10"
		lbv  = "203.0.113.11" // ipMode VIP
		lbp  = "203.0.113.12" // ipMode Proxy
		lb6  = "2001:db8:1::10"
	)
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	lbPorts := func() []v1.ServicePort {
		return ports(tcp("http", 80, intstr.FromInt32(8080)), udp("dns", 53, intstr.FromInt32(5353)))
	}
	epPorts := eports(eport("http", v1.ProtocolTCP, 8080), eport("dns", v1.ProtocolUDP, 5353))
	// lb is a dual-stack LoadBalancer service with NodePorts 30080 (TCP)
	// and 30053 (UDP), an externalIP and LB IPs of each family.
	lb := func(mods ...func(*v1.Service)) *v1.Service {
		base := []func(*v1.Service){
			svcType(v1.ServiceTypeLoadBalancer), dualStack, nodePorts(30080, 30053),
			externalIPs(eip4, eip6),
			ingress(lb4, ""), ingress(lbv, v1.LoadBalancerIPModeVIP), ingress(lbp, v1.LoadBalancerIPModeProxy), ingress(lb6, ""),
		}
		return svc("ns1/lb", cip4+","+cip6, lbPorts(), append(base, mods...)...)
	}
	// Endpoints: 10.180.0.1 on node1 (this node), 10.180.1.1 on node2.
	slice4 := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		if eps == nil {
			eps = []discoveryv1.Endpoint{ep("10.180.0.1", onNode("node1")), ep("10.180.1.1", onNode("node2"))}
		}
		return slice("ns1/lb-v4", "lb", v4, epPorts, eps...)
	}
	slice6 := slice("ns1/lb-v6", "lb", v6, epPorts, ep("fd00:10:180::1", onNode("node1")), ep("fd00:10:180:1::1", onNode("node2")))
	remoteOnly := slice4(ep("10.180.1.1", onNode("node2")), ep("10.180.2.1", onNode("node3")))
	both := []string{"10.180.0.1:8080", "10.180.1.1:8080"}
	remote := []string{"10.180.1.1:8080", "10.180.2.1:8080"}

	rows := []struct {
		name string
		objs []any
		flow extFlow
		want outcome
	}{
		// TestNodePorts: a NodePort of each protocol and family.
		{
			name: "NodePort TCP, IPv4",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "NodePort UDP, IPv4",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.UDP, via: "node4", dst: "30053"},
			want: forward("ns1/lb:dns", "10.180.0.1:5353", "10.180.1.1:5353"),
		},
		{
			name: "NodePort TCP, IPv6: the IPv6 Port of the dual-stack service",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node6", dst: "30080"},
			want: forward("ns1/lb:http", "[fd00:10:180:1::1]:8080", "[fd00:10:180::1]:8080"),
		},
		{
			name: "NodePort UDP, IPv6",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.UDP, via: "node6", dst: "30053"},
			want: forward("ns1/lb:dns", "[fd00:10:180:1::1]:5353", "[fd00:10:180::1]:5353"),
		},
		{
			name: "NodePort of the other protocol is no NodePort",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.UDP, via: "node4", dst: "30080"},
			want: reject(service.NotService, ""),
		},
		{
			name: "NodePort number nobody has",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30081"},
			want: reject(service.NotService, ""),
		},
		// TestNoEndpointsReject / TestExternalIPsReject: no endpoints
		// rejects every external destination (KUBE-EXTERNAL-SERVICES).
		{
			name: "no endpoints: the NodePort rejects",
			objs: []any{lb()},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: reject(service.NoEndpoints, "ns1/lb:http"),
		},
		{
			name: "no endpoints: the externalIP rejects",
			objs: []any{lb()},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":80"},
			want: reject(service.NoEndpoints, "ns1/lb:http"),
		},
		// externalIPs, of each family.
		{
			name: "externalIP, IPv4",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":80"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "externalIP, IPv6",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.UDP, via: "ip", dst: "[" + eip6 + "]:53"},
			want: forward("ns1/lb:dns", "[fd00:10:180:1::1]:5353", "[fd00:10:180::1]:5353"),
		},
		{
			name: "externalIP, a port the service does not have: REJECT",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":443"},
			want: reject(service.UnknownPort, ""),
		},
		{
			name: "externalIP on a ClusterIP-type service",
			objs: []any{svc("ns1/web", cip4, ports(tcp("http", 80, intstr.FromInt32(8080))), externalIPs(eip4)),
				slice("ns1/web-1", "web", v4, epPorts, ep("10.180.0.1"))},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":80"},
			want: forward("ns1/web:http", "10.180.0.1:8080"),
		},
		// TestLoadBalancer and TestLoadBalancerIngressRouteTypeProxy: ingress
		// IPs with ipMode unset or VIP are captured, Proxy ones are not.
		{
			name: "LB IP, ipMode unset",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lb4 + ":80"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "LB IP, ipMode VIP",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lbv + ":80"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "LB IP, ipMode Proxy: not captured",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lbp + ":80"},
			want: reject(service.NotService, ""),
		},
		{
			name: "LB IP, IPv6",
			objs: []any{lb(), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: "[" + lb6 + "]:80"},
			want: forward("ns1/lb:http", "[fd00:10:180:1::1]:8080", "[fd00:10:180::1]:8080"),
		},
		// TestExternalTrafficPolicyLocal: external traffic uses the local
		// endpoints only; ClusterIP traffic still uses the cluster set.
		{
			name: "externalTrafficPolicy Local: NodePort uses the local endpoint",
			objs: []any{lb(etpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: forward("ns1/lb:http", "10.180.0.1:8080"),
		},
		{
			name: "externalTrafficPolicy Local: LB IP uses the local endpoint",
			objs: []any{lb(etpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lb4 + ":80"},
			want: forward("ns1/lb:http", "10.180.0.1:8080"),
		},
		{
			name: "externalTrafficPolicy Local: the ClusterIP uses the cluster set",
			objs: []any{lb(etpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: cip4 + ":80"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "externalTrafficPolicy Local, no local endpoint: the NodePort drops",
			objs: []any{lb(etpLocal), remoteOnly, slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: drop("ns1/lb:http"),
		},
		{
			name: "externalTrafficPolicy Local, no local endpoint: the externalIP drops",
			objs: []any{lb(etpLocal), remoteOnly, slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":80"},
			want: drop("ns1/lb:http"),
		},
		{
			name: "externalTrafficPolicy Local, no local endpoint: the LB IP drops",
			objs: []any{lb(etpLocal), remoteOnly, slice6},
			flow: extFlow{proto: service.UDP, via: "ip", dst: lb4 + ":53"},
			want: drop("ns1/lb:dns"),
		},
		{
			name: "externalTrafficPolicy Local, no local endpoint: the ClusterIP still forwards",
			objs: []any{lb(etpLocal), remoteOnly, slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: cip4 + ":80"},
			want: forward("ns1/lb:http", remote...),
		},
		// The KUBE-EXT short-circuit: "route LOCAL traffic for ... external
		// destinations" to the cluster policy chain.
		{
			name: "externalTrafficPolicy Local, no local endpoint, from this host: the cluster set",
			objs: []any{lb(etpLocal), remoteOnly, slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lb4 + ":80", fromHost: true},
			want: forward("ns1/lb:http", remote...),
		},
		{
			name: "externalTrafficPolicy Local, from this host to the NodePort: the cluster set",
			objs: []any{lb(etpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080", fromHost: true},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "internalTrafficPolicy and externalTrafficPolicy Local, from this host: the cluster set",
			objs: []any{lb(etpLocal, itpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":80", fromHost: true},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "no endpoints, from this host: REJECT",
			objs: []any{lb(etpLocal)},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080", fromHost: true},
			want: reject(service.NoEndpoints, "ns1/lb:http"),
		},
		// TestEndpointSliceWithTerminatingEndpointsTrafficPolicyLocal.
		{
			name: "externalTrafficPolicy Local: local serving terminating endpoint when none local is ready",
			objs: []any{lb(etpLocal), slice4(
				ep("10.180.0.1", onNode("node1"), terminating(true)),
				ep("10.180.0.2", onNode("node1"), terminating(false)),
				ep("10.180.1.1", onNode("node2")))},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: forward("ns1/lb:http", "10.180.0.1:8080"),
		},
		{
			name: "externalTrafficPolicy Local: no local endpoint serves: DROP",
			objs: []any{lb(etpLocal), slice4(
				ep("10.180.0.2", onNode("node1"), terminating(false)),
				ep("10.180.1.1", onNode("node2")))},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: drop("ns1/lb:http"),
		},
		{
			name: "externalTrafficPolicy Local: no usable endpoint anywhere: REJECT",
			objs: []any{lb(etpLocal), slice4(ep("10.180.0.1", onNode("node1"), notReady))},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: reject(service.NoEndpoints, "ns1/lb:http"),
		},
		// TestExternalTrafficPolicyCluster: every node's endpoints.
		{
			name: "externalTrafficPolicy Cluster: the cluster set",
			objs: []any{lb(), remoteOnly, slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: forward("ns1/lb:http", remote...),
		},
		{
			name: "internalTrafficPolicy Local, externalTrafficPolicy Cluster: the NodePort uses the cluster set",
			objs: []any{lb(itpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "internalTrafficPolicy Local, externalTrafficPolicy Cluster: the ClusterIP uses the local endpoint",
			objs: []any{lb(itpLocal), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: cip4 + ":80"},
			want: forward("ns1/lb:http", "10.180.0.1:8080"),
		},
		// TestLoadBalancer's source ranges (KUBE-FW): LB IPs only, per family.
		{
			name: "source ranges: a source inside passes",
			objs: []any{lb(sourceRanges("10.0.0.0/8", " 2001:db8:ff::/48 ")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lb4 + ":80", src: "10.1.2.3"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "source ranges: a source outside is dropped",
			objs: []any{lb(sourceRanges("10.0.0.0/8", " 2001:db8:ff::/48 ")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lb4 + ":80", src: "192.0.2.1"},
			want: outcome{Action: "DROP", Verdict: service.Forward, Port: "ns1/lb:http", Firewalled: true},
		},
		{
			name: "source ranges: the IPv6 port checks the IPv6 range (padded, trimmed)",
			objs: []any{lb(sourceRanges("10.0.0.0/8", " 2001:db8:ff::/48 ")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: "[" + lb6 + "]:80", src: "2001:db8:ff:1::9"},
			want: forward("ns1/lb:http", "[fd00:10:180:1::1]:8080", "[fd00:10:180::1]:8080"),
		},
		{
			name: "source ranges: the IPv6 port drops an IPv6 source outside",
			objs: []any{lb(sourceRanges("10.0.0.0/8", " 2001:db8:ff::/48 ")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: "[" + lb6 + "]:80", src: "2001:db8:fe::9"},
			want: outcome{Action: "DROP", Verdict: service.Forward, Port: "ns1/lb:http", Firewalled: true},
		},
		{
			name: "source ranges of the other family only: the IPv6 LB IP lets every source in",
			objs: []any{lb(sourceRanges("10.0.0.0/8")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: "[" + lb6 + "]:80", src: "2001:db8:fe::9"},
			want: forward("ns1/lb:http", "[fd00:10:180:1::1]:8080", "[fd00:10:180::1]:8080"),
		},
		{
			name: "source ranges do not apply to NodePorts",
			objs: []any{lb(sourceRanges("10.0.0.0/8")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30080", src: "192.0.2.1"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "source ranges do not apply to externalIPs",
			objs: []any{lb(sourceRanges("10.0.0.0/8")), slice4(), slice6},
			flow: extFlow{proto: service.TCP, via: "ip", dst: eip4 + ":80", src: "192.0.2.1"},
			want: forward("ns1/lb:http", both...),
		},
		{
			name: "source ranges, no endpoints: REJECT, no firewall (usesFWChain needs endpoints)",
			objs: []any{lb(sourceRanges("10.0.0.0/8"))},
			flow: extFlow{proto: service.TCP, via: "ip", dst: lb4 + ":80", src: "192.0.2.1"},
			want: reject(service.NoEndpoints, "ns1/lb:http"),
		},
		// Conflicts: two services claim one external IP:port and one
		// NodePort; the lower name wins (as for ClusterIPs in build.go).
		{
			name: "two services on one externalIP:port: the lower name wins",
			objs: conflictObjects(),
			flow: extFlow{proto: service.TCP, via: "ip", dst: "192.168.99.50:80"},
			want: forward("ns1/a:http", "10.180.0.1:80"),
		},
		{
			name: "two services on one NodePort: the lower name wins",
			objs: conflictObjects(),
			flow: extFlow{proto: service.TCP, via: "node4", dst: "30100"},
			want: forward("ns1/a:http", "10.180.0.1:80"),
		},
		{
			name: "the losing service keeps its other ports",
			objs: conflictObjects(),
			flow: extFlow{proto: service.TCP, via: "ip", dst: "192.168.99.50:81"},
			want: forward("ns1/b:alt", "10.180.0.2:81"),
		},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			tr := syncedTracker(t, service.Config{NodeName: "node1"}, r.objs...)
			got := r.flow.run(t, tr.Current())
			if diff := cmp.Diff(r.want, got); diff != "" {
				t.Errorf("flow %+v (-want +got):\n%s", r.flow, diff)
			}
		})
	}
}

// conflictObjects: ns1/a and ns1/b both claim externalIP 192.168.99.50:80
// and NodePort 30100 (TCP); b also has port 81, which a does not.
func conflictObjects() []any {
	v4 := discoveryv1.AddressTypeIPv4
	return []any{
		svc("ns1/b", "172.30.0.52", ports(tcp("http", 80, intstr.FromInt32(80)), tcp("alt", 81, intstr.FromInt32(81))),
			svcType(v1.ServiceTypeNodePort), nodePorts(30100, 30101), externalIPs("192.168.99.50")),
		slice("ns1/b-1", "b", v4, eports(eport("http", v1.ProtocolTCP, 80), eport("alt", v1.ProtocolTCP, 81)), ep("10.180.0.2")),
		svc("ns1/a", "172.30.0.51", ports(tcp("http", 80, intstr.FromInt32(80))),
			svcType(v1.ServiceTypeNodePort), nodePorts(30100), externalIPs("192.168.99.50")),
		slice("ns1/a-1", "a", v4, eports(eport("http", v1.ProtocolTCP, 80)), ep("10.180.0.1")),
	}
}

// TestExternalPortFields: what a Port keeps of a Service's external
// fields, per family, as kube-proxy's newBaseServiceInfo
// (pkg/proxy/serviceport.go) keeps it: MapIPsByIPFamily and
// MapCIDRsByIPFamily split by family and skip invalid entries, ranges are
// trimmed, ingress IPs with ipMode Proxy are left out, ExternalPolicyLocal
// and NeedsHealthCheck follow pkg/api/v1/service/util.go.
func TestExternalPortFields(t *testing.T) {
	s := svc("ns1/lb", "172.30.0.41,fd00::41", ports(tcp("http", 80, intstr.FromInt32(8080)), udp("dns", 53, intstr.FromInt32(53))),
		svcType(v1.ServiceTypeLoadBalancer), dualStack, nodePorts(30080, 70000), etpLocal,
		externalIPs("192.168.99.11", "not-an-ip", "2001:db8::11", "192.168.99.11", "fe80::1%eth0", "::ffff:192.168.99.12"),
		ingress("203.0.113.10", ""), ingress("203.0.113.12", v1.LoadBalancerIPModeProxy), ingress("2001:db8:1::10", v1.LoadBalancerIPModeVIP),
		ingress("", ""),
		sourceRanges(" 10.1.2.3/8", "bogus", "2001:db8:ff::/48", ""),
		func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 })
	tr := syncedTracker(t, service.Config{NodeName: "node1"}, s)
	type fields struct {
		Family       service.Family
		NodePort     uint16
		ExternalIPs  []netip.Addr
		LBIPs        []netip.Addr
		SourceRanges []netip.Prefix
		Local        bool
		HealthCheck  uint16
		Verdict      service.Verdict
	}
	var got []fields
	for _, p := range tr.Current().Service(service.ServiceName{Namespace: "ns1", Name: "lb"}) {
		got = append(got, fields{p.Family, p.NodePort, p.ExternalIPs, p.LoadBalancerIPs, p.SourceRanges,
			p.ExternalPolicyLocal, p.HealthCheckNodePort, p.ExternalVerdict})
	}
	a := netip.MustParseAddr
	pf := netip.MustParsePrefix
	v4 := fields{Family: service.IPv4, ExternalIPs: []netip.Addr{a("192.168.99.11"), a("192.168.99.12")},
		LBIPs: []netip.Addr{a("203.0.113.10")}, SourceRanges: []netip.Prefix{pf("10.0.0.0/8")},
		Local: true, HealthCheck: 32000, Verdict: service.NoEndpoints}
	v6 := fields{Family: service.IPv6, ExternalIPs: []netip.Addr{a("2001:db8::11")},
		LBIPs: []netip.Addr{a("2001:db8:1::10")}, SourceRanges: []netip.Prefix{pf("2001:db8:ff::/48")},
		Local: true, HealthCheck: 32000, Verdict: service.NoEndpoints}
	http4, dns4, http6, dns6 := v4, v4, v6, v6
	http4.NodePort, http6.NodePort = 30080, 30080 // 70000 is out of range: no NodePort
	want := []fields{http4, dns4, http6, dns6}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("Ports (-want +got):\n%s", diff)
	}
	want4 := []netip.Addr{a("192.168.99.11"), a("192.168.99.12"), a("203.0.113.10"), a("2001:db8::11"), a("2001:db8:1::10")}
	if diff := cmp.Diff(want4, tr.Current().ExternalAddrs(), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("ExternalAddrs (-want +got):\n%s", diff)
	}
}

// TestExternalPolicyLocalNeedsExternalDestinations: kube-proxy's
// ExternalPolicyLocal holds only for an externally accessible service
// (pkg/api/v1/service/util.go ExternallyAccessible), and the health check
// port only for a LoadBalancer one (NeedsHealthCheck).
func TestExternalPolicyLocalNeedsExternalDestinations(t *testing.T) {
	hc := func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }
	cases := []struct {
		name      string
		mods      []func(*v1.Service)
		wantLocal bool
		wantHC    uint16
	}{
		{"ClusterIP, no externalIPs", []func(*v1.Service){etpLocal, hc}, false, 0},
		{"ClusterIP with an externalIP", []func(*v1.Service){etpLocal, hc, externalIPs("192.168.99.1")}, true, 0},
		{"NodePort", []func(*v1.Service){svcType(v1.ServiceTypeNodePort), etpLocal, hc}, true, 0},
		{"LoadBalancer", []func(*v1.Service){svcType(v1.ServiceTypeLoadBalancer), etpLocal, hc}, true, 32000},
		{"LoadBalancer, Cluster policy", []func(*v1.Service){svcType(v1.ServiceTypeLoadBalancer), hc}, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := syncedTracker(t, service.Config{}, svc("ns1/web", "172.30.0.41", ports(tcp("http", 80, intstr.FromInt32(80))), c.mods...))
			p := tr.Current().Ports()[0]
			if p.ExternalPolicyLocal != c.wantLocal || p.HealthCheckNodePort != c.wantHC {
				t.Errorf("ExternalPolicyLocal %v HealthCheckNodePort %d, want %v %d", p.ExternalPolicyLocal, p.HealthCheckNodePort, c.wantLocal, c.wantHC)
			}
		})
	}
}

// TestExternalChanges: a change of an external field is a changed port
// (servicechangetracker.go compares the whole ServicePort); ExternalAddrs
// follows, and is shared between tables while it does not change.
func TestExternalChanges(t *testing.T) {
	var rec syncRecorder
	tr := newTracker(t, service.NewManualClock(epoch), 0, &rec)
	lb := func(np int32, lbIPs ...string) *v1.Service {
		mods := []func(*v1.Service){svcType(v1.ServiceTypeLoadBalancer), nodePorts(np)}
		for _, ip := range lbIPs {
			mods = append(mods, ingress(ip, ""))
		}
		return svc("ns1/web", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(8080))), mods...)
	}
	tr.OnServiceAdd(lb(30080, "203.0.113.10", "203.0.113.9"))
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1"))
	tr.OnServiceAdd(svc("ns1/other", "10.96.0.11", ports(udp("dns", 53, intstr.FromInt32(53))), externalIPs("203.0.113.10")))
	tr.OnSynced()
	addrs := func() []string {
		var out []string
		for _, a := range tr.Current().ExternalAddrs() {
			out = append(out, a.String())
		}
		return out
	}
	if diff := cmp.Diff([]string{"203.0.113.9", "203.0.113.10"}, addrs()); diff != "" { // address order, not string order
		t.Errorf("ExternalAddrs: sorted, distinct across services (-want +got):\n%s", diff)
	}

	tr.OnServiceUpdate(nil, lb(30081, "203.0.113.10", "203.0.113.9"))
	c := rec.changes[len(rec.changes)-1]
	if len(c.Ports) != 1 || c.Ports[0].Old.NodePort != 30080 || c.Ports[0].New.NodePort != 30081 {
		t.Fatalf("a NodePort change: %+v", c.Ports)
	}
	if diff := cmp.Diff([]service.ServiceName{{Namespace: "ns1", Name: "web"}}, c.Changed); diff != "" {
		t.Errorf("Changed (-want +got):\n%s", diff)
	}
	if _, v := tr.Current().LookupNodePort(service.TCP, service.IPv4, 30080); v != service.NotService {
		t.Errorf("the old NodePort still answers %v", v)
	}
	if p, v := tr.Current().LookupNodePort(service.TCP, service.IPv4, 30081); v != service.Forward || p.Name.Name != "web" {
		t.Errorf("the new NodePort answers %v %v", p, v)
	}
	if len(rec.tables) < 2 || &rec.tables[len(rec.tables)-1].ExternalAddrs()[0] != &rec.tables[len(rec.tables)-2].ExternalAddrs()[0] {
		t.Error("ExternalAddrs copied though it did not change")
	}

	// The LB IP that only web had leaves; the one other shares stays.
	tr.OnServiceUpdate(nil, lb(30081, "203.0.113.10"))
	if diff := cmp.Diff([]string{"203.0.113.10"}, addrs()); diff != "" {
		t.Errorf("ExternalAddrs after an LB IP left (-want +got):\n%s", diff)
	}
	if _, v := tr.Current().LookupExternal(service.TCP, netip.MustParseAddr("203.0.113.9"), 80); v != service.NotService {
		t.Errorf("the removed LB IP answers %v", v)
	}
	tr.OnServiceDelete(lb(30081))
	if diff := cmp.Diff([]string{"203.0.113.10"}, addrs()); diff != "" {
		t.Errorf("ExternalAddrs after web left (-want +got):\n%s", diff)
	}
	if _, v := tr.Current().LookupExternal(service.TCP, netip.MustParseAddr("203.0.113.10"), 80); v != service.UnknownPort {
		t.Errorf("other's externalIP on web's old port answers %v, want UnknownPort", v)
	}
	tr.OnServiceDelete(svc("ns1/other", "10.96.0.11", nil))
	if got := tr.Current().ExternalAddrs(); got != nil {
		t.Errorf("ExternalAddrs with no service: %v", got)
	}
}

// TestExternalConflictLoserTakesOver: as TestTrackerConflictingClusterIPs,
// for an externalIP:port and a NodePort.
func TestExternalConflictLoserTakesOver(t *testing.T) {
	objs := conflictObjects()
	tr := syncedTracker(t, service.Config{}, objs...)
	tr.OnServiceDelete(objs[2].(*v1.Service)) // ns1/a
	ip := netip.MustParseAddr("192.168.99.50")
	if p, _ := tr.Current().LookupExternal(service.TCP, ip, 80); p == nil || p.Name.Name != "b" {
		t.Errorf("externalIP: the loser takes over, got %v", p)
	}
	if p, _ := tr.Current().LookupNodePort(service.TCP, service.IPv4, 30100); p == nil || p.Name.Name != "b" {
		t.Errorf("NodePort: the loser takes over, got %v", p)
	}
}

// TestExternalNoLocalEndpointsStats: sync_proxy_rules_no_local_endpoints_total
// {traffic_policy="external"} counts the service ports (per family) whose
// external traffic drops for want of a local endpoint (proxier.go
// serviceNoLocalEndpointsTotalExternal), apart from the internal count.
func TestExternalNoLocalEndpointsStats(t *testing.T) {
	v4, v6 := discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	p := eports(eport("http", v1.ProtocolTCP, 80))
	s := svc("ns1/web", "172.30.0.41,fd00::41", ports(tcp("http", 80, intstr.FromInt32(80))),
		svcType(v1.ServiceTypeNodePort), dualStack, nodePorts(30080), etpLocal)
	remote4 := slice("ns1/web-v4", "web", v4, p, ep("10.0.0.2", onNode("node2")))
	remote6 := slice("ns1/web-v6", "web", v6, p, ep("fd00::2", onNode("node2")))
	tr := syncedTracker(t, service.Config{NodeName: "node1"}, s, remote4, remote6,
		svc("ns1/itp", "172.30.0.42", ports(tcp("http", 80, intstr.FromInt32(80))), itpLocal),
		slice("ns1/itp-1", "itp", v4, p, ep("10.0.0.3", onNode("node2"))),
		// Local policy, but no endpoint anywhere: REJECT, not counted.
		svc("ns1/empty", "172.30.0.43", ports(tcp("http", 80, intstr.FromInt32(80))), svcType(v1.ServiceTypeNodePort), nodePorts(30081), etpLocal))
	if got, want := tr.Stats().NoLocalEndpoints, (service.NoLocalEndpointsCount{Internal: 1, External: 2}); got != want {
		t.Errorf("NoLocalEndpoints %+v, want %+v", got, want)
	}
	tr.OnEndpointSliceUpdate(nil, slice("ns1/web-v4", "web", v4, p, ep("10.0.0.2", onNode("node2")), ep("10.0.0.1", onNode("node1"))))
	if got, want := tr.Stats().NoLocalEndpoints, (service.NoLocalEndpointsCount{Internal: 1, External: 1}); got != want {
		t.Errorf("after a local IPv4 endpoint came: NoLocalEndpoints %+v, want %+v", got, want)
	}
	tr.OnServiceDelete(s)
	if got, want := tr.Stats().NoLocalEndpoints, (service.NoLocalEndpointsCount{Internal: 1}); got != want {
		t.Errorf("after the service left: NoLocalEndpoints %+v, want %+v", got, want)
	}
}

// TestExternalChangesReportEveryUsableSet: EndpointsAdded and
// EndpointsRemoved cover the external and cluster sets as well as the
// internal one (kube-proxy keeps a KUBE-SEP chain, and its recent list,
// while any policy chain uses the endpoint).
func TestExternalChangesReportEveryUsableSet(t *testing.T) {
	var rec syncRecorder
	tr := newTracker(t, service.NewManualClock(epoch), 0, &rec)
	s := svc("ns1/web", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(8080))), itpLocal,
		svcType(v1.ServiceTypeNodePort), nodePorts(30080))
	mk := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice("ns1/web-1", "web", discoveryv1.AddressTypeIPv4, eports(eport("http", v1.ProtocolTCP, 8080)), eps...)
	}
	tr.OnServiceAdd(s)
	tr.OnEndpointSliceAdd(mk(ep("10.0.0.1", onNode("node1")), ep("10.0.0.2", onNode("node2"))))
	tr.OnSynced()
	c := rec.changes[len(rec.changes)-1]
	if len(c.Ports) != 1 || cmp.Diff([]string{"10.0.0.1:8080", "10.0.0.2:8080"}, c.Ports[0].EndpointsAdded) != "" {
		t.Fatalf("first table: %+v", c.Ports)
	}
	// The remote endpoint leaves: only the NodePort (cluster set) used it.
	tr.OnEndpointSliceUpdate(nil, mk(ep("10.0.0.1", onNode("node1"))))
	c = rec.changes[len(rec.changes)-1]
	if len(c.Ports) != 1 || cmp.Diff([]string{"10.0.0.2:8080"}, c.Ports[0].EndpointsRemoved) != "" || c.Ports[0].EndpointsAdded != nil {
		t.Errorf("remote endpoint left: %+v", c.Ports)
	}
}

// TestExternalLookupsDoNotAllocate: LookupExternal and LookupNodePort are
// on the datapath's fast path, like Lookup.
func TestExternalLookupsDoNotAllocate(t *testing.T) {
	tr := syncedTracker(t, service.Config{}, conflictObjects()...)
	tbl := tr.Current()
	ip := netip.MustParseAddr("192.168.99.50")
	n := testing.AllocsPerRun(100, func() {
		tbl.LookupExternal(service.TCP, ip, 80)
		tbl.LookupExternal(service.TCP, ip, 82)
		tbl.LookupNodePort(service.TCP, service.IPv4, 30100)
		tbl.ExternalAddrs()
	})
	if n != 0 {
		t.Errorf("%v allocations per lookup round", n)
	}
}

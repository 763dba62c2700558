package service_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// outcome is what the datapath would do with a new flow: forward to one of
// Endpoints (in cascade order), REJECT or DROP.
type outcome struct {
	Action    string // "FORWARD", "REJECT" or "DROP"
	Verdict   service.Verdict
	Port      string // the answering Port's name, if any
	Endpoints []string
	Affinity  service.Affinity
	// Firewalled: dropped by loadBalancerSourceRanges (external_test.go).
	Firewalled bool
}

func forward(port string, eps ...string) outcome {
	return outcome{Action: "FORWARD", Verdict: service.Forward, Port: port, Endpoints: eps}
}

func forwardSticky(port string, timeout time.Duration, eps ...string) outcome {
	o := forward(port, eps...)
	o.Affinity = service.Affinity{ClientIP: true, Timeout: timeout}
	return o
}

func reject(v service.Verdict, port string) outcome {
	return outcome{Action: "REJECT", Verdict: v, Port: port}
}

func drop(port string) outcome {
	return outcome{Action: "DROP", Verdict: service.NoLocalEndpoints, Port: port}
}

func lookup(t *testing.T, tbl *service.Table, proto service.Protocol, dst string) outcome {
	t.Helper()
	ap := addrPort(t, dst)
	p, v := tbl.Lookup(proto, ap.Addr(), ap.Port())
	var o outcome
	o.Verdict = v
	switch {
	case v == service.Forward:
		o.Action = "FORWARD"
	case v.Drop():
		o.Action = "DROP"
	case v.Reject():
		o.Action = "REJECT"
	default:
		t.Fatalf("verdict %v is neither forward, drop nor reject", v)
	}
	if p != nil {
		o.Port = p.Name.String()
		o.Endpoints = p.EndpointKeys
		o.Affinity = p.Affinity
		if p.Verdict != v {
			t.Errorf("Lookup verdict %v differs from Port.Verdict %v", v, p.Verdict)
		}
		if len(p.Endpoints) != len(p.EndpointKeys) {
			t.Fatalf("%d endpoints but %d keys", len(p.Endpoints), len(p.EndpointKeys))
		}
		for i := range p.Endpoints {
			if k := p.Endpoints[i].Key(); k != p.EndpointKeys[i] {
				t.Errorf("EndpointKeys[%d] = %q, Endpoints[%d].Key() = %q", i, p.EndpointKeys[i], i, k)
			}
		}
	} else if v == service.Forward || v.Drop() || v == service.NoEndpoints {
		t.Errorf("verdict %v without a Port", v)
	}
	return o
}

// TestPacketFlows is the kube-proxy packet-flow test rewritten against the
// Table: each row sets up Services and EndpointSlices, the node and its
// zone, then sends a new flow from a client to a destination and expects
// the ordered endpoints the cascade would walk, or REJECT, or DROP.
// Rows name the kube-proxy test they follow (pkg/proxy/iptables/proxier_test.go
// unless said otherwise; topology cases follow pkg/proxy/topology_test.go
// TestCategorizeEndpoints).
func TestPacketFlows(t *testing.T) {
	const (
		ip1 = "172.30.0.41"
		ip2 = "172.30.0.42"
		v6  = "fd00:172:30::41"
	)
	v4 := discoveryv1.AddressTypeIPv4
	tcp80 := eports(eport("http", v1.ProtocolTCP, 80))
	web := func(mods ...func(*v1.Service)) *v1.Service {
		return svc("ns1/web", ip1, ports(tcp("http", 80, intstr.FromInt32(80))), mods...)
	}
	webSlice := func(name string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return slice("ns1/"+name, "web", v4, tcp80, eps...)
	}

	rows := []struct {
		name   string
		objs   []any
		node   string
		zone   string
		client string // the flow's source; selection must not depend on it
		proto  service.Protocol
		dst    string
		want   outcome
	}{
		// TestClusterIPGeneral "simple clusterIP".
		{
			name:   "simple clusterIP",
			objs:   []any{web(), webSlice("web-1", ep("10.180.0.1"))},
			client: "10.180.0.2", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80"),
		},
		// TestNoEndpointsReject's premise: no service at all answers REJECT
		// (DESIGN.md: a ClusterIP-range packet matching nothing is refused).
		{
			name:   "no service",
			objs:   []any{web(), webSlice("web-1", ep("10.180.0.1"))},
			client: "10.180.0.2", proto: service.TCP, dst: "172.30.0.99:80",
			want: reject(service.NotService, ""),
		},
		{
			name:   "no service, empty table",
			client: "10.180.0.2", proto: service.UDP, dst: ip1 + ":53",
			want: reject(service.NotService, ""),
		},
		// TestClusterIPGeneral "svc1 does not accept svc2's ports".
		{
			name: "unknown port on a known ClusterIP",
			objs: []any{
				web(), webSlice("web-1", ep("10.180.0.1")),
				svc("ns2/other", ip2, ports(tcp("https", 443, intstr.FromInt32(8443)))),
			},
			client: "10.180.0.2", proto: service.TCP, dst: ip1 + ":443",
			want: reject(service.UnknownPort, ""),
		},
		// TestClusterIPGeneral "TCP-only port does not match UDP traffic".
		{
			name:   "TCP-only port probed with UDP",
			objs:   []any{web(), webSlice("web-1", ep("10.180.0.1"))},
			client: "10.180.0.2", proto: service.UDP, dst: ip1 + ":80",
			want: reject(service.UnknownPort, ""),
		},
		// TestClusterIPGeneral "clusterIP with TCP, UDP, and SCTP on same port (TCP)".
		{
			name:   "same port number on TCP and UDP: TCP",
			objs:   dnsObjects(ip2),
			client: "10.180.0.2", proto: service.TCP, dst: ip2 + ":53",
			want: forward("ns2/dns:dns-tcp", "10.180.0.1:5353", "10.180.2.1:5353"),
		},
		// ... "(UDP)".
		{
			name:   "same port number on TCP and UDP: UDP",
			objs:   dnsObjects(ip2),
			client: "10.180.0.2", proto: service.UDP, dst: ip2 + ":53",
			want: forward("ns2/dns:dns-udp", "10.180.0.1:53", "10.180.2.1:53"),
		},
		// TestClusterIPGeneral "clusterIP with TargetPort".
		{
			name: "numeric targetPort through the slice port",
			objs: []any{
				svc("ns1/web", ip1, ports(tcp("https", 443, intstr.FromInt32(8443)))),
				slice("ns1/web-1", "web", v4, eports(eport("https", v1.ProtocolTCP, 8443)), ep("10.180.0.1"), ep("10.180.2.1")),
			},
			client: "10.180.0.2", proto: service.TCP, dst: ip1 + ":443",
			want: forward("ns1/web:https", "10.180.0.1:8443", "10.180.2.1:8443"),
		},
		// A named targetPort is resolved per pod by the EndpointSlice
		// controller: pods exposing "web" on different numbers land in
		// different slices (endpointslicecache.go endpointInfoByServicePort).
		{
			name: "targetPort by name, resolved differently per slice",
			objs: []any{
				svc("ns1/web", ip1, ports(tcp("http", 80, intstr.FromString("web")))),
				slice("ns1/web-a", "web", v4, eports(eport("http", v1.ProtocolTCP, 8080)), ep("10.180.0.1")),
				slice("ns1/web-b", "web", v4, eports(eport("http", v1.ProtocolTCP, 9090)), ep("10.180.0.2")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:8080", "10.180.0.2:9090"),
		},
		{
			name: "slice port of another name is not used",
			objs: []any{
				svc("ns1/web", ip1, ports(tcp("http", 80, intstr.FromString("web")))),
				slice("ns1/web-a", "web", v4, eports(eport("metrics", v1.ProtocolTCP, 9100)), ep("10.180.0.1")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
		// endpointslicecache_test.go "2 slices, same port": endpoints merge.
		{
			name: "two slices for one service",
			objs: []any{web(),
				webSlice("web-b", ep("10.180.0.3")),
				webSlice("web-a", ep("10.180.0.1"), ep("10.180.0.2")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80", "10.180.0.2:80", "10.180.0.3:80"),
		},
		// endpointslicecache_test.go "2 overlapping slices": de-duplicated.
		{
			name: "duplicate endpoint across slices",
			objs: []any{web(),
				webSlice("web-a", ep("10.180.0.1"), ep("10.180.0.2")),
				webSlice("web-b", ep("10.180.0.2"), ep("10.180.0.3")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80", "10.180.0.2:80", "10.180.0.3:80"),
		},
		{
			name: "duplicate endpoint: the ready copy in the first slice wins",
			objs: []any{web(),
				webSlice("web-a", ep("10.180.0.2")),
				webSlice("web-b", ep("10.180.0.2", notReady), ep("10.180.0.3")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.2:80", "10.180.0.3:80"),
		},
		// endpointslicecache.go addEndpoints: a local copy is preferred.
		{
			name: "duplicate endpoint: the local copy wins",
			objs: []any{web(itpLocal),
				webSlice("web-a", ep("10.180.0.2", onNode("node2"))),
				webSlice("web-b", ep("10.180.0.2", onNode("node1"))),
			},
			node: "node1", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.2:80"),
		},
		// endpointslicecache.go byEndpoint: the order is the string order,
		// where ':' sorts after every digit.
		{
			name: `sort order "10.0.0.10:80" before "10.0.0.2:80"`,
			objs: []any{web(),
				webSlice("web-1", ep("10.0.0.2"), ep("10.0.0.10"), ep("10.0.0.1"), ep("10.0.0.100")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.0.0.100:80", "10.0.0.10:80", "10.0.0.1:80", "10.0.0.2:80"),
		},
		// TestCategorizeEndpoints "should ignore non-ready endpoints".
		{
			name:   "not-ready endpoints are left out",
			objs:   []any{web(), webSlice("web-1", ep("10.180.0.1"), ep("10.180.0.2", notReady), ep("10.180.0.3"))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80", "10.180.0.3:80"),
		},
		// TestNoEndpointsReject-like: a service whose endpoints are all
		// unusable rejects.
		{
			name:   "only not-ready endpoints: REJECT",
			objs:   []any{web(), webSlice("web-1", ep("10.180.0.1", notReady), ep("10.180.0.2", terminating(false)))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
		{
			name:   "no slices at all: REJECT",
			objs:   []any{web()},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
		// TestEndpointSliceWithTerminatingEndpointsTrafficPolicyCluster.
		{
			name: "terminating fallback: serving terminating endpoints when none is ready",
			objs: []any{web(), webSlice("web-1",
				ep("10.180.0.1", terminating(true)),
				ep("10.180.0.2", terminating(false)),
				ep("10.180.0.3", terminating(true)),
				ep("10.180.0.4", notReady))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80", "10.180.0.3:80"),
		},
		{
			name: "terminating endpoints unused while one is ready",
			objs: []any{web(), webSlice("web-1",
				ep("10.180.0.1", terminating(true)),
				ep("10.180.0.2"))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.2:80"),
		},
		// TestInternalTrafficPolicy "internalTrafficPolicy is local and
		// there are local endpoints".
		{
			name: "internalTrafficPolicy Local with local endpoints",
			objs: []any{web(itpLocal), webSlice("web-1",
				ep("10.180.0.1", onNode("node1")),
				ep("10.180.1.1", onNode("node2")),
				ep("10.180.0.2", onNode("node1")))},
			node: "node1", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80", "10.180.0.2:80"),
		},
		// ... "there are no local endpoints": DROP.
		{
			name: "internalTrafficPolicy Local without local endpoints: DROP",
			objs: []any{web(itpLocal), webSlice("web-1",
				ep("10.180.1.1", onNode("node2")),
				ep("10.180.2.1", onNode("node3")))},
			node: "node1", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: drop("ns1/web:http"),
		},
		{
			name:   "internalTrafficPolicy Local, no node name: nothing is local, DROP",
			objs:   []any{web(itpLocal), webSlice("web-1", ep("10.180.1.1", onNode("node2")))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: drop("ns1/web:http"),
		},
		// proxier.go: no endpoints anywhere rejects before the local check.
		{
			name: "internalTrafficPolicy Local and no endpoints anywhere: REJECT",
			objs: []any{web(itpLocal), webSlice("web-1", ep("10.180.0.1", onNode("node1"), notReady))},
			node: "node1", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
		// TestEndpointSliceWithTerminatingEndpointsTrafficPolicyLocal.
		{
			name: "internalTrafficPolicy Local: local terminating fallback beats remote ready",
			objs: []any{web(itpLocal), webSlice("web-1",
				ep("10.180.0.1", onNode("node1"), terminating(true)),
				ep("10.180.0.2", onNode("node1"), terminating(false)),
				ep("10.180.1.1", onNode("node2")))},
			node: "node1", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80"),
		},
		{
			name: "internalTrafficPolicy Local ignores zone hints",
			objs: []any{web(itpLocal), webSlice("web-1",
				ep("10.180.0.1", onNode("node1"), zoneHints("zone-b")),
				ep("10.180.1.1", onNode("node2"), zoneHints("zone-a")))},
			node: "node1", zone: "zone-a", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80"),
		},
		// TestCategorizeEndpoints "hints enabled, hints annotation == auto".
		{
			name: "zone hints honoured",
			objs: []any{web(), webSlice("web-1",
				ep("10.1.2.3", inZone("zone-a"), zoneHints("zone-a")),
				ep("10.1.2.4", inZone("zone-b"), zoneHints("zone-b")),
				ep("10.1.2.5", inZone("zone-c"), zoneHints("zone-c")),
				ep("10.1.2.6", inZone("zone-a"), zoneHints("zone-a")))},
			node: "node1", zone: "zone-a", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.1.2.3:80", "10.1.2.6:80"),
		},
		// ... "missing hints, fall back to cluster-wide endpoints".
		{
			name: "zone hints ignored: one ready endpoint has none",
			objs: []any{web(), webSlice("web-1",
				ep("10.1.2.3", zoneHints("zone-a")),
				ep("10.1.2.4", zoneHints("zone-b")),
				ep("10.1.2.5"))},
			node: "node1", zone: "zone-a", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.1.2.3:80", "10.1.2.4:80", "10.1.2.5:80"),
		},
		// ... "hints, no hints for this zone".
		{
			name: "zone hints ignored: none names this node's zone",
			objs: []any{web(), webSlice("web-1",
				ep("10.1.2.3", zoneHints("zone-b")),
				ep("10.1.2.4", zoneHints("zone-c")))},
			node: "node1", zone: "zone-a", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.1.2.3:80", "10.1.2.4:80"),
		},
		// ... "node without zone label": hints cannot apply.
		{
			name: "zone hints ignored: this node's zone is unknown",
			objs: []any{web(), webSlice("web-1",
				ep("10.1.2.3", zoneHints("zone-a")),
				ep("10.1.2.4", zoneHints("zone-b")))},
			node: "node1", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.1.2.3:80", "10.1.2.4:80"),
		},
		// ... "hints, only from terminating endpoints": hints of non-ready
		// endpoints do not count, and the fallback ignores hints.
		{
			name: "zone hints ignored by the terminating fallback",
			objs: []any{web(), webSlice("web-1",
				ep("10.1.2.3", terminating(true), zoneHints("zone-b")),
				ep("10.1.2.4", terminating(true), zoneHints("zone-a")))},
			node: "node1", zone: "zone-a", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.1.2.3:80", "10.1.2.4:80"),
		},
		// ... PreferSameNode: node hints win over zone hints.
		{
			name: "node hints honoured",
			objs: []any{web(), webSlice("web-1",
				ep("10.1.2.3", nodeHints("node1"), zoneHints("zone-a")),
				ep("10.1.2.4", nodeHints("node2"), zoneHints("zone-a")))},
			node: "node1", zone: "zone-a", client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.1.2.3:80"),
		},
		// TestNodePorts (ipv6 cases) and dual-stack: one proxier per family.
		{
			name:   "dual-stack: IPv4 ClusterIP uses IPv4 endpoints",
			objs:   dualStackObjects(ip1, v6),
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80", "10.180.0.2:80"),
		},
		{
			name:   "dual-stack: IPv6 ClusterIP uses IPv6 endpoints, string order",
			objs:   dualStackObjects(ip1, v6),
			client: "fd00:10::9", proto: service.TCP, dst: "[" + v6 + "]:80",
			want: forward("ns1/web:http", "[fd00:10:180::10]:80", "[fd00:10:180::2]:80"),
		},
		{
			name: "dual-stack: IPv6 ClusterIP without IPv6 endpoints: REJECT",
			objs: []any{
				svc("ns1/web", ip1+","+v6, ports(tcp("http", 80, intstr.FromInt32(80)))),
				webSlice("web-v4", ep("10.180.0.1")),
			},
			client: "fd00:10::9", proto: service.TCP, dst: "[" + v6 + "]:80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
		// servicechangetracker.go: ShouldSkipService.
		{
			name: "headless service is skipped",
			objs: []any{
				svc("ns1/db", "None", ports(tcp("pg", 5432, intstr.FromInt32(5432)))),
				slice("ns1/db-1", "db", v4, eports(eport("pg", v1.ProtocolTCP, 5432)), ep("10.180.0.1")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: "10.180.0.1:5432",
			want: reject(service.NotService, ""),
		},
		// cmd/kube-proxy/app/server.go: kube-proxy's EndpointSlice informer
		// never sees a slice labelled service.kubernetes.io/headless
		// (labelSelectorNoHeadlessEndpoints); ours does, for cluster DNS, so
		// the Tracker leaves such a slice out of the datapath, whatever its
		// service.
		{
			name: "a slice labelled headless gives no endpoints to a ClusterIP service",
			objs: []any{
				web(),
				webSlice("web-1", ep("10.180.0.1")),
				func() *discoveryv1.EndpointSlice {
					es := webSlice("web-2", ep("10.180.0.2"))
					es.Labels[v1.IsHeadlessService] = ""
					return es
				}(),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80"),
		},
		{
			name: "ExternalName service is skipped even with a ClusterIP",
			objs: []any{
				svc("ns1/ext", ip1, ports(tcp("http", 80, intstr.FromInt32(80))), func(s *v1.Service) {
					s.Spec.Type = v1.ServiceTypeExternalName
					s.Spec.ExternalName = "example.com"
				}),
				slice("ns1/ext-1", "ext", v4, tcp80, ep("10.180.0.1")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NotService, ""),
		},
		{
			name: "SCTP port skipped, TCP port of the same service served",
			objs: []any{
				svc("ns1/web", ip1, ports(sctp("sig", 80), tcp("http", 80, intstr.FromInt32(80)))),
				webSlice("web-1", ep("10.180.0.1")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forward("ns1/web:http", "10.180.0.1:80"),
		},
		{
			name: "FQDN slices are ignored",
			objs: []any{web(),
				slice("ns1/web-fqdn", "web", discoveryv1.AddressTypeFQDN, tcp80, ep("web.example.com")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
		// TestSessionAffinity-style: timeout defaulted to 10800 s.
		{
			name:   "session affinity, default timeout",
			objs:   []any{web(clientIP(0)), webSlice("web-1", ep("10.180.0.1"), ep("10.180.0.2"))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forwardSticky("ns1/web:http", 10800*time.Second, "10.180.0.1:80", "10.180.0.2:80"),
		},
		{
			name:   "session affinity, explicit timeout",
			objs:   []any{web(clientIP(60)), webSlice("web-1", ep("10.180.0.1"))},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: forwardSticky("ns1/web:http", 60*time.Second, "10.180.0.1:80"),
		},
		{
			name: "unnamed single port",
			objs: []any{
				svc("ns1/plain", ip2, ports(tcp("", 8080, intstr.FromInt32(80)))),
				slice("ns1/plain-1", "plain", v4, eports(eport("", v1.ProtocolTCP, 80)), ep("10.180.0.1")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip2 + ":8080",
			want: forward("ns1/plain", "10.180.0.1:80"),
		},
		{
			name: "slice of another namespace is not used",
			objs: []any{web(),
				slice("ns2/web-1", "web", v4, tcp80, ep("10.180.0.1")),
			},
			client: "10.180.0.9", proto: service.TCP, dst: ip1 + ":80",
			want: reject(service.NoEndpoints, "ns1/web:http"),
		},
	}
	if len(rows) < 25 {
		t.Fatalf("only %d rows", len(rows))
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			if r.client == "" || strings.Contains(r.dst, " ") {
				t.Fatal("bad row")
			}
			tr := syncedTracker(t, service.Config{NodeName: r.node, Zone: r.zone}, r.objs...)
			got := lookup(t, tr.Current(), r.proto, r.dst)
			if diff := cmp.Diff(r.want, got); diff != "" {
				t.Errorf("flow %s -> %s/%s (-want +got):\n%s", r.client, r.dst, r.proto, diff)
			}
			checkLeftOut(t, tr, r.proto, r.dst)
			checkExplain(t, tr, r.client, r.proto, r.dst, r.want)
		})
	}
}

// checkExplain holds userproxy explain (proxy.Explain on the row's table)
// to the row's outcome: the same action, and for FORWARD the same
// endpoints in cascade order.
func checkExplain(t *testing.T, tr *service.Tracker, client string, proto service.Protocol, dst string, want outcome) {
	t.Helper()
	px, err := proxy.New(proxy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	px.SetTable(tr.Current(), service.Changes{})
	ex := px.Explain(proxy.ExplainQuery{Protocol: proto, Client: netip.MustParseAddr(client), Destination: addrPort(t, dst), LeftOut: tr.LeftOut})
	var eps []string
	for _, e := range ex.Endpoints {
		eps = append(eps, e.Address)
	}
	if ex.Verdict != want.Action || !slices.Equal(eps, want.Endpoints) {
		t.Errorf("explain %s -> %s/%s: %s %v, the row says %s %v\n%s", client, dst, proto, ex.Verdict, eps, want.Action, want.Endpoints, strings.Join(ex.Steps, "\n"))
	}
}

// checkLeftOut holds userproxy explain's account of the endpoints to the
// table on a packet-flow row: an endpoint it says is left out is not in
// the set the flow picks from, and each has a reason of categorize's.
func checkLeftOut(t *testing.T, tr *service.Tracker, proto service.Protocol, dst string) {
	t.Helper()
	ap := addrPort(t, dst)
	p, _ := tr.Current().Lookup(proto, ap.Addr(), ap.Port())
	if p == nil {
		return
	}
	for _, lo := range tr.LeftOut(p, p.Endpoints, false) {
		if slices.Contains(p.EndpointKeys, lo.Endpoint.Key()) {
			t.Errorf("%s: %s is in the set, yet explained as left out: %s", dst, lo.Endpoint.Key(), lo.Why)
		}
		if lo.Why == "" || lo.Why == "not in this set" {
			t.Errorf("%s: %s left out without a reason", dst, lo.Endpoint.Key())
		}
	}
}

// dnsObjects is TestClusterIPGeneral's svc2: TCP and UDP (and SCTP) on 53.
func dnsObjects(ip string) []any {
	return []any{
		svc("ns2/dns", ip, ports(
			udp("dns-udp", 53, intstr.FromInt32(53)),
			tcp("dns-tcp", 53, intstr.FromInt32(5353)),
			sctp("dns-sctp", 53),
		)),
		slice("ns2/dns-1", "dns", discoveryv1.AddressTypeIPv4, eports(
			eport("dns-udp", v1.ProtocolUDP, 53),
			eport("dns-tcp", v1.ProtocolTCP, 5353),
			eport("dns-sctp", v1.ProtocolSCTP, 53),
		), ep("10.180.2.1", onNode("node2")), ep("10.180.0.1", onNode("node1"))),
	}
}

func dualStackObjects(ip4, ip6 string) []any {
	p := eports(eport("http", v1.ProtocolTCP, 80))
	return []any{
		svc("ns1/web", ip4+","+ip6, ports(tcp("http", 80, intstr.FromInt32(80))), func(s *v1.Service) {
			s.Spec.IPFamilies = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}
		}),
		slice("ns1/web-v4", "web", discoveryv1.AddressTypeIPv4, p, ep("10.180.0.2"), ep("10.180.0.1")),
		slice("ns1/web-v6", "web", discoveryv1.AddressTypeIPv6, p, ep("fd00:10:180::2"), ep("fd00:10:180::10")),
	}
}

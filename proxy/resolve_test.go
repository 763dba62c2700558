package proxy

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// Rows of external flows through Admit and route (resolve.go), after
// kube-proxy's packet-flow tests for external destinations
// (pkg/proxy/iptables/proxier_test.go): which endpoints a flow can reach,
// or whether it is refused or dropped.
func TestResolveExternalFlows(t *testing.T) {
	host := netip.MustParseAddr("192.0.2.100") // this host's own address
	seed := uint64(16)
	t.Logf("seed %d", seed)
	p, tr, _ := newTestProxyWith(t, Config{Rand: balancer.NewSeededSource(seed), LocalSource: func(a netip.Addr) bool { return a == host }}, true)
	lb := func(local bool, ranges ...string) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalIPs = []string{"203.0.113.10"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.10"}}
			s.Spec.LoadBalancerSourceRanges = ranges
			if local {
				s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			}
		}
	}
	mixed := func(name, sliceName string) *discoveryv1.EndpointSlice {
		es := slice(name, sliceName, v1.ProtocolTCP, 8080, "node-a", "10.0.0.1")
		other := slice(name, sliceName, v1.ProtocolTCP, 8080, "node-b", "10.0.0.2")
		es.Endpoints = append(es.Endpoints, other.Endpoints...)
		return es
	}
	tr.OnServiceAdd(svc("cluster", "10.96.0.1", v1.ProtocolTCP, 80, lb(false, "192.0.2.0/28")))
	tr.OnEndpointSliceAdd(mixed("cluster", "cluster-1"))
	svcLocal := svc("local", "10.96.0.2", v1.ProtocolTCP, 81, lb(true))
	svcLocal.Spec.ExternalIPs = []string{"203.0.113.11"}
	svcLocal.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.11"}}
	svcLocal.Spec.Ports[0].NodePort = 30081
	tr.OnServiceAdd(svcLocal)
	tr.OnEndpointSliceAdd(mixed("local", "local-1"))
	svcRemote := svc("remote", "10.96.0.3", v1.ProtocolTCP, 82, lb(true))
	svcRemote.Spec.ExternalIPs = []string{"203.0.113.12"}
	svcRemote.Status.LoadBalancer.Ingress = nil
	svcRemote.Spec.Ports[0].NodePort = 30082
	tr.OnServiceAdd(svcRemote)
	tr.OnEndpointSliceAdd(slice("remote", "remote-1", v1.ProtocolTCP, 8080, "node-b", "10.0.0.2"))
	svcNone := svc("none", "10.96.0.4", v1.ProtocolTCP, 83)
	svcNone.Spec.ExternalIPs = []string{"203.0.113.13"}
	tr.OnServiceAdd(svcNone)
	tr.OnSynced()

	outside := netip.MustParseAddr("203.0.113.200")
	inRange := netip.MustParseAddr("192.0.2.5")
	tests := []struct {
		name string
		src  netip.Addr
		dst  string
		want netstack.Decision
		eps  []string // the endpoints 40 picks reach (sorted), when accepted
	}{
		{"ClusterIP: both endpoints", outside, "10.96.0.1:80", netstack.Accept, []string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"externalIP, Cluster policy: both", outside, "203.0.113.10:80", netstack.Accept, []string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"LB IP from inside the source ranges", inRange, "198.51.100.10:80", netstack.Accept, []string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"LB IP from outside the source ranges: dropped", outside, "198.51.100.10:80", netstack.Drop, nil},
		{"externalIP is not filtered by the source ranges", outside, "203.0.113.10:80", netstack.Accept, []string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"external IP, unknown port: rejected", outside, "203.0.113.10:81", netstack.Reject, nil},
		{"Local policy: only the local endpoint", outside, "198.51.100.11:81", netstack.Accept, []string{"10.0.0.1:8080"}},
		{"Local policy, externalIP: only the local endpoint", outside, "203.0.113.11:81", netstack.Accept, []string{"10.0.0.1:8080"}},
		{"Local policy from this host: short-circuit to both", host, "198.51.100.11:81", netstack.Accept, []string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"Local policy, no local endpoint: dropped", outside, "203.0.113.12:82", netstack.Drop, nil},
		{"Local policy, no local endpoint, from this host: the remote one", host, "203.0.113.12:82", netstack.Accept, []string{"10.0.0.2:8080"}},
		{"no endpoints: rejected", outside, "203.0.113.13:83", netstack.Reject, nil},
		{"not a service address: rejected", outside, "203.0.113.99:80", netstack.Reject, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			flow := conntrack.MakeTuple(conntrack.TCP, netip.AddrPortFrom(tc.src, 40000), netip.MustParseAddrPort(tc.dst))
			// userproxy explain agrees with the datapath: its verdict and
			// endpoints are Admit's and route's.
			ex := p.Explain(ExplainQuery{Protocol: service.TCP, Client: tc.src, Destination: netip.MustParseAddrPort(tc.dst), LeftOut: tr.LeftOut})
			if want := map[netstack.Decision]string{netstack.Accept: "FORWARD", netstack.Reject: "REJECT", netstack.Drop: "DROP"}[tc.want]; ex.Verdict != want {
				t.Errorf("Explain verdict %s, want %s: %+v", ex.Verdict, want, ex)
			}
			var explained []string
			for _, e := range ex.Endpoints {
				explained = append(explained, e.Address)
			}
			if slices.Sort(explained); !slices.Equal(explained, tc.eps) {
				t.Errorf("Explain endpoints %v, want %v", explained, tc.eps)
			}
			if got := p.Admit(flow); got != tc.want {
				t.Fatalf("Admit = %v, want %v", got, tc.want)
			}
			if tc.want != netstack.Accept {
				return
			}
			seen := map[string]bool{}
			for i := range 40 {
				f := conntrack.MakeTuple(conntrack.TCP, netip.AddrPortFrom(tc.src, uint16(40000+i)), netip.MustParseAddrPort(tc.dst))
				pk, v := p.route(service.TCP, f)
				if v != service.Forward || !pk.ok {
					t.Fatalf("route: %v %+v", v, pk)
				}
				pk.release()
				seen[pk.endpoint.String()] = true
			}
			got := slices.Sorted(func(yield func(string) bool) {
				for k := range seen {
					if !yield(k) {
						return
					}
				}
			})
			if !slices.Equal(got, tc.eps) {
				t.Fatalf("reached %v, want %v", got, tc.eps)
			}
		})
	}
	if s := p.Stats(); s.Flows[0][ResultDroppedSourceRange] != 1 {
		t.Errorf("dropped_source_range %d, want 1", s.Flows[0][ResultDroppedSourceRange])
	}

	// NodePorts (resolveNodePort): the external set and the short-circuit
	// apply, the source ranges do not.
	for _, tc := range []struct {
		name     string
		src      netip.Addr
		nodePort uint16
		v        service.Verdict
		set      setKind
	}{
		{"NodePort of a service with source ranges, from outside them", outside, 30080, service.Forward, setExternal},
		{"NodePort, Local policy: the local set", outside, 30081, service.Forward, setExternal},
		{"NodePort, Local policy, from this host: the cluster set", host, 30081, service.Forward, setFromHost},
		{"NodePort, Local policy, no local endpoint: dropped", outside, 30082, service.NoLocalEndpoints, setExternal},
		{"no such NodePort", outside, 30099, service.NotService, setInternal},
	} {
		tg := p.resolveNodePort(p.Table(), service.TCP, service.IPv4, tc.src, tc.nodePort)
		if tg.v != tc.v || tg.set != tc.set || tg.dropped {
			t.Errorf("%s: verdict %v set %v dropped %v, want %v %v", tc.name, tg.v, tg.set, tg.dropped, tc.v, tc.set)
		}
		ex := p.Explain(ExplainQuery{Protocol: service.TCP, Client: tc.src, Destination: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.100"), tc.nodePort),
			NodePort: true, LeftOut: tr.LeftOut})
		want := map[service.Verdict]string{service.Forward: "FORWARD", service.NoLocalEndpoints: "DROP", service.NotService: "REJECT"}[tc.v]
		if ex.Verdict != want {
			t.Errorf("%s: Explain verdict %s, want %s", tc.name, ex.Verdict, want)
		}
		if tc.nodePort == 30081 && tc.set == setExternal &&
			(len(ex.LeftOut) != 1 || ex.LeftOut[0].Address != "10.0.0.2:8080" || !strings.Contains(ex.LeftOut[0].Why, "externalTrafficPolicy is Local")) {
			t.Errorf("%s: Explain left out %+v, want 10.0.0.2:8080 for externalTrafficPolicy Local", tc.name, ex.LeftOut)
		}
	}
}

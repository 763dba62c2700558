package proxy

import (
	"math"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

// TestExplainLotteryAndAffinity: for a ClusterIP with ClientIP affinity,
// Explain gives each endpoint the lottery's exact odds (1/n each), says
// the client is not pinned before its first flow and pinned to route's
// pick after it, and counts or refreshes nothing; a source no reply can
// reach is dropped as Admit drops it.
func TestExplainLotteryAndAffinity(t *testing.T) {
	p, tr, _ := newTestProxy(t)
	affinity := func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, affinity))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, 8080, "", "10.0.0.1", "10.0.0.2", "10.0.0.3"))
	tr.OnSynced()
	client := netip.MustParseAddr("192.0.2.1")
	dst := netip.MustParseAddrPort("10.96.0.1:80")
	q := ExplainQuery{Protocol: service.TCP, Client: client, Destination: dst, LeftOut: tr.LeftOut}
	ex := p.Explain(q)
	if ex.Verdict != "FORWARD" || ex.Scheduler != "random" || ex.Pinned != "" || len(ex.Endpoints) != 3 {
		t.Fatalf("before the first flow: %+v", ex)
	}
	sum := 0.0
	for _, e := range ex.Endpoints {
		if math.Abs(e.Chance-1.0/3) > 1e-9 {
			t.Errorf("%s: chance %v, want 1/3", e.Address, e.Chance)
		}
		sum += e.Chance
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Errorf("chances sum to %v", sum)
	}
	pk, v := p.route(service.TCP, conntrack.MakeTuple(conntrack.TCP, netip.AddrPortFrom(client, 40000), dst))
	if v != service.Forward || !pk.ok {
		t.Fatalf("route: %v", v)
	}
	defer pk.release()
	hits := p.Stats().AffinityHits
	if ex := p.Explain(q); ex.Pinned != pk.endpoint.String() {
		t.Errorf("after the first flow to %s: pinned %q", pk.endpoint, ex.Pinned)
	}
	if p.Stats().AffinityHits != hits {
		t.Error("Explain counted an affinity hit")
	}
	if ex := p.Explain(ExplainQuery{Protocol: service.TCP, Client: netip.IPv4Unspecified(), Destination: dst}); ex.Verdict != "DROP" || ex.Result != ResultDroppedUnusableSource.String() {
		t.Errorf("from 0.0.0.0: %+v", ex)
	}
}

// FuzzExplain feeds /debug/explain's inputs (its admin address can be
// reached from elsewhere): any destination text, client text, protocol and
// NodePort flag is read or refused, and explained without a panic, against
// a table with affinity, a Local policy, a NodePort and a source range.
func FuzzExplain(f *testing.F) {
	for _, s := range []struct {
		to, from string
		udp, np  bool
	}{
		{"10.96.0.1:80", "192.0.2.1", false, false},
		{"web.ns.svc.cluster.local:p", "0.0.0.0", false, false},
		{"web.ns:80", "::1", true, false},
		{"127.0.0.1:30080", "203.0.113.9", false, true},
		{"198.51.100.10:80", "192.0.2.200", false, false},
		{"[::ffff:10.96.0.1]:80", "255.255.255.255", true, true},
		{".:", "", false, false},
	} {
		f.Add(s.to, s.from, s.udp, s.np)
	}
	p, tr, _ := newTestProxyWith(f, Config{}, false)
	affinity := func(s *v1.Service) { s.Spec.SessionAffinity = v1.ServiceAffinityClientIP }
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, affinity))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, 8080, "node-b", "10.0.0.1", "10.0.0.2"))
	lb := svc("lb", "10.96.0.2", v1.ProtocolTCP, 80, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30080
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/28"}
		s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.10"}}
	})
	tr.OnServiceAdd(lb)
	tr.OnEndpointSliceAdd(slice("lb", "lb-1", v1.ProtocolTCP, 8080, "node-b", "10.0.0.3"))
	tr.OnSynced()
	f.Fuzz(func(t *testing.T, to, from string, udp, nodePort bool) {
		dst, err := p.Destination(to, "cluster.local")
		if err != nil {
			return
		}
		client, err := netip.ParseAddr(from)
		if err != nil {
			return
		}
		proto := service.TCP
		if udp {
			proto = service.UDP
		}
		ex := p.Explain(ExplainQuery{Protocol: proto, Client: client, Destination: dst, NodePort: nodePort, LeftOut: tr.LeftOut})
		switch ex.Verdict {
		case "FORWARD":
			if len(ex.Endpoints) == 0 {
				t.Fatalf("FORWARD without endpoints: %+v", ex)
			}
		case "REJECT", "DROP":
			if ex.Result == "" {
				t.Fatalf("%s without its result: %+v", ex.Verdict, ex)
			}
		case "LOCAL":
		default:
			t.Fatalf("verdict %q", ex.Verdict)
		}
	})
}

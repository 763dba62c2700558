package service_test

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

// TestLeftOutReasons: each rule of categorize that keeps an endpoint out
// gives its own reason (topology.go CategorizeEndpoints' order).
func TestLeftOutReasons(t *testing.T) {
	const ip = "172.30.0.41"
	tcp80 := eports(eport("http", v1.ProtocolTCP, 80))
	v4 := discoveryv1.AddressTypeIPv4
	web := func(mods ...func(*v1.Service)) *v1.Service {
		return svc("ns1/web", ip, ports(tcp("http", 80, intstr.FromInt32(80))), mods...)
	}
	for _, c := range []struct {
		name string
		objs []any
		zone string
		want map[string]string // endpoint key -> a part of the reason
	}{
		{"not ready, terminating", []any{web(), slice("ns1/web-1", "web", v4, tcp80,
			ep("10.0.0.1"), ep("10.0.0.2", notReady), ep("10.0.0.3", terminating(true)))},
			"", map[string]string{"10.0.0.2:80": "not ready", "10.0.0.3:80": "used only while no endpoint is ready"}},
		{"internalTrafficPolicy Local", []any{web(itpLocal), slice("ns1/web-1", "web", v4, tcp80,
			ep("10.0.0.1", onNode("node-a")), ep("10.0.0.2", onNode("node-b")))},
			"", map[string]string{"10.0.0.2:80": `on node "node-b", not this one ("node-a"), and internalTrafficPolicy is Local`}},
		{"zone hints", []any{web(), slice("ns1/web-1", "web", v4, tcp80,
			ep("10.0.0.1", inZone("z1"), zoneHints("z1")), ep("10.0.0.2", inZone("z2"), zoneHints("z2")))},
			"z1", map[string]string{"10.0.0.2:80": "hints send it to zones [z2]"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := syncedTracker(t, service.Config{NodeName: "node-a", Zone: c.zone}, c.objs...)
			p, v := tr.Current().Lookup(service.TCP, addrPort(t, ip+":80").Addr(), 80)
			if p == nil || v != service.Forward {
				t.Fatalf("lookup: %v", v)
			}
			got := map[string]string{}
			for _, lo := range tr.LeftOut(p, p.Endpoints, false) {
				got[lo.Endpoint.Key()] = lo.Why
			}
			if len(got) != len(c.want) {
				t.Errorf("left out %v, want %v", got, c.want)
			}
			for k, w := range c.want {
				if !strings.Contains(got[k], w) {
					t.Errorf("%s: %q, want it to say %q", k, got[k], w)
				}
			}
		})
	}
}

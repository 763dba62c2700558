package service_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

// TestStaleUDPFollowsServing: a UDP port's flows end only for endpoints that
// stopped serving or left, as kube-proxy's stale-entry cleanup decides
// (pkg/proxy/conntrack/cleanup.go CleanStaleEntries: entries are kept for
// every endpoint IP that IsServing, whatever the traffic policy, topology
// or terminating state; nothing is cleaned while no endpoint serves). Issue
// 15, item 4: every change of the usable set used to end them.
func TestStaleUDPFollowsServing(t *testing.T) {
	dnsPort := ports(udp("dns", 53, intstr.FromInt32(5353)))
	local := func(e *discoveryv1.Endpoint) { onNode("node1")(e) }
	elsewhere := func(e *discoveryv1.Endpoint) { onNode("node2")(e) }
	cases := []struct {
		name      string
		itpLocal  bool
		nodePort  bool // type NodePort (nodePort 30053): external traffic uses the cluster set
		before    []discoveryv1.Endpoint
		after     []discoveryv1.Endpoint // nil: the Service is deleted
		wantStale []string
	}{
		{
			name:   "starts terminating while others are ready: still serving",
			before: []discoveryv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")},
			after:  []discoveryv1.Endpoint{ep("10.0.0.1", terminating(true)), ep("10.0.0.2")},
		},
		{
			name:      "terminating and no longer serving",
			before:    []discoveryv1.Endpoint{ep("10.0.0.1", terminating(true)), ep("10.0.0.2")},
			after:     []discoveryv1.Endpoint{ep("10.0.0.1", terminating(false)), ep("10.0.0.2")},
			wantStale: []string{"10.0.0.1:5353"},
		},
		{
			name:      "endpoint removed",
			before:    []discoveryv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.2"), ep("10.0.0.3")},
			after:     []discoveryv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.3")},
			wantStale: []string{"10.0.0.2:5353"},
		},
		{
			name:      "not ready (not serving either)",
			before:    []discoveryv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")},
			after:     []discoveryv1.Endpoint{ep("10.0.0.1", notReady, func(e *discoveryv1.Endpoint) { e.Conditions.Serving = ptr(false) }), ep("10.0.0.2")},
			wantStale: []string{"10.0.0.1:5353"},
		},
		{
			name:   "moves out of this zone's hints",
			before: []discoveryv1.Endpoint{ep("10.0.0.1", inZone("a"), zoneHints("a")), ep("10.0.0.2", inZone("a"), zoneHints("a"))},
			after:  []discoveryv1.Endpoint{ep("10.0.0.1", inZone("a"), zoneHints("a")), ep("10.0.0.2", inZone("b"), zoneHints("b"))},
		},
		{
			name:     "Local policy: the only local endpoint's flows stay when a remote one comes",
			itpLocal: true,
			before:   []discoveryv1.Endpoint{ep("10.0.0.1", local)},
			after:    []discoveryv1.Endpoint{ep("10.0.0.1", local, terminating(true)), ep("10.0.0.2", elsewhere)},
		},
		{
			name:     "NodePort, Local internal policy: a remote endpoint that serves external traffic only keeps its flows",
			itpLocal: true, nodePort: true,
			before: []discoveryv1.Endpoint{ep("10.0.0.1", local), ep("10.0.0.2", elsewhere)},
			after:  []discoveryv1.Endpoint{ep("10.0.0.1", local), ep("10.0.0.2", elsewhere, terminating(true))},
		},
		{
			name:     "NodePort, Local internal policy: the remote endpoint stops serving",
			itpLocal: true, nodePort: true,
			before:    []discoveryv1.Endpoint{ep("10.0.0.1", local), ep("10.0.0.2", elsewhere)},
			after:     []discoveryv1.Endpoint{ep("10.0.0.1", local), ep("10.0.0.2", elsewhere, terminating(false))},
			wantStale: []string{"10.0.0.2:5353"},
		},
		{
			name:   "no endpoint serves any more: nothing is cleaned",
			before: []discoveryv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")},
			after:  []discoveryv1.Endpoint{ep("10.0.0.1", terminating(false)), ep("10.0.0.2", terminating(false))},
		},
		{
			name:      "Service deleted: every endpoint is stale (a difference: see docs/conformance.md)",
			before:    []discoveryv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.2", terminating(true))},
			wantStale: []string{"10.0.0.1:5353", "10.0.0.2:5353"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var rec syncRecorder
			clk := service.NewManualClock(epoch)
			tr, err := service.NewTracker(service.Config{NodeName: "node1", Zone: "a", Clock: clk, OnSync: rec.onSync})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			s := svc("ns1/dns", "10.96.0.10", dnsPort)
			if c.itpLocal {
				itpLocal(s)
			}
			if c.nodePort {
				svcType(v1.ServiceTypeNodePort)(s)
				nodePorts(30053)(s)
			}
			tr.OnServiceAdd(s)
			tr.OnEndpointSliceAdd(slice("ns1/dns-1", "dns", discoveryv1.AddressTypeIPv4, eports(eport("dns", "UDP", 5353)), c.before...))
			tr.OnSynced()
			clk.Advance(time.Second)
			if c.after == nil {
				tr.OnServiceDelete(s)
			} else {
				tr.OnEndpointSliceUpdate(nil, slice("ns1/dns-1", "dns", discoveryv1.AddressTypeIPv4, eports(eport("dns", "UDP", 5353)), c.after...))
			}
			var stale []string
			last := rec.changes[len(rec.changes)-1]
			for _, pc := range last.Ports {
				for _, a := range pc.StaleUDP {
					stale = append(stale, a.String())
				}
			}
			if diff := cmp.Diff(c.wantStale, stale); diff != "" {
				t.Errorf("StaleUDP (-want +got):\n%s", diff)
			}
		})
	}
}

// A TCP port never reports stale UDP endpoints, and its Serving is nil.
func TestStaleUDPOnlyForUDP(t *testing.T) {
	var rec syncRecorder
	tr := newTracker(t, service.NewManualClock(epoch), 0, &rec)
	tr.OnServiceAdd(webService("10.96.0.10"))
	tr.OnEndpointSliceAdd(webEndpoints("web-1", "10.0.0.1", "10.0.0.2"))
	tr.OnSynced()
	tr.OnEndpointSliceUpdate(nil, webEndpoints("web-1", "10.0.0.1"))
	last := rec.changes[len(rec.changes)-1]
	if len(last.Ports) != 1 || last.Ports[0].StaleUDP != nil || last.Ports[0].New.Serving != nil {
		t.Errorf("TCP port change %+v", last.Ports)
	}
}

package service_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

func targetRef(kind, ns, name string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		e.TargetRef = &v1.ObjectReference{Kind: kind, Namespace: ns, Name: name}
	}
}

// TestEndpointPodRef: an endpoint keeps the Pod its targetRef names (the
// way the API server reaches it, pods/portforward); a targetRef without a
// namespace is in the slice's, and one of another kind names no Pod.
func TestEndpointPodRef(t *testing.T) {
	tr := syncedTracker(t, service.Config{NodeName: "node1"},
		svc("ns1/web", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(8080)))),
		slice("ns1/web-1", "web", discoveryv1.AddressTypeIPv4, eports(eport("http", v1.ProtocolTCP, 8080)),
			ep("10.0.0.1", targetRef("Pod", "ns1", "web-a")),
			ep("10.0.0.2", targetRef("Pod", "", "web-b")),
			ep("10.0.0.3", targetRef("Node", "", "node1")),
			ep("10.0.0.4")))
	ps := tr.Current().Service(service.ServiceName{Namespace: "ns1", Name: "web"})
	if len(ps) != 1 {
		t.Fatalf("%d ports, want 1", len(ps))
	}
	got := map[string]string{}
	for _, e := range ps[0].Endpoints {
		got[e.Key()] = e.Pod.String()
	}
	want := map[string]string{"10.0.0.1:8080": "ns1/web-a", "10.0.0.2:8080": "ns1/web-b", "10.0.0.3:8080": "", "10.0.0.4:8080": ""}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("pods (-want +got):\n%s", d)
	}
}

package rules_test

import (
	"os"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

// The object builders of these tests: a Service and its EndpointSlices in a
// line each, then table() to run them through a service.Tracker.

// svc is a ClusterIP Service "namespace/name"; ips lists its ClusterIPs,
// comma-separated, the first being spec.clusterIP.
func svc(nsName, ips string, sp []v1.ServicePort, mods ...func(*v1.Service)) *v1.Service {
	ns, name, _ := strings.Cut(nsName, "/")
	clusterIPs := strings.Split(ips, ",")
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	s.Spec = v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIPs[0], ClusterIPs: clusterIPs, Ports: sp}
	for _, mod := range mods {
		mod(s)
	}
	return s
}

// sport is a service port whose target port is the same number.
func sport(name string, proto v1.Protocol, port int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Protocol: proto, Port: port, TargetPort: intstr.FromInt32(port)}
}

func ports(sp ...v1.ServicePort) []v1.ServicePort { return sp }

// clientIP turns on ClientIP affinity; a timeout of 0 keeps the default.
func clientIP(timeout int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if timeout != 0 {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &timeout}}
		}
	}
}

func itpLocal(s *v1.Service) {
	local := v1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &local
}

// slice is EndpointSlice "namespace/name" of Service svcName, with a single
// port.
func slice(nsName, svcName string, at discoveryv1.AddressType, portName string, proto v1.Protocol, port int32, es ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	ns, name, _ := strings.Cut(nsName, "/")
	es = append([]discoveryv1.Endpoint(nil), es...)
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: at,
		Endpoints:   es,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
}

// ep is one endpoint, on the node onNode names (no node without it).
func ep(addr string, mods ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, mod := range mods {
		mod(&e)
	}
	return e
}

func onNode(node string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName = &node }
}

// eps are endpoints at addrs, all on node "other" (the tables are built
// for "node-a").
func eps(addrs ...string) []discoveryv1.Endpoint {
	var out []discoveryv1.Endpoint
	for _, a := range addrs {
		out = append(out, ep(a, onNode("other")))
	}
	return out
}

// table feeds objs to a Tracker for node "node-a" (no sync delay, a
// manual clock) and returns the table it built.
func table(t testing.TB, objs ...any) *service.Table {
	t.Helper()
	clock := service.NewManualClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	tr, err := service.NewTracker(service.Config{NodeName: "node-a", Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	for _, o := range objs {
		if s, ok := o.(*v1.Service); ok {
			tr.OnServiceAdd(s)
		} else if es, ok := o.(*discoveryv1.EndpointSlice); ok {
			tr.OnEndpointSliceAdd(es)
		} else {
			t.Fatalf("table: %T is neither a Service nor an EndpointSlice", o)
		}
	}
	tr.OnSynced()
	tbl := tr.Current()
	if tbl == nil {
		t.Fatal("table: the tracker built no table")
	}
	return tbl
}

// skipUnlessCI skips a test this machine cannot run (no root, a tool
// missing), except under CI (CI=1), which must run every test and fails
// instead.
func skipUnlessCI(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "" {
		t.Skipf(format, args...)
	}
	t.Fatalf(format+" (CI must run this test)", args...)
}

// checkContains fails t for each of present that out lacks and each of
// absent that it has.
func checkContains(t *testing.T, out string, present, absent []string) {
	t.Helper()
	for _, s := range present {
		if !strings.Contains(out, s) {
			t.Errorf("output lacks %q\n%s", s, out)
		}
	}
	for _, s := range absent {
		if strings.Contains(out, s) {
			t.Errorf("output has %q\n%s", s, out)
		}
	}
}

package service_test

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// epoch is the start of every manual clock in these tests.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

// svc builds a Service "ns/name" with the given ClusterIPs
// (comma-separated; "None" for headless) and ports.
func svc(nsName, ips string, ports []v1.ServicePort, mods ...func(*v1.Service)) *v1.Service {
	ns, name, _ := strings.Cut(nsName, "/")
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: ports},
	}
	if ips != "" {
		s.Spec.ClusterIPs = strings.Split(ips, ",")
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	}
	for _, m := range mods {
		m(s)
	}
	return s
}

func tcp(name string, port int32, target intstr.IntOrString) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: v1.ProtocolTCP, TargetPort: target}
}

func udp(name string, port int32, target intstr.IntOrString) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: v1.ProtocolUDP, TargetPort: target}
}

func sctp(name string, port int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: v1.ProtocolSCTP}
}

func ports(p ...v1.ServicePort) []v1.ServicePort { return p }

func clientIP(timeout int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		if timeout > 0 {
			s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr(timeout)}}
		}
	}
}

func itpLocal(s *v1.Service) {
	s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicyLocal)
}

// slice builds an EndpointSlice "ns/slicename" of service svcName.
func slice(nsName, svcName string, at discoveryv1.AddressType, ps []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	ns, name, _ := strings.Cut(nsName, "/")
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svcName},
		},
		AddressType: at,
		Ports:       ps,
		Endpoints:   eps,
	}
}

func eport(name string, proto v1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(port)}
}

func eports(p ...discoveryv1.EndpointPort) []discoveryv1.EndpointPort { return p }

func ep(addr string, mods ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, m := range mods {
		m(&e)
	}
	return e
}

func notReady(e *discoveryv1.Endpoint) { e.Conditions.Ready = ptr(false) }

// terminating marks the endpoint terminating, not ready, and serving or not.
func terminating(serving bool) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		e.Conditions.Ready = ptr(false)
		e.Conditions.Serving = ptr(serving)
		e.Conditions.Terminating = ptr(true)
	}
}

func onNode(n string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName = ptr(n) }
}

func inZone(z string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Zone = ptr(z) }
}

func zoneHints(zones ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, z := range zones {
			e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
	}
}

func nodeHints(nodes ...string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) {
		if e.Hints == nil {
			e.Hints = &discoveryv1.EndpointHints{}
		}
		for _, n := range nodes {
			e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
}

// syncedTracker returns a Tracker with MinSyncPeriod 0 on a manual clock,
// fed with objs (Services and EndpointSlices) and synced.
func syncedTracker(t testing.TB, cfg service.Config, objs ...any) *service.Tracker {
	t.Helper()
	if cfg.Clock == nil {
		cfg.Clock = service.NewManualClock(epoch)
	}
	tr, err := service.NewTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			tr.OnServiceAdd(o)
		case *discoveryv1.EndpointSlice:
			tr.OnEndpointSliceAdd(o)
		default:
			t.Fatalf("unexpected object %T", o)
		}
	}
	tr.OnSynced()
	return tr
}

func addrPort(t testing.TB, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

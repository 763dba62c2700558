package admin_test

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	tcp  = v1.ProtocolTCP
	udp  = v1.ProtocolUDP
	ipv4 = discoveryv1.AddressTypeIPv4
)

// epoch is the start of every manual clock in these tests.
var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func ptr[T any](v T) *T { return &v }

// writeRules is what /debug/rules should answer for tbl and opts.
func writeRules(t *testing.T, tbl *service.Table, opts rules.Options) string {
	t.Helper()
	var b strings.Builder
	if err := rules.Write(&b, tbl, opts); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// svc builds a Service "ns/name" with the given ClusterIPs (comma-separated)
// and ports.
func svc(nsName, ips string, ports []v1.ServicePort, mods ...func(*v1.Service)) *v1.Service {
	ns, name, _ := strings.Cut(nsName, "/")
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, Ports: ports},
	}
	s.Spec.ClusterIPs = strings.Split(ips, ",")
	s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	for _, m := range mods {
		m(s)
	}
	return s
}

func sport(name string, proto v1.Protocol, port int32) v1.ServicePort {
	return v1.ServicePort{Name: name, Port: port, Protocol: proto, TargetPort: intstr.FromInt32(port)}
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

// slice builds an EndpointSlice "ns/slicename" of service svcName with one
// port and the given endpoint addresses.
func slice(nsName, svcName string, at discoveryv1.AddressType, portName string, proto v1.Protocol, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	ns, name, _ := strings.Cut(nsName, "/")
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: name,
			Labels: map[string]string{discoveryv1.LabelServiceName: svcName},
		},
		AddressType: at,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(portName), Protocol: ptr(proto), Port: ptr(port)}},
		Endpoints:   eps,
	}
}

func ep(addr string, mods ...func(*discoveryv1.Endpoint)) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	for _, m := range mods {
		m(&e)
	}
	return e
}

func onNode(n string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.NodeName = ptr(n) }
}

// eps returns endpoints on node "other" at the given addresses.
func eps(addrs ...string) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, len(addrs))
	for i, a := range addrs {
		out[i] = ep(a, onNode("other"))
	}
	return out
}

// newTracker returns a synced Tracker on a manual clock with MinSyncPeriod
// 0, node "node-a", fed with objs (Services and EndpointSlices).
func newTracker(t testing.TB, objs ...any) *service.Tracker {
	t.Helper()
	tr, err := service.NewTracker(service.Config{NodeName: "node-a", Clock: service.NewManualClock(epoch)})
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

// table builds the service table of objs.
func table(t testing.TB, objs ...any) *service.Table {
	t.Helper()
	tbl := newTracker(t, objs...).Current()
	if tbl == nil {
		t.Fatal("no table after OnSynced")
	}
	return tbl
}

package service_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

func headless(s *v1.Service) {
	s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
}

func publishNotReady(s *v1.Service) { s.Spec.PublishNotReadyAddresses = true }

func hostname(h string) func(*discoveryv1.Endpoint) {
	return func(e *discoveryv1.Endpoint) { e.Hostname = ptr(h) }
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

var (
	dnsHTTP = service.DNSPort{Name: "http", Protocol: service.TCP, Port: 80}
	dnsDNS  = service.DNSPort{Name: "dns", Protocol: service.UDP, Port: 53}
)

// The DNS view of each kind of Service, built by a Tracker from the objects.
func TestDNSView(t *testing.T) {
	dbPorts := eports(eport("pg", v1.ProtocolTCP, 5432))
	cases := []struct {
		name string
		objs []any
		// want is the DNS view of ns/svc; nil means none.
		want *service.DNSService
	}{
		{
			name: "ClusterIP",
			objs: []any{svc("ns/svc", "10.96.0.5", ports(tcp("http", 80, intstr.FromInt32(8080)), udp("dns", 53, intstr.FromInt32(5353))))},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, ClusterIPs: addrs("10.96.0.5"),
				Ports: []service.DNSPort{dnsHTTP, dnsDNS}},
		},
		{
			name: "dual-stack, IPv6 first",
			objs: []any{svc("ns/svc", "fd00::5,10.96.0.5", ports(tcp("http", 80, intstr.FromInt32(8080))))},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, ClusterIPs: addrs("fd00::5", "10.96.0.5"),
				Ports: []service.DNSPort{dnsHTTP}},
		},
		{
			name: "single unnamed port; SCTP left out",
			objs: []any{svc("ns/svc", "10.96.0.5", ports(tcp("", 80, intstr.FromInt32(8080))), func(s *v1.Service) {
				s.Spec.Ports = append(s.Spec.Ports, sctp("x", 9))
			})},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, ClusterIPs: addrs("10.96.0.5"),
				Ports: []service.DNSPort{{Protocol: service.TCP, Port: 80}}},
		},
		{
			name: "headless: ready endpoints of both families, sorted, with labels",
			objs: []any{
				svc("ns/svc", "", ports(tcp("pg", 5432, intstr.FromInt32(5432))), headless),
				slice("ns/svc-b", "svc", discoveryv1.AddressTypeIPv4, dbPorts,
					ep("10.0.0.10", hostname("db-1")), ep("10.0.0.2"), ep("10.0.0.3", notReady), ep("10.0.0.4", terminating(true))),
				slice("ns/svc-a", "svc", discoveryv1.AddressTypeIPv6, dbPorts, ep("fd00::7")),
			},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, Headless: true,
				Ports: []service.DNSPort{{Name: "pg", Protocol: service.TCP, Port: 5432}},
				Endpoints: []service.DNSEndpoint{
					{Addr: netip.MustParseAddr("10.0.0.2"), Label: "10-0-0-2", Ready: true, Ports: []service.DNSPort{{Name: "pg", Protocol: service.TCP, Port: 5432}}},
					{Addr: netip.MustParseAddr("10.0.0.10"), Hostname: "db-1", Label: "db-1", Ready: true, Ports: []service.DNSPort{{Name: "pg", Protocol: service.TCP, Port: 5432}}},
					{Addr: netip.MustParseAddr("fd00::7"), Label: "fd00--7", Ready: true, Ports: []service.DNSPort{{Name: "pg", Protocol: service.TCP, Port: 5432}}},
				}},
		},
		{
			name: "headless with publishNotReadyAddresses",
			objs: []any{
				svc("ns/svc", "", nil, headless, publishNotReady),
				slice("ns/svc-a", "svc", discoveryv1.AddressTypeIPv4, nil, ep("10.0.0.1", notReady), ep("10.0.0.2")),
			},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, Headless: true, PublishNotReadyAddresses: true,
				Endpoints: []service.DNSEndpoint{
					{Addr: netip.MustParseAddr("10.0.0.1"), Label: "10-0-0-1"},
					{Addr: netip.MustParseAddr("10.0.0.2"), Label: "10-0-0-2", Ready: true},
				}},
		},
		{
			name: "headless: one address in two slices, the first slice by name wins, ports join",
			objs: []any{
				svc("ns/svc", "", nil, headless),
				slice("ns/svc-b", "svc", discoveryv1.AddressTypeIPv4, eports(eport("b", v1.ProtocolUDP, 2)), ep("10.0.0.1", hostname("late"))),
				slice("ns/svc-a", "svc", discoveryv1.AddressTypeIPv4, eports(eport("a", v1.ProtocolTCP, 1)), ep("10.0.0.1", hostname("early"))),
			},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, Headless: true,
				Endpoints: []service.DNSEndpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Hostname: "early", Label: "early", Ready: true,
					Ports: []service.DNSPort{{Name: "a", Protocol: service.TCP, Port: 1}, {Name: "b", Protocol: service.UDP, Port: 2}}}}},
		},
		{
			// The labels the EndpointSlice controller puts on every slice
			// of a headless Service (k8s.io/endpointslice utils.go
			// setEndpointSliceLabels); the datapath leaves such slices out.
			name: "headless: slices labelled as the EndpointSlice controller labels them",
			objs: []any{
				svc("ns/svc", "", nil, headless),
				func() *discoveryv1.EndpointSlice {
					es := slice("ns/svc-a", "svc", discoveryv1.AddressTypeIPv4, dbPorts, ep("10.0.0.1"))
					es.Labels[v1.IsHeadlessService] = ""
					es.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
					return es
				}(),
			},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, Headless: true,
				Endpoints: []service.DNSEndpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Label: "10-0-0-1", Ready: true,
					Ports: []service.DNSPort{{Name: "pg", Protocol: service.TCP, Port: 5432}}}}},
		},
		{
			name: "headless without endpoints",
			objs: []any{svc("ns/svc", "", nil, headless)},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, Headless: true},
		},
		{
			name: "ExternalName",
			objs: []any{svc("ns/svc", "", nil, func(s *v1.Service) {
				s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "db.example.com"
			})},
			want: &service.DNSService{Name: service.ServiceName{Namespace: "ns", Name: "svc"}, ExternalName: "db.example.com"},
		},
		{
			name: "no ClusterIP yet: not in the view",
			objs: []any{svc("ns/svc", "", ports(tcp("http", 80, intstr.FromInt32(8080))))},
		},
		{
			name: "an invalid ClusterIP: not in the view",
			objs: []any{svc("ns/svc", "10.96.0.300", ports(tcp("http", 80, intstr.FromInt32(8080))))},
		},
		{
			name: "slices without a service: not in the view",
			objs: []any{slice("ns/svc-a", "svc", discoveryv1.AddressTypeIPv4, nil, ep("10.0.0.1"))},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tbl := syncedTracker(t, service.Config{}, c.objs...).Current()
			got, ok := tbl.DNSService("ns", "svc")
			if ok != (got != nil) {
				t.Fatalf("DNSService returned %v, %v", got, ok)
			}
			if diff := cmp.Diff(c.want, got, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
				t.Errorf("DNSService(ns, svc) (-want +got):\n%s", diff)
			}
			wantLen := 0
			if c.want != nil {
				wantLen = 1
			}
			if tbl.DNSLen() != wantLen || tbl.DNSNamespace("ns") != (wantLen == 1) {
				t.Errorf("DNSLen = %d, DNSNamespace(ns) = %v; want %d services", tbl.DNSLen(), tbl.DNSNamespace("ns"), wantLen)
			}
			if got == nil {
				return
			}
			for _, ip := range got.ClusterIPs {
				if n, ok := tbl.DNSByIP(ip); !ok || n != c.want.Name {
					t.Errorf("DNSByIP(%s) = %v, %v", ip, n, ok)
				}
			}
		})
	}
}

// Headless and ExternalName services are in the DNS view and still not
// proxied: Skipped lists them and Lookup knows no port of theirs.
func TestDNSViewKeepsHeadlessUnproxied(t *testing.T) {
	tbl := syncedTracker(t, service.Config{},
		svc("ns/db", "", ports(tcp("pg", 5432, intstr.FromInt32(5432))), headless),
		slice("ns/db-a", "db", discoveryv1.AddressTypeIPv4, eports(eport("pg", v1.ProtocolTCP, 5432)), ep("10.0.0.1")),
	).Current()
	if _, ok := tbl.DNSService("ns", "db"); !ok {
		t.Fatal("headless service missing from the DNS view")
	}
	want := []service.Skipped{{Service: service.ServiceName{Namespace: "ns", Name: "db"}, Reason: service.ReasonHeadless}}
	if diff := cmp.Diff(want, tbl.Skipped()); diff != "" {
		t.Errorf("Skipped (-want +got):\n%s", diff)
	}
	if tbl.Len() != 0 {
		t.Errorf("a headless service has %d proxied ports", tbl.Len())
	}
	if _, v := tbl.Lookup(service.TCP, netip.MustParseAddr("10.0.0.1"), 5432); v != service.NotService {
		t.Errorf("Lookup of a headless endpoint: %v", v)
	}
}

// Updates and deletes through the Tracker: every change to what DNS answers
// publishes a table (even when no proxied port changed), unchanged services
// keep their *DNSService, and the reverse index and namespace set follow.
func TestDNSViewUpdates(t *testing.T) {
	var rec syncRecorder
	tr := newTracker(t, service.NewManualClock(epoch), 0, &rec)
	web := svc("ns1/web", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(8080))))
	other := svc("ns2/other", "10.96.0.11", ports(tcp("http", 80, intstr.FromInt32(8080))))
	db := svc("ns1/db", "", nil, headless)
	tr.OnServiceAdd(web)
	tr.OnServiceAdd(other)
	tr.OnServiceAdd(db)
	tr.OnSynced()
	first := tr.Current()
	otherView, _ := first.DNSService("ns2", "other")

	// A headless service gains an endpoint: a new table, no port changes.
	tr.OnEndpointSliceAdd(slice("ns1/db-a", "db", discoveryv1.AddressTypeIPv4, nil, ep("10.0.0.1")))
	second := tr.Current()
	if second == first || !rec.changes[len(rec.changes)-1].Empty() {
		t.Fatalf("an endpoint of a headless service: new table %v, changes %+v", second != first, rec.changes[len(rec.changes)-1])
	}
	if v, _ := second.DNSService("ns1", "db"); len(v.Endpoints) != 1 {
		t.Fatalf("db endpoints after the change: %+v", v)
	}
	if v, _ := first.DNSService("ns1", "db"); len(v.Endpoints) != 0 {
		t.Fatal("the previous table changed")
	}
	if v, _ := second.DNSService("ns2", "other"); v != otherView {
		t.Error("an unchanged service got a new *DNSService")
	}

	// The same Service again (a resync): no new table.
	gen := tr.Current().Generation()
	tr.OnServiceUpdate(web, web.DeepCopy())
	if tr.Current().Generation() != gen {
		t.Error("an unchanged Service published a table")
	}

	// web's ClusterIP changes: the reverse index follows.
	moved := web.DeepCopy()
	moved.Spec.ClusterIP, moved.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20"}
	tr.OnServiceUpdate(web, moved)
	tbl := tr.Current()
	if _, ok := tbl.DNSByIP(netip.MustParseAddr("10.96.0.10")); ok {
		t.Error("the old ClusterIP still has a PTR owner")
	}
	if n, ok := tbl.DNSByIP(netip.MustParseAddr("10.96.0.20")); !ok || n.Name != "web" {
		t.Errorf("DNSByIP(new ClusterIP) = %v, %v", n, ok)
	}

	// Deleting ns2's only service removes the namespace; ns1 stays.
	tr.OnServiceDelete(other)
	tbl = tr.Current()
	if _, ok := tbl.DNSService("ns2", "other"); ok || tbl.DNSNamespace("ns2") || !tbl.DNSNamespace("ns1") {
		t.Errorf("after deleting ns2/other: view %v, ns2 %v, ns1 %v", ok, tbl.DNSNamespace("ns2"), tbl.DNSNamespace("ns1"))
	}
	if _, ok := tbl.DNSByIP(netip.MustParseAddr("10.96.0.11")); ok {
		t.Error("a deleted service's ClusterIP still has a PTR owner")
	}
	if tbl.DNSLen() != 2 {
		t.Errorf("DNSLen = %d, want 2", tbl.DNSLen())
	}

	// The headless service goes; its slice stays behind (a slice alone
	// publishes nothing).
	tr.OnServiceDelete(db)
	if _, ok := tr.Current().DNSService("ns1", "db"); ok {
		t.Error("a deleted headless service is still in the view")
	}
}

// Two services claiming one ClusterIP: the lower name owns its PTR record
// whatever the event order, and the other takes over when it goes.
func TestDNSViewPTRConflict(t *testing.T) {
	a := svc("ns/a", "10.96.0.9", ports(tcp("http", 80, intstr.FromInt32(80))))
	b := svc("ns/b", "10.96.0.9", ports(tcp("http", 81, intstr.FromInt32(81))))
	for _, order := range [][]*v1.Service{{a, b}, {b, a}} {
		tr := syncedTracker(t, service.Config{}, order[0], order[1])
		ip := netip.MustParseAddr("10.96.0.9")
		if n, _ := tr.Current().DNSByIP(ip); n.Name != "a" {
			t.Errorf("order %s,%s: PTR owner %v, want ns/a", order[0].Name, order[1].Name, n)
		}
		tr.OnServiceDelete(a)
		if n, ok := tr.Current().DNSByIP(ip); !ok || n.Name != "b" {
			t.Errorf("after deleting ns/a: PTR owner %v, %v; want ns/b", n, ok)
		}
		tr.OnServiceDelete(b)
		if n, ok := tr.Current().DNSByIP(ip); ok {
			t.Errorf("after deleting both: PTR owner %v", n)
		}
	}
}

// PortOwner finds a service port at an address in either protocol, for the
// DNS responder to step aside.
func TestPortOwner(t *testing.T) {
	tbl := syncedTracker(t, service.Config{},
		svc("kube-system/kube-dns", "10.96.0.10", ports(udp("dns", 53, intstr.FromInt32(53)))),
		svc("ns/web", "10.96.0.11", ports(tcp("http", 80, intstr.FromInt32(80)))),
	).Current()
	cases := []struct {
		ip   string
		port uint16
		want string
	}{
		{"10.96.0.10", 53, "kube-system/kube-dns"}, // UDP only, no endpoints: still the owner
		{"10.96.0.11", 53, ""},                     // a ClusterIP without that port
		{"10.96.0.12", 53, ""},
		{"10.96.0.11", 80, "ns/web"},
	}
	for _, c := range cases {
		n, ok := tbl.PortOwner(netip.MustParseAddr(c.ip), c.port)
		got := ""
		if ok {
			got = n.String()
		}
		if got != c.want {
			t.Errorf("PortOwner(%s, %d) = %q, want %q", c.ip, c.port, got, c.want)
		}
	}
	var none *service.Table
	if _, ok := none.PortOwner(netip.MustParseAddr("10.96.0.10"), 53); ok {
		t.Error("a nil table has an owner")
	}
}

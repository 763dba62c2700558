package clusterdns_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/service"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ptr[T any](v T) *T { return &v }

// svcObj builds a Service "ns/name"; ips is comma-separated ("None":
// headless, "": ExternalName to ext). ports are "name/PROTO/port".
func svcObj(nsName, ips, ext string, ports ...string) *v1.Service {
	ns, name, _ := strings.Cut(nsName, "/")
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	switch {
	case ips != "":
		s.Spec.Type = v1.ServiceTypeClusterIP
		s.Spec.ClusterIPs = strings.Split(ips, ",")
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	default:
		s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, ext
	}
	for _, p := range ports {
		var sp v1.ServicePort
		var proto string
		if _, err := fmt.Sscanf(strings.ReplaceAll(p, "/", " "), "%s %s %d", &sp.Name, &proto, &sp.Port); err != nil {
			panic(p)
		}
		sp.Protocol = v1.Protocol(proto)
		s.Spec.Ports = append(s.Spec.Ports, sp)
	}
	return s
}

// sliceObj builds an IPv4 EndpointSlice of service ns/svc with one port
// and endpoints "addr" or "addr=hostname"; a "!" prefix marks one not
// ready.
func sliceObj(nsName, svcName string, port discoveryv1.EndpointPort, eps ...string) *discoveryv1.EndpointSlice {
	ns, name, _ := strings.Cut(nsName, "/")
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{port},
	}
	for _, e := range eps {
		ready := !strings.HasPrefix(e, "!")
		e = strings.TrimPrefix(e, "!")
		addr, host, _ := strings.Cut(e, "=")
		ep := discoveryv1.Endpoint{Addresses: []string{addr}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}
		if host != "" {
			ep.Hostname = ptr(host)
		}
		es.Endpoints = append(es.Endpoints, ep)
	}
	return es
}

func tcpPort(name string, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Protocol: ptr(v1.ProtocolTCP), Port: &port}
}

// fixture is the table every answer test reads.
func fixture() []any {
	many := make([]string, 60)
	for i := range many {
		many[i] = fmt.Sprintf("10.1.0.%d", i+1)
	}
	return []any{
		svcObj("acc/web", "10.96.5.5", "", "http/TCP/80", "metrics/TCP/9090"),
		svcObj("acc/dual", "10.96.5.6,fd00:96::6", "", "http/TCP/80"),
		svcObj("acc/db", "None", "", "pg/TCP/5432"),
		sliceObj("acc/db-a", "db", tcpPort("pg", 5432), "10.0.0.1=db-0", "10.0.0.2", "!10.0.0.3"),
		svcObj("acc/empty", "None", ""),
		svcObj("acc/ext", "", "example.com"),
		svcObj("acc/many", "None", "", "http/TCP/80"),
		sliceObj("acc/many-a", "many", tcpPort("http", 8080), many...),
		svcObj("other/web", "10.96.6.1", "", "dns/UDP/53"),
	}
}

// newTracker returns a synced tracker holding objs.
func newTracker(t testing.TB, objs ...any) *service.Tracker {
	t.Helper()
	tr, err := service.NewTracker(service.Config{Clock: service.NewManualClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))})
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
		}
	}
	tr.OnSynced()
	return tr
}

var serviceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/64")}

// newResponder returns a responder over tr's table, with the fixture's
// addresses and CIDRs; mod adjusts the config.
func newResponder(t testing.TB, tr *service.Tracker, mod ...func(*clusterdns.Config)) *clusterdns.Responder {
	t.Helper()
	cfg := clusterdns.Config{
		Table:        tr.Current,
		Addrs:        []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		ServiceCIDRs: serviceCIDRs,
		Logger:       zaptest.NewLogger(t),
	}
	for _, m := range mod {
		m(&cfg)
	}
	r, err := clusterdns.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// view is a reply in a form tests compare: the flags that matter and each
// section's records in presentation format, whitespace collapsed.
type view struct {
	Rcode             string
	AA, TC, RA        bool
	Answer, Ns, Extra []string
	QuestionName      string
}

func viewOf(m *dns.Msg) view {
	if m == nil {
		return view{Rcode: "no reply"}
	}
	rrs := func(s []dns.RR) []string {
		var out []string
		for _, rr := range s {
			if rr.Header().Rrtype == dns.TypeOPT {
				out = append(out, "OPT")
				continue
			}
			out = append(out, strings.Join(strings.Fields(rr.String()), " "))
		}
		return out
	}
	v := view{Rcode: clusterdns.RcodeString(m.Rcode), AA: m.Authoritative, TC: m.Truncated, RA: m.RecursionAvailable,
		Answer: rrs(m.Answer), Ns: rrs(m.Ns), Extra: rrs(m.Extra)}
	if len(m.Question) > 0 {
		v.QuestionName = m.Question[0].Name
	}
	return v
}

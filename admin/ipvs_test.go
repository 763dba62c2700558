package admin_test

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// fakeIPVS is a snapshot as Proxy.IPVS gives it: a service port under the
// lottery (the zero SchedulerConfig) and one under mh with flags and
// persistence.
func fakeIPVS() []proxy.VirtualService {
	stats := proxy.IPVSStats{Conns: 4, InPkts: 40, OutPkts: 30, InBytes: 4000, OutBytes: 3000, CPS: 1, InPPS: 10, OutPPS: 8, InBPS: 1000, OutBPS: 800}
	return []proxy.VirtualService{{
		Name:     service.PortName{Namespace: "ns1", Name: "web", Port: "http"},
		Protocol: service.TCP, Addr: netip.MustParseAddrPort("10.96.0.10:80"),
		Affinity: time.Hour,
		Dests: []proxy.Destination{
			{Addr: netip.MustParseAddrPort("10.244.1.5:8080"), Weight: 1, ActiveConn: 3, InActConn: 1, Stats: stats},
		},
		Stats: stats,
	}, {
		Name:     service.PortName{Namespace: "ns1", Name: "cache"},
		Protocol: service.TCP, Addr: netip.MustParseAddrPort("10.96.0.11:6379"),
		Scheduler:  balancer.SchedulerConfig{Name: "mh", Flags: balancer.SchedFlag1 | balancer.SchedFlag2},
		Persistent: 10800 * time.Second,
	}}
}

// TestDebugIPVS: /debug/ipvs answers what rules.WriteIPVS prints for the
// converted snapshot, in each of ipvsadm's three layouts.
func TestDebugIPVS(t *testing.T) {
	calls := 0
	h := admin.New(admin.Config{IPVS: func() []proxy.VirtualService { calls++; return fakeIPVS() }}).Handler()
	code, body := get(t, h, "GET", "/debug/ipvs")
	// The destination line ends in the blanks of ipvsadm's "%-10u".
	want := `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.0.10:80 random
  -> 10.244.1.5:8080              Masq    1      3          1         
TCP  10.96.0.11:6379 mh (mh-fallback,mh-port) persistent 10800
`
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("/debug/ipvs (-want +got):\n%s", diff)
	}
	for _, tt := range []struct {
		query string
		opts  rules.IPVSOptions
	}{
		{"?stats=1", rules.IPVSOptions{Stats: true}},
		{"?stats", rules.IPVSOptions{Stats: true}},
		{"?rate=true", rules.IPVSOptions{Rate: true}},
		{"?rate=1&stats=0", rules.IPVSOptions{Rate: true}},
	} {
		code, body := get(t, h, "GET", "/debug/ipvs"+tt.query)
		var b strings.Builder
		if err := rules.WriteIPVS(&b, []rules.VirtualService{
			{Protocol: service.TCP, Addr: netip.MustParseAddrPort("10.96.0.10:80"), Stats: rules.IPVSStats(fakeIPVS()[0].Stats),
				Dests: []rules.Destination{{Addr: netip.MustParseAddrPort("10.244.1.5:8080"), Stats: rules.IPVSStats(fakeIPVS()[0].Stats)}}},
			{Protocol: service.TCP, Addr: netip.MustParseAddrPort("10.96.0.11:6379")},
		}, tt.opts); err != nil {
			t.Fatal(err)
		}
		if code != 200 {
			t.Errorf("%s: status %d: %s", tt.query, code, body)
		} else if diff := cmp.Diff(b.String(), body); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.query, diff)
		}
	}
	if calls != 5 {
		t.Errorf("the snapshot was taken %d times for 5 requests", calls)
	}
	if code, body := get(t, h, "GET", "/debug/ipvs?rate=often"); code != http.StatusBadRequest || !strings.Contains(body, `rate "often"`) {
		t.Errorf("bad rate: %d %q", code, body)
	}
	if code, body := get(t, admin.New(admin.Config{}).Handler(), "GET", "/debug/ipvs"); code != http.StatusServiceUnavailable || body != "no proxy configured\n" {
		t.Errorf("no IPVS source: %d %q", code, body)
	}
	if code, body := get(t, admin.New(admin.Config{}).Handler(), "GET", "/"); code != 200 || !strings.Contains(body, "/debug/ipvs ") {
		t.Errorf("the index does not list /debug/ipvs: %q", body)
	}
}

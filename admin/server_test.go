package admin_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// packet builds an IPv4 packet from src to dst: a TCP SYN, or a UDP
// datagram. Checksums are left zero; the tables these tests use skip them.
func packet(proto conntrack.Protocol, src, dst netip.AddrPort) []byte {
	l4 := 8
	if proto == conntrack.TCP {
		l4 = 20
	}
	b := make([]byte, 20+l4)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8], b[9] = 64, byte(proto)
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s4[:])
	copy(b[16:], d4[:])
	t := b[20:]
	binary.BigEndian.PutUint16(t[0:], src.Port())
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	if proto == conntrack.TCP {
		binary.BigEndian.PutUint32(t[4:], 1000) // seq
		t[12] = 5 << 4
		t[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(t[14:], 65535)
	} else {
		binary.BigEndian.PutUint16(t[4:], uint16(l4))
	}
	return b
}

type flow struct {
	proto       conntrack.Protocol
	src, dst    string
	endpoint    string
	servicePort string
}

// conntrackTable returns a table holding flows, each confirmed and bound.
func conntrackTable(t *testing.T, flows ...flow) *conntrack.Table {
	t.Helper()
	ct, err := conntrack.NewTable(conntrack.Config{Max: 1024, Shards: 4, SkipChecksums: true, Clock: conntrack.NewManualClock(0)})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		r := ct.Classify(packet(f.proto, netip.MustParseAddrPort(f.src), netip.MustParseAddrPort(f.dst)), conntrack.Original)
		if r.Verdict != conntrack.New {
			t.Fatalf("flow %+v: verdict %v (%v)", f, r.Verdict, r.Reason)
		}
		if err := ct.Confirm(&r); err != nil {
			t.Fatal(err)
		}
		if !ct.Bind(r.Tuple, &conntrack.Binding{Endpoint: netip.MustParseAddrPort(f.endpoint), ServicePort: f.servicePort}) {
			t.Fatalf("flow %+v: Bind failed", f)
		}
	}
	return ct
}

// testFlows: two ports of ns1/web, one of ns1/webby (a name that
// starts like web), one of ns2/dns.
var testFlows = []flow{
	{conntrack.TCP, "10.0.0.1:40001", "10.96.0.10:80", "10.244.0.5:8080", "ns1/web:http"},
	{conntrack.TCP, "10.0.0.2:40002", "10.96.0.10:443", "10.244.0.6:8443", "ns1/web:https"},
	{conntrack.UDP, "10.0.0.3:40003", "10.96.0.10:80", "10.244.0.5:8080", "ns1/web:http"},
	{conntrack.TCP, "10.0.0.4:40004", "10.96.0.11:80", "10.244.0.7:80", "ns1/webby"},
	{conntrack.UDP, "10.0.0.5:40005", "10.96.0.53:53", "10.244.0.8:53", "ns2/dns"},
}

func get(t *testing.T, h http.Handler, method, target string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	return rec.Code, rec.Body.String()
}

// sports returns the sport= values of conntrack -L lines, in order.
func sports(body string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		if l == "" {
			continue
		}
		i := strings.Index(l, "sport=")
		out = append(out, strings.Fields(l[i+len("sport="):])[0])
	}
	return out
}

func TestHealthz(t *testing.T) {
	var healthErr error
	h := admin.New(admin.Config{Health: func() error { return healthErr }}).Handler()
	if code, body := get(t, h, "GET", "/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthy: %d %q", code, body)
	}
	healthErr = errors.New("config reload failed: quickstart.yaml: document 2: spec.clusterIP: invalid")
	if code, body := get(t, h, "GET", "/healthz"); code != 503 || body != healthErr.Error()+"\n" {
		t.Errorf("unhealthy: %d %q", code, body)
	}
	if code, _ := get(t, h, "GET", "/livez"); code != 200 {
		t.Errorf("livez while unhealthy: %d", code)
	}
	// No health function: healthy.
	if code, _ := get(t, admin.New(admin.Config{}).Handler(), "GET", "/healthz"); code != 200 {
		t.Errorf("no health check: %d", code)
	}
	// Notes keep it healthy and are listed.
	notes := admin.New(admin.Config{Notes: func() []string { return []string{"external address 203.0.113.7 is not routed"} }}).Handler()
	if code, body := get(t, notes, "GET", "/healthz"); code != 200 || body != "ok\nnote: external address 203.0.113.7 is not routed\n" {
		t.Errorf("with a note: %d %q", code, body)
	}
}

// fakeSync is a Tracker stand-in for SyncHealth.
type fakeSync struct {
	mu sync.Mutex
	s  service.Health
}

func (f *fakeSync) Health() service.Health { f.mu.Lock(); defer f.mu.Unlock(); return f.s }
func (f *fakeSync) set(syncs uint64, pending int, oldest time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.s.Syncs, f.s.PendingChanges, f.s.OldestPending = syncs, pending, oldest
}

// SyncHealth has kube-proxy's meaning (pkg/proxy/healthcheck/proxy_health.go):
// healthy while starting; unhealthy once a change has waited the timeout
// for a table; FirstTable is what /readyz adds.
func TestSyncHealth(t *testing.T) {
	src := &fakeSync{}
	now := epoch
	check := admin.SyncHealth(src, time.Minute, func() time.Time { return now })
	ready := admin.FirstTable(src)
	step := func(d time.Duration, syncs uint64, pending int, oldest time.Time, wantErr string) {
		t.Helper()
		now = now.Add(d)
		src.set(syncs, pending, oldest)
		err := check()
		switch {
		case wantErr == "" && err != nil:
			t.Errorf("at +%s (syncs %d, pending %d): unhealthy: %v", now.Sub(epoch), syncs, pending, err)
		case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
			t.Errorf("at +%s (syncs %d, pending %d): error %v, want one containing %q", now.Sub(epoch), syncs, pending, err, wantErr)
		}
	}
	step(0, 0, 0, time.Time{}, "")
	if err := ready(); err == nil || !strings.Contains(err.Error(), "no service table built yet") {
		t.Errorf("FirstTable before a table: %v", err)
	}
	step(time.Hour, 0, 3, time.Time{}, "") // starting: healthy, however long
	step(0, 1, 0, time.Time{}, "")
	if err := ready(); err != nil {
		t.Errorf("FirstTable after a table: %v", err)
	}
	step(10*time.Minute, 1, 0, time.Time{}, "") // an old table with nothing pending is fine
	queued := now
	step(0, 1, 2, queued, "")
	step(59*time.Second, 1, 2, queued, "")
	step(time.Second, 1, 2, queued, "2 changed services have waited 1m0s")
	step(time.Second, 2, 0, time.Time{}, "") // a new table went live
}

func TestCheckAll(t *testing.T) {
	// CheckAll runs the checks in order and skips nil ones.
	boom := errors.New("boom")
	if err := admin.CheckAll(nil, func() error { return nil }, func() error { return boom }, func() error { panic("not reached") })(); err != boom {
		t.Errorf("CheckAll: %v", err)
	}
	if err := admin.CheckAll()(); err != nil {
		t.Errorf("CheckAll(): %v", err)
	}
}

func TestConntrackList(t *testing.T) {
	h := admin.New(admin.Config{Conntrack: conntrackTable(t, testFlows...)}).Handler()
	tests := []struct {
		query string
		want  []string // source ports, sorted lines
	}{
		{"", []string{"40001", "40002", "40004", "40003", "40005"}},
		{"?protocol=tcp", []string{"40001", "40002", "40004"}},
		{"?protocol=UDP", []string{"40003", "40005"}},
		{"?service=ns1/web", []string{"40001", "40002", "40003"}},
		{"?service=ns1/web&protocol=udp", []string{"40003"}},
		{"?service=ns1/web:https", []string{"40002"}},
		{"?service=ns1/webby", []string{"40004"}},
		{"?service=ns1/webby:", []string{"40004"}}, // the unnamed port
		{"?service=ns3/nothing", nil},
		{"?dst=10.96.0.53", []string{"40005"}},
		{"?src=10.0.0.2", []string{"40002"}},
		{"?endpoint=10.244.0.5", []string{"40001", "40003"}},
	}
	for _, tt := range tests {
		code, body := get(t, h, "GET", "/debug/conntrack"+tt.query)
		if code != 200 {
			t.Errorf("%s: status %d: %s", tt.query, code, body)
			continue
		}
		if diff := cmp.Diff(tt.want, sports(body)); diff != "" {
			t.Errorf("%s: source ports (-want +got):\n%s\n%s", tt.query, diff, body)
		}
	}
	// The lines are conntrack -L's.
	_, body := get(t, h, "GET", "/debug/conntrack?service=ns1/web:https")
	if !strings.HasPrefix(body, "tcp      6 120 SYN_SENT src=10.0.0.2 dst=10.96.0.10 sport=40002 dport=443 ") ||
		!strings.Contains(body, " [UNREPLIED] src=10.244.0.6 dst=10.0.0.2 sport=8443 dport=40002 ") {
		t.Errorf("unexpected line: %q", body)
	}

	for _, bad := range []string{"?protocol=icmp", "?service=web", "?service=ns1/", "?service=/web", "?src=10.0.0", "?proto=tcp", "?endpoint=x"} {
		if code, body := get(t, h, "GET", "/debug/conntrack"+bad); code != http.StatusBadRequest {
			t.Errorf("%s: status %d: %s", bad, code, body)
		}
	}
	if code, _ := get(t, admin.New(admin.Config{}).Handler(), "GET", "/debug/conntrack"); code != http.StatusServiceUnavailable {
		t.Errorf("no table: status %d", code)
	}
}

func TestConntrackFlush(t *testing.T) {
	tests := []struct {
		query   string
		deleted int
		left    []string
	}{
		{"?service=ns1/web", 3, []string{"40004", "40005"}},
		{"?service=ns1/web:http&protocol=udp", 1, []string{"40001", "40002", "40004", "40005"}},
		{"?protocol=udp", 2, []string{"40001", "40002", "40004"}},
		{"?service=ns1/web&endpoint=10.244.0.5", 2, []string{"40002", "40004", "40005"}},
		{"", 5, nil},
		{"?service=ns9/none", 0, []string{"40001", "40002", "40004", "40003", "40005"}},
	}
	for _, tt := range tests {
		h := admin.New(admin.Config{Conntrack: conntrackTable(t, testFlows...), Control: true}).Handler()
		code, body := get(t, h, "POST", "/debug/conntrack/flush"+tt.query)
		if code != 200 || body != fmt.Sprintf("%d\n", tt.deleted) {
			t.Errorf("flush %s: %d %q, want 200 %d", tt.query, code, body, tt.deleted)
		}
		_, body = get(t, h, "GET", "/debug/conntrack")
		if diff := cmp.Diff(tt.left, sports(body)); diff != "" {
			t.Errorf("after flush %s, left (-want +got):\n%s", tt.query, diff)
		}
	}
	// Not on a TCP address: the metrics address may be exposed.
	h := admin.New(admin.Config{Conntrack: conntrackTable(t, testFlows...)}).Handler()
	if code, body := get(t, h, "POST", "/debug/conntrack/flush"); code != http.StatusForbidden || !strings.Contains(body, "control socket") {
		t.Errorf("flush off the control socket: %d %q; want 403 naming the control socket", code, body)
	}
	if _, body := get(t, h, "GET", "/debug/conntrack"); len(sports(body)) != 5 {
		t.Errorf("entries were deleted by a refused flush:\n%s", body)
	}
	h = admin.New(admin.Config{Conntrack: conntrackTable(t, testFlows...), Control: true}).Handler()
	if code, _ := get(t, h, "GET", "/debug/conntrack/flush"); code != http.StatusMethodNotAllowed {
		t.Errorf("GET flush: status %d", code)
	}
	// A mistyped parameter must not flush everything.
	if code, _ := get(t, h, "POST", "/debug/conntrack/flush?servce=ns1/web"); code != http.StatusBadRequest {
		t.Errorf("mistyped parameter: status %d", code)
	}
	if _, body := get(t, h, "GET", "/debug/conntrack"); len(sports(body)) != 5 {
		t.Errorf("entries were deleted by a bad request:\n%s", body)
	}
}

func TestDebugServices(t *testing.T) {
	tbl := table(t,
		svc("ns1/svc1", "172.30.0.41,fd00::41", ports(sport("p80", tcp, 80)), clientIP(0)),
		slice("ns1/svc1-a", "svc1", ipv4, "p80", tcp, 8080, ep("10.180.0.2", onNode("node-a")), ep("10.180.0.10", onNode("other"))),
		svc("ns2/empty", "172.30.0.42", ports(sport("", udp, 53))),
		svc("ns3/local", "172.30.0.43", ports(sport("", tcp, 80)), itpLocal),
		slice("ns3/local-a", "local", ipv4, "", tcp, 80, eps("10.180.0.3")...),
		svc("ns4/headless", "None", ports(sport("", tcp, 80))),
		svc("ns5/lb", "172.30.0.44", ports(sport("http", tcp, 80)), func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = 32000
			s.Spec.ExternalIPs = []string{"203.0.113.5"}
			s.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24"}
			s.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{{IP: "198.51.100.5"}}
			s.Annotations = map[string]string{service.AnnotationScheduler: "rr", service.AnnotationProxyProtocol: "v2"}
		}),
		slice("ns5/lb-a", "lb", ipv4, "http", tcp, 8080, ep("10.180.0.5", onNode("node-a")), ep("10.180.0.6", onNode("other"))),
	)
	h := admin.New(admin.Config{Table: func() *service.Table { return tbl }}).Handler()
	code, body := get(t, h, "GET", "/debug/services")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	_, rest, _ := strings.Cut(body, "\n") // the header has the build time
	want := `ns1/svc1:p80 TCP 172.30.0.41:80 IPv4 forward to 2 endpoints, affinity ClientIP 3h0m0s
    10.180.0.10:8080 ready serving node=other
    10.180.0.2:8080 ready serving local node=node-a
ns1/svc1:p80 TCP [fd00::41]:80 IPv6 no endpoints: REJECT, affinity ClientIP 3h0m0s
ns2/empty UDP 172.30.0.42:53 IPv4 no endpoints: REJECT
ns3/local TCP 172.30.0.43:80 IPv4 no local endpoints: DROP, internalTrafficPolicy Local
ns5/lb:http TCP 172.30.0.44:80 IPv4 forward to 2 endpoints, scheduler rr, proxy-protocol v2
  external: nodePort 30080, externalIP 203.0.113.5:80, loadBalancerIP 198.51.100.5:80; forward to 1 endpoints, externalTrafficPolicy Local, healthCheckNodePort 32000, loadBalancerSourceRanges 192.0.2.0/24
    10.180.0.5:8080 ready serving local node=node-a
    10.180.0.6:8080 ready serving node=other
# skipped
ns4/headless: headless service (clusterIP: None)
`
	if diff := cmp.Diff(want, rest); diff != "" {
		t.Errorf("/debug/services (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(body, "# service table 1, built ") || !strings.Contains(body, ": 4 services, 5 ports, 1 skipped\n") {
		t.Errorf("header: %q", body[:strings.Index(body, "\n")])
	}

	noTable := admin.New(admin.Config{Table: func() *service.Table { return nil }}).Handler()
	if code, body := get(t, noTable, "GET", "/debug/services"); code != 200 || !strings.Contains(body, "no service table yet") {
		t.Errorf("before the first table: %d %q", code, body)
	}
	noted := admin.New(admin.Config{Table: func() *service.Table { return tbl }, Notes: func() []string { return []string{"NodePort TCP 127.0.0.1:30080 is not served: address in use"} }}).Handler()
	if _, body := get(t, noted, "GET", "/debug/services"); !strings.HasSuffix(body, "# not served as asked\nNodePort TCP 127.0.0.1:30080 is not served: address in use\n") {
		t.Errorf("/debug/services lacks the notes:\n%s", body)
	}
	if code, _ := get(t, admin.New(admin.Config{}).Handler(), "GET", "/debug/services"); code != http.StatusServiceUnavailable {
		t.Errorf("no table source: %d", code)
	}
}

func TestDebugRules(t *testing.T) {
	tbl := table(t,
		svc("ns1/svc1", "172.30.0.41,fd00::41", ports(sport("p80", tcp, 80))),
		slice("ns1/svc1-a", "svc1", ipv4, "p80", tcp, 80, eps("10.180.0.1")...),
		slice("ns1/svc1-b", "svc1", discoveryv1.AddressTypeIPv6, "p80", tcp, 80, eps("fd00:10::1")...),
	)
	opts := rules.Options{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	h := admin.New(admin.Config{Table: func() *service.Table { return tbl }, Rules: opts}).Handler()
	for _, tt := range []struct {
		query string
		opts  rules.Options
	}{
		{"", opts},
		{"?format=restore", rules.Options{Format: rules.FormatRestore, ClusterCIDRs: opts.ClusterCIDRs}},
		{"?family=6", rules.Options{Family: service.IPv6, ClusterCIDRs: opts.ClusterCIDRs}},
		{"?format=save&family=ipv4", rules.Options{Family: service.IPv4, ClusterCIDRs: opts.ClusterCIDRs}},
	} {
		code, body := get(t, h, "GET", "/debug/rules"+tt.query)
		if code != 200 {
			t.Errorf("%s: status %d: %s", tt.query, code, body)
			continue
		}
		if diff := cmp.Diff(writeRules(t, tbl, tt.opts), body); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tt.query, diff)
		}
	}
	for _, bad := range []string{"?format=json", "?family=5"} {
		if code, _ := get(t, h, "GET", "/debug/rules"+bad); code != http.StatusBadRequest {
			t.Errorf("%s: status %d", bad, code)
		}
	}
}

func TestIndexAndNotFound(t *testing.T) {
	h := admin.New(admin.Config{}).Handler()
	if code, body := get(t, h, "GET", "/"); code != 200 || !strings.Contains(body, "/debug/conntrack/flush") {
		t.Errorf("index: %d %q", code, body)
	}
	if code, _ := get(t, h, "GET", "/nope"); code != http.StatusNotFound {
		t.Errorf("unknown path: %d", code)
	}
	if code, _ := get(t, h, "GET", "/metrics"); code != http.StatusServiceUnavailable {
		t.Errorf("metrics without a gatherer: %d", code)
	}
}

// TestProfiling: /debug/pprof/ only when Config.Profiling is set.
func TestProfiling(t *testing.T) {
	if code, _ := get(t, admin.New(admin.Config{}).Handler(), "GET", "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("pprof without Profiling: %d, want 404", code)
	}
	h := admin.New(admin.Config{Profiling: true}).Handler()
	if code, body := get(t, h, "GET", "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("pprof index with Profiling: %d %.80q", code, body)
	}
	if code, body := get(t, h, "GET", "/debug/pprof/goroutine?debug=1"); code != 200 || !strings.Contains(body, "goroutine profile:") {
		t.Errorf("goroutine profile: %d %.80q", code, body)
	}
}

// TestServeAndClient runs the real server on a loopback port, drives it
// with the CLI helpers, and stops it through the context.
func TestServeAndClient(t *testing.T) {
	ct := conntrackTable(t, testFlows...)
	tbl := table(t,
		svc("ns1/svc1", "172.30.0.41", ports(sport("p80", tcp, 80))),
		slice("ns1/svc1-a", "svc1", ipv4, "p80", tcp, 80, eps("10.180.0.1")...),
	)
	reg := prometheus.NewRegistry()
	if err := admin.RegisterMetrics(reg, admin.Sources{Conntrack: ct}); err != nil {
		t.Fatal(err)
	}
	srv := admin.New(admin.Config{Conntrack: ct, Gatherer: reg, Table: func() *service.Table { return tbl }, IPVS: fakeIPVS})
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.ServeListener(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	}()

	list, err := admin.FetchConntrack(ctx, addr, admin.ConntrackQuery{Service: "ns1/web", Protocol: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"40001", "40002"}, sports(list)); diff != "" {
		t.Errorf("FetchConntrack (-want +got):\n%s", diff)
	}
	if _, err := admin.FlushConntrack(ctx, "http://"+addr+"/", admin.ConntrackQuery{Service: "ns1/web"}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("FlushConntrack over TCP: %v; want 403", err)
	}
	// The control socket serves it, to its owner only.
	ctl := admin.New(admin.Config{Conntrack: ct, Control: true})
	sock := filepath.Join(t.TempDir(), "run", "ctl.sock")
	cln, err := ctl.ListenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("control socket mode: %v, %v; want 0600", fi.Mode(), err)
	}
	if _, err := ctl.ListenControl(sock); err == nil || !strings.Contains(err.Error(), "another userproxy") {
		t.Errorf("a second ListenControl on a served socket: %v", err)
	}
	ctlDone := make(chan error, 1)
	go func() { ctlDone <- ctl.ServeListener(ctx, cln) }()
	n, err := admin.FlushConntrack(ctx, "unix:"+sock, admin.ConntrackQuery{Service: "ns1/web"})
	if err != nil || n != 3 {
		t.Errorf("FlushConntrack: %d, %v; want 3", n, err)
	}
	if ct.Len() != 2 {
		t.Errorf("%d entries left, want 2", ct.Len())
	}
	if _, err := admin.FlushConntrack(ctx, "unix:"+sock, admin.ConntrackQuery{Protocol: "icmp"}); err == nil || !strings.Contains(err.Error(), `protocol "icmp": want tcp or udp`) {
		t.Errorf("bad query: %v", err)
	}
	defer func() {
		cancel()
		if err := <-ctlDone; err != nil {
			t.Errorf("control ServeListener: %v", err)
		}
	}()
	got, err := admin.FetchRules(ctx, addr, rules.FormatRestore, service.IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if want := writeRules(t, tbl, rules.Options{Format: rules.FormatRestore, Family: service.IPv4}); got != want {
		t.Errorf("FetchRules:\n%s\nwant:\n%s", got, want)
	}
	ipvs, err := admin.FetchIPVS(ctx, addr, false, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ipvs, "CPS    InPPS") || !strings.Contains(ipvs, "TCP  10.96.0.10:80                       1       10        8     1000      800\n") {
		t.Errorf("FetchIPVS --rate:\n%s", ipvs)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nuserproxy_conntrack_evictions_total 0\n") {
		t.Errorf("metrics over the network:\n%s", body)
	}
}

func TestServeStops(t *testing.T) {
	// Serve binds, and returns nil once the context ends.
	srv := admin.New(admin.Config{ShutdownTimeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, "127.0.0.1:0") }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}

	// A port in use is an error from Serve at once.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := srv.Serve(context.Background(), ln.Addr().String()); err == nil {
		t.Error("Serve on a port in use: no error")
	}

	// A closed listener stops ServeListener with an error.
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln2.Close()
	if err := srv.ServeListener(context.Background(), ln2); err == nil {
		t.Error("ServeListener on a closed listener: no error")
	}

	// The client reports a server that is not there.
	if _, err := admin.FetchConntrack(context.Background(), ln2.Addr().String(), admin.ConntrackQuery{}); err == nil {
		t.Error("FetchConntrack without a server: no error")
	}
}

func TestDebugDNS(t *testing.T) {
	if code, body := get(t, admin.New(admin.Config{}).Handler(), "GET", "/debug/dns"); code != http.StatusServiceUnavailable || !strings.Contains(body, "off") {
		t.Errorf("without DNS: %d %q", code, body)
	}
	code, body := get(t, admin.New(admin.Config{DNS: dnsFake}).Handler(), "GET", "/debug/dns")
	want := `# cluster DNS for cluster.local., upstream none (names outside the domain are REFUSED)
dns 10.96.0.10:53: answering (udp, tcp)
dns [fd00:96::a]:53: stepped aside for kube-system/kube-dns (its Service owns the address; queries go to its endpoints)
# dropped 1, truncated 2, forwarded 3, upstream errors 1; answered queries by type and rcode:
A NOERROR 5
SRV NXDOMAIN 1
`
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("/debug/dns (-want +got):\n%s", diff)
	}
}

// TestProxyModeAndConfigz: kube-proxy's /proxyMode (the mode, no newline)
// and /configz (JSON), as cmd/kube-proxy/app/server.go serves them; 404
// when not configured.
func TestProxyModeAndConfigz(t *testing.T) {
	h := admin.New(admin.Config{ProxyMode: "ipvs", Configz: func() ([]byte, error) {
		return []byte(`{"kubeproxy.config.k8s.io":{"mode":"ipvs"}}`), nil
	}}).Handler()
	if code, body := get(t, h, "GET", "/proxyMode"); code != http.StatusOK || body != "ipvs" {
		t.Errorf("/proxyMode: %d %q", code, body)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/configz", nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" || !strings.Contains(rec.Body.String(), `"mode":"ipvs"`) {
		t.Errorf("/configz: %d %q %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
	h = admin.New(admin.Config{}).Handler()
	for _, path := range []string{"/proxyMode", "/configz"} {
		if code, _ := get(t, h, "GET", path); code != http.StatusNotFound {
			t.Errorf("%s unconfigured: %d; want 404", path, code)
		}
	}
}

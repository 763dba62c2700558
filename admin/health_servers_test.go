package admin_test

import (
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/service"
)

// freeLoopbackPort returns a TCP port nothing listens on at 127.0.0.1.
func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func httpGet(t *testing.T, url string) (int, http.Header, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// lbLocal is a LoadBalancer Service ns1/lb, externalTrafficPolicy Local,
// with healthCheckNodePort hc, and its slice with the given endpoints.
func lbLocal(hc int, endpoints ...discoveryv1.Endpoint) []any {
	return []any{
		svc("ns1/lb", "172.30.0.50", ports(sport("http", tcp, 80), sport("https", tcp, 443)), func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeLoadBalancer
			s.Spec.Ports[0].NodePort, s.Spec.Ports[1].NodePort = 30080, 30443
			s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
			s.Spec.HealthCheckNodePort = int32(hc)
		}),
		slice("ns1/lb-a", "lb", ipv4, "http", tcp, 8080, endpoints...),
		slice("ns1/lb-b", "lb", ipv4, "https", tcp, 8443, endpoints...),
	}
}

// The health check node port of pkg/proxy/healthcheck/service_health.go:
// 200 while this node has a ready endpoint of the Service (counted once per
// IP across its ports) and the proxier is healthy, else 503, with
// kube-proxy's JSON body and headers; the count follows the tables 1 -> 0
// (only a terminating one left) -> 1.
func TestServiceHealthNodePort(t *testing.T) {
	hcPort := freeLoopbackPort(t)
	healthy := true
	sh := admin.NewServiceHealth([]netip.Addr{netip.MustParseAddr("127.0.0.1")}, func() bool { return healthy }, nil)
	defer sh.Close()
	url := "http://127.0.0.1:" + strconv.Itoa(hcPort) + "/"
	body := func(n int, ok bool) string {
		return "{\n\t\"service\": {\n\t\t\"namespace\": \"ns1\",\n\t\t\"name\": \"lb\"\n\t},\n\t\"localEndpoints\": " +
			strconv.Itoa(n) + ",\n\t\"serviceProxyHealthy\": " + strconv.FormatBool(ok) + "\n}"
	}
	check := func(step string, wantCode, wantN int, wantHealthy bool) {
		t.Helper()
		code, h, b := httpGet(t, url)
		if code != wantCode || b != body(wantN, wantHealthy) ||
			h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" ||
			h.Get("X-Load-Balancing-Endpoint-Weight") != strconv.Itoa(wantN) {
			t.Fatalf("%s: %d %q %v; want %d %q", step, code, b, h, wantCode, body(wantN, wantHealthy))
		}
	}
	sh.Sync(table(t, lbLocal(hcPort, ep("10.180.0.1", onNode("node-a")), ep("10.180.0.2", onNode("other")))...))
	check("one local ready endpoint", 200, 1, true)
	terminatingOnly := ep("10.180.0.1", onNode("node-a"), func(e *discoveryv1.Endpoint) {
		e.Conditions.Ready, e.Conditions.Serving, e.Conditions.Terminating = ptr(false), ptr(true), ptr(true)
	})
	sh.Sync(table(t, lbLocal(hcPort, terminatingOnly, ep("10.180.0.2", onNode("other")))...))
	check("only a terminating local endpoint", 503, 0, true)
	sh.Sync(table(t, lbLocal(hcPort, ep("10.180.0.1", onNode("node-a")), ep("10.180.0.2", onNode("other")))...))
	check("the local endpoint ready again", 200, 1, true)
	sh.Sync(table(t, lbLocal(hcPort, ep("10.180.0.1", onNode("node-a")), ep("10.180.0.3", onNode("node-a")))...))
	check("two local ready endpoints", 200, 2, true)
	healthy = false
	check("the proxier unhealthy", 503, 2, false)
	healthy = true

	// Another Service takes the port in the same table as ns1/lb gives it
	// up: it is served at once (closed before opened).
	handed := lbLocal(hcPort, ep("10.180.0.1", onNode("node-a")))
	handed[0].(*v1.Service).Spec.HealthCheckNodePort = int32(freeLoopbackPort(t))
	other := svc("ns1/lb2", "172.30.0.52", ports(sport("http", tcp, 80)), func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeLoadBalancer
		s.Spec.Ports[0].NodePort = 30081
		s.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = int32(hcPort)
	})
	sh.Sync(table(t, append(handed, other, slice("ns1/lb2-a", "lb2", ipv4, "http", tcp, 8080, ep("10.180.0.9", onNode("node-a"))))...))
	if f := sh.Failed(); len(f) != 0 {
		t.Fatalf("after the hand-over: Failed %q", f)
	}
	if _, _, b := httpGet(t, url); !strings.Contains(b, `"name": "lb2"`) {
		t.Fatalf("after the hand-over: %s", b)
	}

	// The Service loses its health check node port: the server closes.
	sh.Sync(table(t, svc("ns1/other", "172.30.0.51", ports(sport("", tcp, 80)))))
	if _, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(hcPort), time.Second); err == nil {
		t.Fatal("the health check node port of a deleted Service still accepts")
	}
	// A port in use: reported, not fatal.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	sh.Sync(table(t, lbLocal(taken.Addr().(*net.TCPAddr).Port, ep("10.180.0.1", onNode("node-a")))...))
	if f := sh.Failed(); len(f) != 1 || !strings.Contains(f[0], "ns1/lb") {
		t.Fatalf("Failed: %q", f)
	}
}

// fakeStats is a Tracker's Health for ProxierHealth.
type fakeStats struct{ st service.Health }

func (f *fakeStats) Health() service.Health { return f.st }

// kube-proxy's /healthz and /livez (pkg/proxy/healthcheck/proxy_health.go,
// v1.37's ProxyHealth marshalled): healthy while starting; unhealthy once a
// change has waited the health timeout, until a table; /healthz also while
// the Node is not eligible (and before it is seen, when one is watched);
// answers counted by code; userproxy's problems field says what the host
// does wrong without changing the code.
func TestProxierHealth(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	src := &fakeStats{}
	h := admin.NewProxierHealth(src, []service.Family{service.IPv4, service.IPv6}, true, time.Minute, func() time.Time { return now })
	srv := newLoopbackServer(t, h.Handler())
	get := func(path string) (int, string) {
		code, hdr, body := httpGet(t, srv+path)
		if hdr.Get("Content-Type") != "application/json" || hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s headers %v", path, hdr)
		}
		return code, body
	}
	ts := func(tm time.Time) string { return tm.Format(time.RFC3339Nano) }
	zero := "0001-01-01T00:00:00Z"
	if code, body := get("/healthz"); code != 503 || body != `{"lastUpdated":"`+zero+`","currentTime":"`+ts(now)+`","nodeEligible":false,"healthy":true}` {
		t.Fatalf("starting, the Node not seen yet: %d %s", code, body)
	}
	h.SetNodeEligible(true)
	if code, body := get("/healthz"); code != 200 || body != `{"lastUpdated":"`+ts(now)+`","currentTime":"`+ts(now)+`","nodeEligible":true,"healthy":true}` {
		t.Fatalf("starting: %d %s", code, body)
	}
	synced := now
	src.st = service.Health{Syncs: 1, LastSyncTime: synced, OldestPending: now.Add(10 * time.Second)}
	now = now.Add(69 * time.Second) // the change has waited 59 s
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("a change waiting less than the timeout: %d", code)
	}
	now = now.Add(time.Second)
	status := func(ok bool) string {
		b := strconv.FormatBool(ok)
		return `"status":{"IPv4":{"lastUpdated":"` + ts(synced) + `","healthy":` + b + `},"IPv6":{"lastUpdated":"` + ts(synced) + `","healthy":` + b + `}}`
	}
	if code, body := get("/healthz"); code != 503 || body != `{"lastUpdated":"`+ts(synced)+`","currentTime":"`+ts(now)+`","nodeEligible":true,"healthy":false,`+status(false)+`}` {
		t.Fatalf("a change waiting the timeout: %d %s", code, body)
	}
	if code, body := get("/livez"); code != 503 || body != `{"lastUpdated":"`+ts(synced)+`","currentTime":"`+ts(now)+`","healthy":false,`+status(false)+`}` {
		t.Fatalf("livez: %d %s", code, body)
	}
	src.st.OldestPending = time.Time{}
	h.SetNodeEligible(false)
	if code, body := get("/healthz"); code != 503 || !strings.Contains(body, `"nodeEligible":false,"healthy":true,`+status(true)) {
		t.Fatalf("node not eligible: %d %s", code, body)
	}
	if code, _ := get("/livez"); code != 200 {
		t.Fatalf("livez ignores the Node: %d", code)
	}
	// userproxy's problems: listed, the code untouched; absent when none.
	var problems []string
	h.SetProblems(func() []string { return problems })
	h.SetNodeEligible(true)
	problems = []string{"kube-proxy's rules are still hooked into nat OUTPUT"}
	if code, body := get("/healthz"); code != 200 || !strings.HasSuffix(body, status(true)+`,"problems":["kube-proxy's rules are still hooked into nat OUTPUT"]}`) {
		t.Fatalf("a problem on the host: %d %s", code, body)
	}
	problems = nil
	if code, body := get("/livez"); code != 200 || strings.Contains(body, "problems") {
		t.Fatalf("no problem: %d %s", code, body)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	want := `
# HELP kubeproxy_proxy_healthz_total Cumulative proxy healthz HTTP status (kube-proxy's series).
# TYPE kubeproxy_proxy_healthz_total counter
kubeproxy_proxy_healthz_total{code="200"} 3
kubeproxy_proxy_healthz_total{code="503"} 3
# HELP kubeproxy_proxy_livez_total Cumulative proxy livez HTTP status (kube-proxy's series).
# TYPE kubeproxy_proxy_livez_total counter
kubeproxy_proxy_livez_total{code="200"} 2
kubeproxy_proxy_livez_total{code="503"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// newLoopbackServer serves h on 127.0.0.1 until the test ends and returns
// its base URL.
func newLoopbackServer(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return "http://" + ln.Addr().String()
}

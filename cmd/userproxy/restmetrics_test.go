package main

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/userproxy/userproxy/service"
)

// TestRESTClientMetrics: a request made with client-go is counted in our
// registry under client-go's series (component-base
// metrics/prometheus/restclient/metrics.go: rest_client_requests_total
// {code,method,host}, rest_client_request_duration_seconds{verb,host} with
// its buckets).
func TestRESTClientMetrics(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
	}))
	defer srv.Close()
	m := newRESTClientMetrics()
	useRESTClientMetrics(m)
	defer useRESTClientMetrics(nil)
	reg := prometheus.NewPedanticRegistry()
	if err := m.register(reg); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	cs.Discovery().RESTClient().(*rest.RESTClient).Client.CloseIdleConnections()
	host := mustURL(t, srv.URL).Host

	if got := testutil.ToFloat64(m.requests.WithLabelValues("200", "GET", host)); got != 1 {
		t.Errorf(`rest_client_requests_total{code="200",method="GET",host=%q} = %v, want 1`, host, got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
		if mf.GetName() != "rest_client_request_duration_seconds" {
			continue
		}
		m := mf.GetMetric()[0]
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if diff := cmp.Diff(map[string]string{"verb": "GET", "host": host}, labels); diff != "" {
			t.Errorf("duration labels (-want +got):\n%s", diff)
		}
		var bounds []float64
		for _, b := range m.GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		if diff := cmp.Diff([]float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}, bounds); diff != "" {
			t.Errorf("duration buckets (-component-base +ours):\n%s", diff)
		}
	}
	for _, want := range []string{"rest_client_requests_total", "rest_client_request_duration_seconds", "rest_client_rate_limiter_duration_seconds"} {
		if !slices.Contains(names, want) {
			t.Errorf("%s not gathered (have %v)", want, names)
		}
	}

	// Once uninstalled, requests are not counted.
	useRESTClientMetrics(nil)
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	cs.Discovery().RESTClient().(*rest.RESTClient).Client.CloseIdleConnections()
	if got := testutil.ToFloat64(m.requests.WithLabelValues("200", "GET", host)); got != 1 {
		t.Errorf("after uninstalling: %v requests, want still 1", got)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestServedFamilies(t *testing.T) {
	for _, tc := range []struct {
		cidrs []string
		want  []service.Family
	}{
		{[]string{"10.96.0.0/12"}, []service.Family{service.IPv4}},
		{[]string{"fd00:96::/108", "10.96.0.0/12"}, []service.Family{service.IPv4, service.IPv6}},
		{[]string{"fd00:96::/108"}, []service.Family{service.IPv6}},
	} {
		var ps []netip.Prefix
		for _, c := range tc.cidrs {
			ps = append(ps, netip.MustParsePrefix(c))
		}
		if diff := cmp.Diff(tc.want, servedFamilies(ps)); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tc.cidrs, diff)
		}
	}
}

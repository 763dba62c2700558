package admin_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/service"
)

// kubeProxyFamily is one metric family as kube-proxy declares it.
type kubeProxyFamily struct {
	name   string
	typ    dto.MetricType
	labels []string  // sorted, without "le"
	bounds []float64 // histograms only
}

// kubeProxySeries are the series we export that kube-proxy exports too, as
// kube-proxy declares them in kubernetes pkg/proxy/metrics/metrics.go
// (v1.37.2, the release of our client-go): full name, type, label names and
// histogram bounds. A dashboard or alert written for kube-proxy reads these
// names; renaming one, or changing its type, labels or buckets, must fail
// TestKubeProxySeriesMatchMetricsGo. Written out here from metrics.go, not
// derived from our code.
var kubeProxySeries = []kubeProxyFamily{
	// SyncProxyRulesLatency: HistogramVec, ExponentialBuckets(0.001, 2, 15), ip_family.
	{"kubeproxy_sync_proxy_rules_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"},
		[]float64{0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384}},
	// SyncProxyRulesLastTimestamp: GaugeVec, ip_family.
	{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", dto.MetricType_GAUGE, []string{"ip_family"}, nil},
	// SyncProxyRulesLastQueuedTimestamp: GaugeVec, ip_family.
	{"kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", dto.MetricType_GAUGE, []string{"ip_family"}, nil},
	// NetworkProgrammingLatency: HistogramVec, MergeBuckets(LinearBuckets(0.25, 0.25, 2),
	// LinearBuckets(1, 1, 59), LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7)) —
	// MergeBuckets starts from a slice holding 0 — ip_family.
	{"kubeproxy_network_programming_duration_seconds", dto.MetricType_HISTOGRAM, []string{"ip_family"}, append([]float64{0, 0.25, 0.5},
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
		31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59,
		60, 65, 70, 75, 80, 85, 90, 95, 100, 105, 110, 115,
		120, 150, 180, 210, 240, 270, 300)},
	// EndpointChangesPending, EndpointChangesTotal, ServiceChangesPending,
	// ServiceChangesTotal: plain Gauge and Counter, no labels.
	{"kubeproxy_sync_proxy_rules_endpoint_changes_pending", dto.MetricType_GAUGE, nil, nil},
	{"kubeproxy_sync_proxy_rules_endpoint_changes_total", dto.MetricType_COUNTER, nil, nil},
	{"kubeproxy_sync_proxy_rules_service_changes_pending", dto.MetricType_GAUGE, nil, nil},
	{"kubeproxy_sync_proxy_rules_service_changes_total", dto.MetricType_COUNTER, nil, nil},
	// SyncProxyRulesNoLocalEndpointsTotal: GaugeVec (a gauge despite _total),
	// traffic_policy and ip_family.
	{"kubeproxy_sync_proxy_rules_no_local_endpoints_total", dto.MetricType_GAUGE, []string{"ip_family", "traffic_policy"}, nil},
	// iptablesCTStateInvalidDroppedPacketsDescription: NewDesc, a counter
	// (nfacctMetricCollector, metrics_linux.go), no labels.
	{"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", dto.MetricType_COUNTER, nil, nil},
}

// TestKubeProxySeriesMatchMetricsGo checks the collector's output against
// kubeProxySeries: each is there with kube-proxy's type, labels and bounds;
// no other series takes kube-proxy's prefix; every other is userproxy_.
// The Tracker is a real one, so the bounds are those the code uses.
func TestKubeProxySeriesMatchMetricsGo(t *testing.T) {
	tr, err := service.NewTracker(service.Config{NodeName: "node1", Clock: service.NewManualClock(time.Unix(1735689600, 0))})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.OnSynced()
	src := fakeSources()
	src.Tracker = tr
	reg := prometheus.NewPedanticRegistry()
	if err := admin.RegisterMetrics(reg, src); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	for _, want := range kubeProxySeries {
		t.Run(want.name, func(t *testing.T) {
			mf := got[want.name]
			if mf == nil {
				t.Fatalf("%s is not exported (kube-proxy's metrics.go has it)", want.name)
			}
			if mf.GetType() != want.typ {
				t.Errorf("type %v, kube-proxy's is %v", mf.GetType(), want.typ)
			}
			if len(mf.GetMetric()) == 0 {
				t.Fatal("no series")
			}
			for _, m := range mf.GetMetric() {
				var labels []string
				for _, l := range m.GetLabel() {
					labels = append(labels, l.GetName())
				}
				slices.Sort(labels)
				if diff := cmp.Diff(want.labels, labels); diff != "" {
					t.Errorf("labels (-kube-proxy +ours):\n%s", diff)
				}
				if want.typ != dto.MetricType_HISTOGRAM {
					continue
				}
				var bounds []float64
				for _, b := range m.GetHistogram().GetBucket() {
					bounds = append(bounds, b.GetUpperBound())
				}
				if diff := cmp.Diff(want.bounds, bounds); diff != "" {
					t.Errorf("buckets (-kube-proxy +ours):\n%s", diff)
				}
			}
		})
	}
	for name := range got {
		known := slices.ContainsFunc(kubeProxySeries, func(f kubeProxyFamily) bool { return f.name == name })
		switch {
		case strings.HasPrefix(name, "kubeproxy_") && !known:
			t.Errorf("%s has kube-proxy's prefix but is not in kubeProxySeries: add it from metrics.go, or name it userproxy_", name)
		case !strings.HasPrefix(name, "kubeproxy_") && !strings.HasPrefix(name, "userproxy_"):
			t.Errorf("%s: neither kube-proxy's nor ours", name)
		}
	}
}

// TestKubeProxySeriesNotAlsoOurs: no kube-proxy series is exported a
// second time under our prefix (the names before issue 17 were
// userproxy_sync_proxy_rules_* and userproxy_ct_state_invalid_...).
func TestKubeProxySeriesNotAlsoOurs(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := admin.RegisterMetrics(reg, fakeSources()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, s := range kubeProxySeries {
			if old := strings.Replace(s.name, "kubeproxy_", "userproxy_", 1); mf.GetName() == old ||
				mf.GetName() == strings.Replace(old, "_iptables_ct_state", "_ct_state", 1) {
				t.Errorf("%s is also exported as %s", s.name, mf.GetName())
			}
		}
	}
}

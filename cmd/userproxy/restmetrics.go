package main

// REST client metrics: client-go's request metrics (rest_client_*), with
// the names, labels and buckets of k8s.io/component-base's adapter
// (metrics/prometheus/restclient/metrics.go, v0.37.2), recorded into our
// injected registry rather than component-base's global one.
//
//  1. run creates a restClientMetrics before the cluster source, so that
//     the first LIST is counted, and installs it (useRESTClientMetrics).
//  2. client-go's tools/metrics.Register takes adapters once per process;
//     they forward to the installed restClientMetrics (an atomic pointer),
//     so a second run in one process (the tests) records into its own.
//  3. startAdmin registers the vectors on the registry it creates.

import (
	"context"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// Bucket bounds of component-base's restclient adapter.
var (
	restLatencyBuckets = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	restSizeBuckets    = []float64{64, 256, 512, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216}
)

// restClientMetrics are the series client-go's request path feeds.
type restClientMetrics struct {
	requests     *prometheus.CounterVec   // rest_client_requests_total{code,method,host}
	duration     *prometheus.HistogramVec // rest_client_request_duration_seconds{verb,host}
	rateLimiter  *prometheus.HistogramVec // rest_client_rate_limiter_duration_seconds{verb,host}
	retries      *prometheus.CounterVec   // rest_client_request_retries_total{code,verb,host}
	requestSize  *prometheus.HistogramVec // rest_client_request_size_bytes{verb,host}
	responseSize *prometheus.HistogramVec // rest_client_response_size_bytes{verb,host}
}

func newRESTClientMetrics() *restClientMetrics {
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, []string{"verb", "host"})
	}
	return &restClientMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_requests_total",
			Help: "Number of HTTP requests, partitioned by status code, method, and host."}, []string{"code", "method", "host"}),
		duration: hist("rest_client_request_duration_seconds", "Request latency in seconds. Broken down by verb, and host.", restLatencyBuckets),
		rateLimiter: hist("rest_client_rate_limiter_duration_seconds",
			"Client side rate limiter latency in seconds. Broken down by verb, and host.", restLatencyBuckets),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rest_client_request_retries_total",
			Help: "Number of request retries, partitioned by status code, verb, and host."}, []string{"code", "verb", "host"}),
		requestSize:  hist("rest_client_request_size_bytes", "Request size in bytes. Broken down by verb and host.", restSizeBuckets),
		responseSize: hist("rest_client_response_size_bytes", "Response size in bytes. Broken down by verb and host.", restSizeBuckets),
	}
}

// register registers every vector on reg.
func (m *restClientMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.rateLimiter, m.retries, m.requestSize, m.responseSize} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

var (
	currentRESTMetrics  atomic.Pointer[restClientMetrics]
	registerRESTAdapter sync.Once
)

// useRESTClientMetrics makes m the target of client-go's request metrics
// (nil: none).
func useRESTClientMetrics(m *restClientMetrics) {
	currentRESTMetrics.Store(m)
	registerRESTAdapter.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestLatency:     restLatency{func(m *restClientMetrics) *prometheus.HistogramVec { return m.duration }},
			RateLimiterLatency: restLatency{func(m *restClientMetrics) *prometheus.HistogramVec { return m.rateLimiter }},
			RequestResult:      restResult{},
			RequestRetry:       restRetry{},
			RequestSize:        restSize{func(m *restClientMetrics) *prometheus.HistogramVec { return m.requestSize }},
			ResponseSize:       restSize{func(m *restClientMetrics) *prometheus.HistogramVec { return m.responseSize }},
		})
	})
}

// The adapters: each records into the installed restClientMetrics.
type (
	restLatency struct {
		vec func(*restClientMetrics) *prometheus.HistogramVec
	}
	restSize struct {
		vec func(*restClientMetrics) *prometheus.HistogramVec
	}
	restResult struct{}
	restRetry  struct{}
)

var (
	_ clientmetrics.LatencyMetric = restLatency{}
	_ clientmetrics.SizeMetric    = restSize{}
	_ clientmetrics.ResultMetric  = restResult{}
	_ clientmetrics.RetryMetric   = restRetry{}
)

// Observe records a request's latency under its verb and the URL's host,
// as component-base's adapter does.
func (l restLatency) Observe(_ context.Context, verb string, u url.URL, latency time.Duration) {
	if m := currentRESTMetrics.Load(); m != nil {
		l.vec(m).WithLabelValues(verb, u.Host).Observe(latency.Seconds())
	}
}

func (s restSize) Observe(_ context.Context, verb, host string, size float64) {
	if m := currentRESTMetrics.Load(); m != nil {
		s.vec(m).WithLabelValues(verb, host).Observe(size)
	}
}

func (restResult) Increment(_ context.Context, code, method, host string) {
	if m := currentRESTMetrics.Load(); m != nil {
		m.requests.WithLabelValues(code, method, host).Inc()
	}
}

func (restRetry) IncrementRetry(_ context.Context, code, verb, host string) {
	if m := currentRESTMetrics.Load(); m != nil {
		m.retries.WithLabelValues(code, verb, host).Inc()
	}
}

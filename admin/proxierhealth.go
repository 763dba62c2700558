package admin

// kube-proxy's proxier health server (pkg/proxy/healthcheck/proxy_health.go),
// on --healthz-bind-address (10256 on a node), for the probes, load
// balancers and tools that know kube-proxy's:
//
//  1. /healthz and /livez answer kube-proxy's JSON (v1.37's ProxyHealth,
//     marshalled): lastUpdated, currentTime, nodeEligible (/healthz only),
//     healthy, and the status of each served family once a table exists.
//  2. Healthy while starting (no table yet, nothing queued), and while no
//     change has waited longer than the health timeout for a table
//     (service.Health.OldestPending: kube-proxy's QueuedUpdate); unhealthy
//     after that, until the next table.
//  3. /healthz is also unhealthy while this Node is not eligible: not seen
//     yet, being deleted, or tainted ToBeDeletedByClusterAutoscaler
//     (SetNodeEligible, from the Node watch); /livez ignores the Node. With
//     no Node to watch (a file source) the node is eligible.
//  4. Both count their answers by code: kubeproxy_proxy_healthz_total and
//     kubeproxy_proxy_livez_total.
//  5. One field of userproxy's own, problems, lists what the host does
//     that keeps Service traffic from reaching the proxy (SetProblems:
//     kube-proxy's leftover rules, local ClusterIPs, a route elsewhere),
//     so that whoever reads the JSON learns why Services fail on a node
//     that answers healthy. It does not change the code: kube-proxy's
//     health says whether the proxier keeps up, and load balancers act
//     on it; /readyz on the admin address fails for these.
//
// The admin server's own /healthz stays for humans, with its reasons.

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/service"
)

// DefaultHealthTimeout is kube-proxy's health timeout: twice its default
// --iptables-sync-period of 30 s.
const DefaultHealthTimeout = 60 * time.Second

// ProxierHealth is kube-proxy's proxier health state and its HTTP server.
// It is safe for concurrent use.
type ProxierHealth struct {
	src      interface{ Health() service.Health }
	timeout  time.Duration
	now      func() time.Time
	families []service.Family

	nodeEligible atomic.Bool
	problems     atomic.Pointer[func() []string]
	// answers by endpoint (healthz, livez) and code (200, 503).
	answers [2][2]atomic.Uint64
}

// NewProxierHealth returns the health state of the tracker src serving
// families (the status entries; none: IPv4): timeout is the health timeout
// (0: DefaultHealthTimeout), now the clock (nil: time.Now). watchesNode
// says a Node will be watched: the node is then not eligible until it is
// seen, as kube-proxy's NodeEligible answers without a Node.
func NewProxierHealth(src interface{ Health() service.Health }, families []service.Family, watchesNode bool, timeout time.Duration, now func() time.Time) *ProxierHealth {
	if timeout <= 0 {
		timeout = DefaultHealthTimeout
	}
	if now == nil {
		now = time.Now
	}
	if len(families) == 0 {
		families = []service.Family{service.IPv4}
	}
	h := &ProxierHealth{src: src, timeout: timeout, now: now, families: families}
	h.nodeEligible.Store(!watchesNode)
	return h
}

// SetNodeEligible records whether this Node may receive traffic (step 3).
func (h *ProxierHealth) SetNodeEligible(ok bool) { h.nodeEligible.Store(ok) }

// SetProblems sets what lists the host's problems in the JSON (step 5).
func (h *ProxierHealth) SetProblems(f func() []string) { h.problems.Store(&f) }

// NodeEligible reports what SetNodeEligible last said (true before).
func (h *ProxierHealth) NodeEligible() bool { return h.nodeEligible.Load() }

// IsHealthy reports the proxier's health (step 2), ignoring the Node: what
// the service health servers report as serviceProxyHealthy.
func (h *ProxierHealth) IsHealthy() bool {
	return h.health(h.now()).Healthy
}

// proxyHealth is kube-proxy's ProxyHealth (pkg/proxy/healthcheck
// proxy_health.go, v1.37), the JSON both endpoints answer.
type proxyHealth struct {
	LastUpdated  time.Time               `json:"lastUpdated"`
	CurrentTime  time.Time               `json:"currentTime"`
	NodeEligible *bool                   `json:"nodeEligible,omitempty"`
	Healthy      bool                    `json:"healthy"`
	Status       map[string]familyHealth `json:"status,omitempty"`
	// Problems is userproxy's (step 5), absent when there are none.
	Problems []string `json:"problems,omitempty"`
}

// familyHealth is kube-proxy's ProxierHealth: one family's proxier.
type familyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// health is kube-proxy's Health() at now. One table here serves every
// family, so each family's status is the same.
func (h *ProxierHealth) health(now time.Time) proxyHealth {
	st := h.src.Health()
	ph := proxyHealth{CurrentTime: now, Healthy: true, Status: map[string]familyHealth{}}
	if st.Syncs == 0 {
		return ph // no proxier has updated yet: healthy, no status
	}
	ph.LastUpdated = st.LastSyncTime
	if !st.OldestPending.IsZero() && now.Sub(st.OldestPending) >= h.timeout {
		ph.Healthy = false
	}
	for _, f := range h.families {
		ph.Status[f.String()] = familyHealth{LastUpdated: st.LastSyncTime, Healthy: ph.Healthy}
	}
	return ph
}

// Handler serves /healthz and /livez.
func (h *ProxierHealth) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { h.answer(w, true) })
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) { h.answer(w, false) })
	return mux
}

// answer writes /healthz (healthz) or /livez as kube-proxy does.
func (h *ProxierHealth) answer(w http.ResponseWriter, healthz bool) {
	now := h.now()
	ph := h.health(now)
	healthy := ph.Healthy
	if healthz {
		eligible := h.NodeEligible()
		ph.NodeEligible = &eligible
		healthy = healthy && eligible
	}
	if p := h.problems.Load(); p != nil {
		ph.Problems = (*p)()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	endpoint := 1
	if healthz {
		endpoint = 0
	}
	if healthy {
		h.answers[endpoint][0].Add(1)
		w.WriteHeader(http.StatusOK)
		// As kube-proxy: a healthy answer says it was updated now.
		ph.LastUpdated = now
	} else {
		h.answers[endpoint][1].Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	out, _ := json.Marshal(ph)
	_, _ = w.Write(out)
}

// Serve serves the handler on ln until ctx is done.
func (h *ProxierHealth) Serve(ctx context.Context, ln net.Listener, logger *zap.Logger) {
	srv := &http.Server{Handler: h.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { // proxier health server shutdown
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		logger.Error("proxier health server stopped", zap.Error(err))
	}
	<-done
}

var (
	healthzTotalDesc = prometheus.NewDesc("kubeproxy_proxy_healthz_total",
		"Cumulative proxy healthz HTTP status (kube-proxy's series).", []string{"code"}, nil)
	livezTotalDesc = prometheus.NewDesc("kubeproxy_proxy_livez_total",
		"Cumulative proxy livez HTTP status (kube-proxy's series).", []string{"code"}, nil)
)

// Describe implements prometheus.Collector: kubeproxy_proxy_healthz_total
// and kubeproxy_proxy_livez_total (step 4).
func (h *ProxierHealth) Describe(ch chan<- *prometheus.Desc) {
	ch <- healthzTotalDesc
	ch <- livezTotalDesc
}

// Collect implements prometheus.Collector.
func (h *ProxierHealth) Collect(ch chan<- prometheus.Metric) {
	for i, d := range []*prometheus.Desc{healthzTotalDesc, livezTotalDesc} {
		for j, code := range []string{"200", "503"} {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(h.answers[i][j].Load()), code)
		}
	}
}

var _ prometheus.Collector = (*ProxierHealth)(nil)

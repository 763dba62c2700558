package admin

// The HTTP server, in the order a request meets it:
//
//  1. Listen binds the address (loopback by default) and Serve runs the
//     server until its context ends, then shuts it down gracefully;
//  2. the mux routes by method and path: /healthz and /livez (health.go),
//     /metrics, /debug/conntrack (GET) and /debug/conntrack/flush (POST),
//     /debug/services, /debug/rules, /debug/dns (views.go), /debug/ipvs
//     (ipvs.go), /debug/explain (explain.go, JSON);
//  3. each handler reads the current state through Config (the health
//     check, the gatherer, the service table, the conntrack table, the
//     IPVS snapshot) and answers in plain text.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// DefaultAddr is the admin server's default address: loopback only, on
// kube-proxy's metrics port.
const DefaultAddr = "127.0.0.1:10249"

// DefaultShutdownTimeout bounds a graceful shutdown.
const DefaultShutdownTimeout = 5 * time.Second

// ConntrackTable is what the server needs of the conntrack table
// (*conntrack.Table implements it).
type ConntrackTable interface {
	List(f conntrack.Filter) []conntrack.EntryInfo
	Delete(f conntrack.Filter) int
}

var _ ConntrackTable = (*conntrack.Table)(nil)

// Config configures a Server. Every field is optional: an endpoint whose
// source is nil answers 503 and says what it lacks (the health endpoints
// always work).
type Config struct {
	// Logger gets the server's own events (listen, shutdown, flushes,
	// errors) with structured fields; the caller names it. Nil means
	// zap.NewNop().
	Logger *zap.Logger
	// Gatherer is what /metrics serves (usually the registry the
	// collector of RegisterMetrics went to).
	Gatherer prometheus.Gatherer
	// Health decides /healthz: nil error is healthy (200 "ok"), an error
	// is unhealthy (503 with the error's text). Nil means always healthy.
	// SyncHealth and CheckAll build one. It is called once per request.
	Health func() error
	// Ready decides /readyz together with Health: nil is ready once Health
	// passes. FirstTable builds the check that the proxy serves at all.
	Ready func() error
	// Notes, when set, lists what works less than asked without making the
	// proxy unhealthy (an external address that cannot be routed, a
	// NodePort taken on the host): /healthz stays 200 and adds a
	// "note: ..." line for each.
	Notes func() []string
	// Table returns the current service table for /debug/services and
	// /debug/rules (Tracker.Current or Proxy.Table); it may return nil
	// before the first table.
	Table func() *service.Table
	// Conntrack serves /debug/conntrack and /debug/conntrack/flush.
	Conntrack ConntrackTable
	// Rules are the options of /debug/rules; the query parameters format
	// and family override Format and Family.
	Rules rules.Options
	// IPVS returns the service table as IPVS virtual services for
	// /debug/ipvs (Proxy.IPVS). It is called once per request.
	IPVS func() []proxy.VirtualService
	// Dial serves /debug/dial: how flows reach endpoints (--dial-via),
	// what the auto policy remembers and the tunnels through the API
	// server. nil: the page says every flow goes direct.
	Dial func() DialView
	// Explain serves /debug/explain: what a new flow would meet
	// (userproxy explain); Destination reads its "to". nil: 404.
	Explain     func(proxy.ExplainQuery) proxy.Explanation
	Destination func(string) (netip.AddrPort, error)
	// Profiling serves Go's profiles under /debug/pprof/ (kube-proxy's
	// enableProfiling). Off by default: a CPU profile costs the datapath.
	Profiling bool
	// DNS serves /debug/dns (*clusterdns.Responder); nil when cluster DNS
	// is off.
	DNS interface {
		Status() clusterdns.Status
		Stats() clusterdns.Stats
	}
	// ShutdownTimeout bounds the graceful shutdown when Serve's context
	// ends; zero means DefaultShutdownTimeout. Requests still running
	// after it are cut.
	ShutdownTimeout time.Duration
	// ProxyMode is /proxyMode's answer, as kube-proxy's metrics server
	// gives it (iptables, ipvs or nftables; cmd/kube-proxy/app/server.go).
	ProxyMode string
	// Configz returns /configz's JSON (kube-proxy's: the effective
	// KubeProxyConfiguration under "kubeproxy.config.k8s.io"); nil: 404.
	Configz func() ([]byte, error)
	// Control marks the server on the control socket (ListenControl): it
	// alone serves what changes the proxy's state, the conntrack flush. A
	// server on a TCP address, which admins expose for Prometheus as
	// they expose kube-proxy's metrics address, refuses it.
	Control bool
}

// Server is the admin HTTP server. Its handler is safe for concurrent use;
// Serve may be called once at a time.
type Server struct {
	cfg     Config
	log     *zap.Logger
	handler http.Handler
}

// New returns a Server for cfg.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.index)
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /livez", s.livez)
	mux.HandleFunc("GET /readyz", s.readyz)
	if cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog:      promLogger{s.log},
			ErrorHandling: promhttp.ContinueOnError,
		}))
	} else {
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "no metrics registry configured", http.StatusServiceUnavailable)
		})
	}
	mux.HandleFunc("GET /debug/conntrack", s.conntrackList)
	mux.HandleFunc("POST /debug/conntrack/flush", s.conntrackFlush)
	mux.HandleFunc("GET /debug/services", s.services)
	mux.HandleFunc("GET /debug/rules", s.rules)
	mux.HandleFunc("GET /debug/ipvs", s.ipvs)
	mux.HandleFunc("GET /debug/dial", s.dial)
	if cfg.Explain != nil && cfg.Destination != nil {
		mux.HandleFunc("GET /debug/explain", s.explain)
	}
	if cfg.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /debug/dns", s.dns)
	mux.HandleFunc("GET /proxyMode", s.proxyMode)
	mux.HandleFunc("GET /configz", s.configz)
	s.handler = mux
	return s
}

// Handler returns the server's routes, for tests and for mounting them on
// another server.
func (s *Server) Handler() http.Handler { return s.handler }

// Listen binds addr ("" means DefaultAddr) for ServeListener. The admin
// endpoints include a conntrack flush and are not authenticated: a bind
// address beyond loopback is logged as a warning.
func (s *Server) Listen(addr string) (net.Listener, error) {
	if addr == "" {
		addr = DefaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin: listen on %s: %w", addr, err)
	}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil && !ap.Addr().IsLoopback() {
		s.log.Warn("admin server listens beyond loopback; its endpoints are unauthenticated", zap.Stringer("addr", ln.Addr()))
	}
	return ln, nil
}

// Serve listens on addr ("" means DefaultAddr) and serves until ctx ends,
// then shuts down gracefully; see ServeListener.
func (s *Server) Serve(ctx context.Context, addr string) error {
	ln, err := s.Listen(addr)
	if err != nil {
		return err
	}
	return s.ServeListener(ctx, ln)
}

// ServeListener serves on ln until ctx ends, then stops accepting, waits up
// to Config.ShutdownTimeout for requests in flight and closes ln. It returns
// nil after a shutdown that ctx asked for, or the error that stopped the
// server. Every goroutine it starts has ended when it returns.
func (s *Server) ServeListener(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          zap.NewStdLog(s.log),
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	s.log.Info("admin server listening", zap.Stringer("addr", ln.Addr()))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }() // the accept loop
	select {
	case err := <-served:
		return fmt.Errorf("admin: serving on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	shCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(shCtx)
	if err != nil {
		s.log.Warn("admin server shutdown cut requests short", zap.Error(err))
		_ = srv.Close()
	}
	<-served // http.ErrServerClosed
	s.log.Info("admin server stopped", zap.Stringer("addr", ln.Addr()))
	if err != nil {
		return fmt.Errorf("admin: shutdown: %w", err)
	}
	return nil
}

// promLogger passes promhttp's errors to zap.
type promLogger struct{ log *zap.Logger }

func (l promLogger) Println(v ...any) {
	l.log.Error("serving metrics", zap.String("error", strings.TrimSuffix(fmt.Sprintln(v...), "\n")))
}

func writeText(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func (s *Server) index(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, `userproxy admin
/healthz                 200 "ok" when healthy, 503 and the reason otherwise
/livez                   200 while the process serves
/readyz                  200 once the first service table is live and /healthz passes (for scripts that wait for the proxy to serve)
/metrics                 Prometheus metrics
/debug/conntrack         conntrack entries, conntrack -L style (?protocol=tcp|udp&service=ns/name[:port]&src=&dst=&endpoint=)
/debug/conntrack/flush   POST, on the control socket only: delete the entries the same parameters select; answers the number deleted
/proxyMode               kube-proxy's: the proxy mode (iptables, ipvs, nftables)
/configz                 kube-proxy's: the effective KubeProxyConfiguration (kube-proxy mode only)
/debug/services          service ports, their endpoints, skipped services
/debug/rules             the iptables rules kube-proxy would write (?format=save|restore&family=4|6)
/debug/ipvs              the table as ipvsadm -Ln lists it in kube-proxy's IPVS mode (?stats=1 or ?rate=1)
/debug/explain           what a new flow would meet, as JSON (?to=IP:PORT|NAME.NS:PORT&from=IP[&protocol=udp][&nodeport=true]; userproxy explain)
/debug/dns               the cluster DNS responder: addresses, whether it steps aside for a Service, queries
`)
}

// proxyMode answers the mode without a newline, as kube-proxy does.
func (s *Server) proxyMode(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.ProxyMode == "" {
		writeText(w, http.StatusNotFound, "no proxy mode configured\n")
		return
	}
	writeText(w, http.StatusOK, s.cfg.ProxyMode)
}

// configz answers the effective configuration, as kube-proxy's
// component-base/configz does.
func (s *Server) configz(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Configz == nil {
		writeText(w, http.StatusNotFound, "no configuration file: /configz is served in kube-proxy mode (userproxy kube-proxy)\n")
		return
	}
	body, err := s.cfg.Configz()
	if err != nil {
		writeText(w, http.StatusInternalServerError, err.Error()+"\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(body)
}

// ErrControlServed is ListenControl's refusal of a socket a running proxy
// answers on.
var ErrControlServed = errors.New("another userproxy is serving it")

// ListenControl binds the control socket at path, a unix socket only its
// owner may use (mode 0600, in a directory made 0700 if missing): it
// serves what changes the proxy's state. A socket file left by a proxy
// that is gone is replaced; one a running proxy answers on is refused.
func (s *Server) ListenControl(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		_ = c.Close()
		return nil, fmt.Errorf("control socket %s: %w (stop it, or give this one another --control-socket)", path, ErrControlServed)
	}
	_ = os.Remove(path) // a stale socket file
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	return ln, nil
}

package admin

// The HTTP server, in the order a request meets it:
//
//  1. Listen binds the address (loopback by default) and Serve runs the
//     server until its context ends, then shuts it down gracefully;
//  2. the mux routes by method and path: /healthz, /livez, /metrics,
//     /debug/conntrack (GET) and /debug/conntrack/flush (POST),
//     /debug/services, /debug/rules, /debug/dns;
//  3. each handler reads the current state through Config (the health
//     check, the gatherer, the service table, the conntrack table) and
//     answers in plain text.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
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
	// Table returns the current service table for /debug/services and
	// /debug/rules (Tracker.Current or Proxy.Table); it may return nil
	// before the first table.
	Table func() *service.Table
	// Conntrack serves /debug/conntrack and /debug/conntrack/flush.
	Conntrack ConntrackTable
	// Rules are the options of /debug/rules; the query parameters format
	// and family override Format and Family.
	Rules RulesOptions
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
	if cfg.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	mux.HandleFunc("GET /debug/dns", s.dns)
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
/metrics                 Prometheus metrics
/debug/conntrack         conntrack entries, conntrack -L style (?protocol=tcp|udp&service=ns/name[:port]&src=&dst=&endpoint=)
/debug/conntrack/flush   POST: delete the entries the same parameters select; answers the number deleted
/debug/services          service ports, their endpoints, skipped services
/debug/rules             the iptables rules kube-proxy would write (?format=save|restore&family=4|6)
/debug/dns               the cluster DNS responder: addresses, whether it steps aside for a Service, queries
`)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Health != nil {
		if err := s.cfg.Health(); err != nil {
			writeText(w, http.StatusServiceUnavailable, err.Error()+"\n")
			return
		}
	}
	writeText(w, http.StatusOK, "ok\n")
}

func (s *Server) livez(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

// ConntrackQuery selects conntrack entries for /debug/conntrack and its
// flush; the zero value selects every entry. Its fields are the query
// parameters of the same names (lower case).
type ConntrackQuery struct {
	// Protocol is "tcp" or "udp".
	Protocol string
	// Service is "namespace/name" (every port of the service) or
	// "namespace/name:port" (one port; "namespace/name:" is the unnamed
	// port): the service port the proxy bound the flow to.
	Service string
	// Src and Dst are the original direction's source (client) and
	// destination (ClusterIP) addresses.
	Src, Dst string
	// Endpoint is the address of the endpoint the flow was sent to.
	Endpoint string
}

func (q ConntrackQuery) values() map[string]string {
	return map[string]string{"protocol": q.Protocol, "service": q.Service, "src": q.Src, "dst": q.Dst, "endpoint": q.Endpoint}
}

// conntrackSelector is a parsed ConntrackQuery: a conntrack.Filter, plus a
// service name matched against every port of the service.
type conntrackSelector struct {
	filter conntrack.Filter
	// service, when set, matches ServicePort "ns/name" and "ns/name:*".
	service string
}

func (c conntrackSelector) match(e *conntrack.EntryInfo) bool {
	if c.service == "" {
		return true
	}
	rest, ok := strings.CutPrefix(e.ServicePort, c.service)
	return ok && (rest == "" || rest[0] == ':')
}

func parseConntrackQuery(r *http.Request) (conntrackSelector, error) {
	var sel conntrackSelector
	q := r.URL.Query()
	known := ConntrackQuery{}.values()
	for k := range q {
		if _, ok := known[k]; !ok {
			return sel, fmt.Errorf("unknown parameter %q: want protocol, service, src, dst or endpoint", k)
		}
	}
	switch p := strings.ToLower(q.Get("protocol")); p {
	case "":
	case "tcp":
		sel.filter.Protocol = conntrack.TCP
	case "udp":
		sel.filter.Protocol = conntrack.UDP
	default:
		return sel, fmt.Errorf("protocol %q: want tcp or udp", p)
	}
	if svc := q.Get("service"); svc != "" {
		ns, rest, ok := strings.Cut(svc, "/")
		if !ok || ns == "" || rest == "" || strings.HasPrefix(rest, ":") {
			return sel, fmt.Errorf("service %q: want namespace/name or namespace/name:port", svc)
		}
		if name, port, hasPort := strings.Cut(rest, ":"); hasPort {
			// One port; "ns/name:" is the unnamed port, "ns/name".
			sel.filter.ServicePort = service.PortName{Namespace: ns, Name: name, Port: port}.String()
		} else {
			sel.service = svc
		}
	}
	for _, a := range []struct {
		key string
		dst *netip.Addr
	}{{"src", &sel.filter.Src}, {"dst", &sel.filter.Dst}, {"endpoint", &sel.filter.Endpoint}} {
		if v := q.Get(a.key); v != "" {
			ip, err := netip.ParseAddr(v)
			if err != nil {
				return sel, fmt.Errorf("%s %q: want an IP address", a.key, v)
			}
			*a.dst = ip
		}
	}
	return sel, nil
}

func (s *Server) conntrackList(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Conntrack == nil {
		writeText(w, http.StatusServiceUnavailable, "no conntrack table configured\n")
		return
	}
	sel, err := parseConntrackQuery(r)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error()+"\n")
		return
	}
	entries := s.cfg.Conntrack.List(sel.filter)
	lines := make([]string, 0, len(entries))
	var buf []byte
	for i := range entries {
		if !sel.match(&entries[i]) {
			continue
		}
		buf, _ = entries[i].AppendText(buf[:0])
		lines = append(lines, string(buf))
	}
	// conntrack -L prints in hash order; sorted is easier to read and diff.
	slices.Sort(lines)
	var out strings.Builder
	for _, l := range lines {
		out.WriteString(l)
		out.WriteByte('\n')
	}
	writeText(w, http.StatusOK, out.String())
}

func (s *Server) conntrackFlush(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Conntrack == nil {
		writeText(w, http.StatusServiceUnavailable, "no conntrack table configured\n")
		return
	}
	sel, err := parseConntrackQuery(r)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error()+"\n")
		return
	}
	n := 0
	if sel.service == "" {
		n = s.cfg.Conntrack.Delete(sel.filter)
	} else {
		// A whole service: delete by each port name its entries carry.
		// Entries of those ports created meanwhile match the query too.
		var ports []string
		for _, e := range s.cfg.Conntrack.List(sel.filter) {
			if sel.match(&e) && !slices.Contains(ports, e.ServicePort) {
				ports = append(ports, e.ServicePort)
			}
		}
		for _, p := range ports {
			f := sel.filter
			f.ServicePort = p
			n += s.cfg.Conntrack.Delete(f)
		}
	}
	s.log.Info("conntrack entries flushed", zap.String("query", r.URL.RawQuery), zap.Int("deleted", n))
	writeText(w, http.StatusOK, strconv.Itoa(n)+"\n")
}

func (s *Server) currentTable() *service.Table {
	if s.cfg.Table == nil {
		return nil
	}
	return s.cfg.Table()
}

func (s *Server) services(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Table == nil {
		writeText(w, http.StatusServiceUnavailable, "no service table configured\n")
		return
	}
	var b bytes.Buffer
	writeServices(&b, s.currentTable())
	writeText(w, http.StatusOK, b.String())
}

// writeServices lists the table: one line per service port with its
// verdict, one indented line per endpoint, then the skipped services.
func writeServices(b *bytes.Buffer, t *service.Table) {
	if t == nil {
		b.WriteString("# no service table yet (the source has not synced)\n")
		return
	}
	fmt.Fprintf(b, "# service table %d, built %s: %d services, %d ports, %d skipped\n",
		t.Generation(), t.Built().UTC().Format(time.RFC3339Nano), t.Services(), t.Len(), len(t.Skipped()))
	for _, p := range t.Ports() {
		fmt.Fprintf(b, "%s %s %s %s", p.Name, p.Protocol, netip.AddrPortFrom(p.ClusterIP, p.Port), p.Family)
		switch p.Verdict {
		case service.Forward:
			fmt.Fprintf(b, " forward to %d endpoints", len(p.Endpoints))
		case service.NoLocalEndpoints:
			b.WriteString(" no local endpoints: DROP")
		default:
			b.WriteString(" no endpoints: REJECT")
		}
		if p.Affinity.ClientIP {
			fmt.Fprintf(b, ", affinity ClientIP %s", p.Affinity.Timeout)
		}
		if p.InternalTrafficPolicyLocal {
			b.WriteString(", internalTrafficPolicy Local")
		}
		if p.Topology != "" {
			b.WriteString(", topology " + p.Topology)
		}
		b.WriteByte('\n')
		for i := range p.Endpoints {
			e := &p.Endpoints[i]
			b.WriteString("    " + p.EndpointKeys[i])
			for _, c := range []struct {
				on   bool
				name string
			}{{e.Ready, "ready"}, {e.Serving, "serving"}, {e.Terminating, "terminating"}, {e.Local, "local"}} {
				if c.on {
					b.WriteString(" " + c.name)
				}
			}
			if e.NodeName != "" {
				b.WriteString(" node=" + e.NodeName)
			}
			if e.Zone != "" {
				b.WriteString(" zone=" + e.Zone)
			}
			if len(e.ZoneHints) > 0 {
				b.WriteString(" zone-hints=" + strings.Join(e.ZoneHints, ","))
			}
			if len(e.NodeHints) > 0 {
				b.WriteString(" node-hints=" + strings.Join(e.NodeHints, ","))
			}
			b.WriteByte('\n')
		}
	}
	if skipped := t.Skipped(); len(skipped) > 0 {
		b.WriteString("# skipped\n")
		for _, sk := range skipped {
			b.WriteString(sk.Service.String())
			if sk.Port != "" || sk.PortNumber != 0 {
				fmt.Fprintf(b, " port %q (%d)", sk.Port, sk.PortNumber)
			}
			b.WriteString(": " + sk.Reason + "\n")
		}
	}
}

func (s *Server) dns(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.DNS == nil {
		writeText(w, http.StatusServiceUnavailable, "cluster DNS is off (--dns=false)\n")
		return
	}
	var b bytes.Buffer
	writeDNS(&b, s.cfg.DNS.Status(), s.cfg.DNS.Stats())
	writeText(w, http.StatusOK, b.String())
}

// writeDNS prints the responder's state: one line per address, saying
// whether it answers or steps aside for a Service, then the counters.
func writeDNS(b *bytes.Buffer, st clusterdns.Status, stats clusterdns.Stats) {
	upstream := st.Upstream
	if upstream == "" {
		upstream = "none (names outside the domain are REFUSED)"
	}
	fmt.Fprintf(b, "# cluster DNS for %s, upstream %s\n", st.Domain, upstream)
	for _, a := range st.Addrs {
		if a.SteppedAsideFor != "" {
			fmt.Fprintf(b, "dns %s: stepped aside for %s (its Service owns the address; queries go to its endpoints)\n", a.Addr, a.SteppedAsideFor)
		} else {
			fmt.Fprintf(b, "dns %s: answering (udp, tcp)\n", a.Addr)
		}
	}
	fmt.Fprintf(b, "# dropped %d, truncated %d, forwarded %d, upstream errors %d; answered queries by type and rcode:\n",
		stats.Dropped, stats.Truncated, stats.Forwarded, stats.UpstreamErrors)
	for _, q := range stats.Queries {
		fmt.Fprintf(b, "%s %s %d\n", q.Type, q.Rcode, q.N)
	}
}

func (s *Server) rules(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Table == nil {
		writeText(w, http.StatusServiceUnavailable, "no service table configured\n")
		return
	}
	opts := s.cfg.Rules
	q := r.URL.Query()
	if v := q.Get("format"); v != "" {
		f, err := ParseFormat(v)
		if err != nil {
			writeText(w, http.StatusBadRequest, err.Error()+"\n")
			return
		}
		opts.Format = f
	}
	switch v := q.Get("family"); v {
	case "":
	case "4", "ipv4", "IPv4":
		opts.Family = service.IPv4
	case "6", "ipv6", "IPv6":
		opts.Family = service.IPv6
	default:
		writeText(w, http.StatusBadRequest, fmt.Sprintf("family %q: want 4 or 6\n", v))
		return
	}
	var b bytes.Buffer
	if err := WriteRules(&b, s.currentTable(), opts); err != nil {
		writeText(w, http.StatusInternalServerError, err.Error()+"\n")
		return
	}
	writeText(w, http.StatusOK, b.String())
}

// SyncHealth returns a health check for Config.Health with the meaning of
// kube-proxy's /healthz: unhealthy until the first service table is built,
// and when service changes have been waiting for a new table longer than
// maxAge (zero means 60 s, kube-proxy's 2 x --iptables-sync-period).
// Waiting is measured from the first check that saw changes pending with
// the same table count, so a check soon after a change never fails; checks
// are expected at least every maxAge. now is the clock (nil: time.Now).
// The returned function is safe for concurrent use.
func SyncHealth(src interface{ Stats() service.Stats }, maxAge time.Duration, now func() time.Time) func() error {
	if maxAge <= 0 {
		maxAge = 60 * time.Second
	}
	if now == nil {
		now = time.Now
	}
	var (
		mu           sync.Mutex
		pendingSince time.Time // when pending changes were first seen
		syncsThen    uint64    // the table count then
	)
	return func() error {
		st := src.Stats()
		t := now()
		mu.Lock()
		defer mu.Unlock()
		if st.Syncs == 0 {
			return errors.New("no service table built yet: waiting for the source to deliver every Service and EndpointSlice")
		}
		if st.PendingChanges == 0 || st.Syncs != syncsThen || pendingSince.IsZero() {
			syncsThen = st.Syncs
			pendingSince = time.Time{}
			if st.PendingChanges > 0 {
				pendingSince = t
			}
			return nil
		}
		if waited := t.Sub(pendingSince); waited > maxAge {
			return fmt.Errorf("%d changed services have waited %s for a new service table (the last went live at %s)",
				st.PendingChanges, waited.Truncate(time.Second), st.LastSyncTime.UTC().Format(time.RFC3339))
		}
		return nil
	}
}

// CheckAll returns a health check that runs checks in order and fails with
// the first error (nil checks are skipped).
func CheckAll(checks ...func() error) func() error {
	return func() error {
		for _, c := range checks {
			if c == nil {
				continue
			}
			if err := c(); err != nil {
				return err
			}
		}
		return nil
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/file"
	"github.com/userproxy/userproxy/source/kube"
)

// adminDeps are the parts the admin server reports on.
type adminDeps struct {
	// takingOver: the proxy taken over holds the address until it exits.
	takingOver bool
	handover   *handoverStats
	ct         *conntrack.Table
	defrag     *conntrack.Reassembler
	px         *proxy.Proxy
	st         *netstack.Stack
	tracker    *service.Tracker
	src        objectSource
	firstSync  <-chan struct{}
	rules      rules.Options
	profiling  bool
	dns        *clusterdns.Responder // nil with --dns=false
	notes      func() []string       // /healthz notes
	nodePorts  *proxy.NodePorts
	rest       *restClientMetrics // client-go's; nil without a cluster source
	families   []service.Family   // served: the ip_family label's values
	// proxierHealth is kube-proxy's health state, for its counters.
	proxierHealth *admin.ProxierHealth
	dial          func() admin.DialView
	pf            *kube.PortForwarder // nil with --dial-via direct
	proxyMode     string              // /proxyMode
	configz       func() ([]byte, error)
	conflicts     *conflicts // what keeps traffic from the TUN: /readyz, userproxy_host_conflicts
	clusterDomain string     // for /debug/explain's service names
}

// proxyModeOf is /proxyMode's answer: kube-proxy's mode as configured, or
// for run the mode whose semantics its scheduler follows.
func proxyModeOf(f *runFlags) string {
	switch {
	case f.proxyMode != "":
		return f.proxyMode
	case f.scheduler == "random":
		return modeIPTables
	}
	return modeIPVS
}

// defaultControlSocket is --control-socket's default: under /run/userproxy
// for root, else under the user's runtime directory, named after the TUN
// (one proxy per TUN).
func defaultControlSocket(tun string) string {
	dir := "/run/userproxy"
	if os.Geteuid() != 0 {
		dir = os.Getenv("XDG_RUNTIME_DIR")
		if dir == "" {
			dir = os.TempDir()
		}
		dir = filepath.Join(dir, fmt.Sprintf("userproxy-%d", os.Geteuid()))
	}
	return filepath.Join(dir, tun+".sock")
}

// defaultHandoverSocket is --handover-socket's default: beside the control
// socket.
func defaultHandoverSocket(tun string) string {
	return filepath.Join(filepath.Dir(defaultControlSocket(tun)), tun+".handover")
}

// servedFamilies returns the families of the service CIDRs, IPv4 first.
func servedFamilies(cidrs []netip.Prefix) []service.Family {
	var v4, v6 bool
	for _, p := range cidrs {
		v4, v6 = v4 || p.Addr().Is4(), v6 || !p.Addr().Is4()
	}
	var fams []service.Family
	if v4 {
		fams = append(fams, service.IPv4)
	}
	if v6 {
		fams = append(fams, service.IPv6)
	}
	return fams
}

// registerMetrics registers every metric the admin server serves:
// Go's and the process's, the host conflicts, the build, kube-proxy's
// health answers, client-go's requests, and admin's over sources.
// TestMetricsReference holds docs/metrics.md to what it registers.
func registerMetrics(reg prometheus.Registerer, d adminDeps, sources admin.Sources) error {
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return fmt.Errorf("admin: registering Go's metrics: %w", err)
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return fmt.Errorf("admin: registering the process metrics: %w", err)
	}
	if cf := d.conflicts; cf != nil {
		for _, cause := range conflictCauses {
			if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name:        "userproxy_host_conflicts",
				Help:        "1 while something keeps Service traffic from the TUN, by cause: kube-proxy's rules on the host, ClusterIPs as local addresses, a route for a service CIDR elsewhere, ClusterIPs outside every --service-cidr.",
				ConstLabels: prometheus.Labels{"cause": cause},
			}, func() float64 {
				if cf.found(cause) {
					return 1
				}
				return 0
			})); err != nil {
				return fmt.Errorf("admin: registering userproxy_host_conflicts: %w", err)
			}
		}
	}
	b := readBuildInfo()
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "userproxy_build_info",
		Help:        "Always 1: the version of this binary, its commit and the Go version that built it, as labels.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	}, func() float64 { return 1 })); err != nil {
		return fmt.Errorf("admin: registering userproxy_build_info: %w", err)
	}
	if d.proxierHealth != nil {
		// kubeproxy_proxy_healthz_total, _livez_total
		if err := reg.Register(d.proxierHealth); err != nil {
			return fmt.Errorf("admin: registering the health answers: %w", err)
		}
	}
	if d.handover != nil {
		if err := d.handover.register(reg); err != nil {
			return err
		}
	}
	if d.rest != nil {
		if err := d.rest.register(reg); err != nil {
			return fmt.Errorf("admin: registering the REST client metrics: %w", err)
		}
	}
	if err := admin.RegisterMetrics(reg, sources); err != nil {
		return fmt.Errorf("admin: registering metrics: %w", err)
	}
	return nil
}

// adminSources are the sources of admin's metrics among d.
func adminSources(d adminDeps) admin.Sources {
	sources := admin.Sources{
		Conntrack: d.ct,
		Proxy:     d.px,
		Tracker:   d.tracker,
		Gate:      func() admin.GateStats { return admin.GateStats(d.st.Stats()) },
		Families:  d.families,
	}
	if np := d.nodePorts; np != nil {
		sources.NodePorts = func() admin.NodePortStats { return admin.NodePortStats{Open: np.Listening(), Failed: len(np.Failed())} }
	}
	if d.pf != nil {
		sources.Tunnels = func() admin.TunnelStats { return admin.TunnelStats(d.pf.Stats()) }
	}
	if d.defrag != nil { // a nil *Reassembler in an interface would not be nil
		sources.Reassembler = d.defrag
	}
	if fs, ok := d.src.(*file.Source); ok {
		sources.ReloadErrors = func() uint64 { return fs.Stats().Errors }
	}
	if d.dns != nil { // a nil *Responder in an interface would not be nil
		sources.DNS = d.dns
	}
	return sources
}

// startAdmin serves the admin endpoints on addr until ctx ends; the returned
// function waits for the server to stop.
func startAdmin(ctx context.Context, addr, control string, d adminDeps, logger *zap.Logger) (func(), error) {
	reg := prometheus.NewRegistry()
	if err := registerMetrics(reg, d, adminSources(d)); err != nil {
		return nil, err
	}
	cfg := admin.Config{
		Logger:    logger,
		Gatherer:  reg,
		Health:    admin.CheckAll(sourceHealth(d.src), admin.SyncHealth(d.tracker, admin.DefaultHealthTimeout, time.Now)),
		Ready:     admin.CheckAll(admin.FirstTable(d.tracker), d.conflictsErr()),
		Table:     func() *service.Table { return d.px.Table() },
		Conntrack: d.ct,
		Rules:     d.rules,
		IPVS:      d.px.IPVS,
		Dial:      d.dial,
		Notes:     d.notes,
		Profiling: d.profiling,
		ProxyMode: d.proxyMode,
		Configz:   d.configz,
		Explain: func(q proxy.ExplainQuery) proxy.Explanation {
			q.LeftOut = d.tracker.LeftOut
			return d.px.Explain(q)
		},
		Destination: func(s string) (netip.AddrPort, error) { return d.px.Destination(s, d.clusterDomain) },
	}
	if d.dns != nil { // a nil *Responder in an interface would not be nil
		cfg.DNS = d.dns
	}
	srv := admin.New(cfg)
	listen := func() (net.Listener, error) { return srv.Listen(addr) }
	var ln net.Listener
	var err error
	if d.takingOver {
		ln, err = retryTaken(listen)
	} else {
		ln, err = listen()
	}
	if err != nil {
		if cause := errors.Unwrap(err); cause != nil {
			err = cause // the listen's own error, without admin's wording
		}
		return nil, listenHint("--admin-addr", addr, err)
	}
	done := make(chan struct{}, 2)
	go func() { // admin server
		defer func() { done <- struct{}{} }()
		if err := srv.ServeListener(ctx, ln); err != nil {
			logger.Error("admin server stopped", zap.Error(err))
		}
	}()
	servers := 1
	if control != "none" {
		// The control socket: the same routes, the flush among them.
		cc := cfg
		cc.Control = true
		ctl := admin.New(cc)
		cln, err := ctl.ListenControl(control)
		if d.takingOver {
			// The process taken over serves it until it exits.
			for deadline := time.Now().Add(takeOverListenWait); errors.Is(err, admin.ErrControlServed) && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
				cln, err = ctl.ListenControl(control)
			}
		}
		if err != nil {
			// Not fatal: the proxy serves; only the flush is missing.
			logger.Warn("no control socket: userproxy conntrack flush cannot reach this proxy", zap.Error(err))
		} else {
			servers++
			var ours unix.Stat_t
			_ = unix.Stat(control, &ours)
			go func() {
				defer func() { done <- struct{}{} }()
				if err := ctl.ServeListener(ctx, cln); err != nil {
					logger.Error("control socket stopped", zap.Error(err))
				}
				// Removed unless another process's socket took the path
				// (the one that took over from this one).
				var now unix.Stat_t
				if unix.Stat(control, &now) == nil && now.Ino == ours.Ino && now.Dev == ours.Dev {
					_ = os.Remove(control)
				}
			}()
		}
	}
	return func() {
		for range servers {
			<-done
		}
	}, nil
}

// sourceHealth reports the source's last error: a bad reload (the last good
// table is still serving) or an API server outage.
func sourceHealth(src objectSource) func() error {
	return func() error {
		if err := src.LastError(); err != nil {
			return fmt.Errorf("source: %w", err)
		}
		return nil
	}
}

var errNoAdmin = errors.New("no running proxy answered")

// conflictsErr is /readyz's check of the conflicts, if there are any to
// check.
func (d adminDeps) conflictsErr() func() error {
	if d.conflicts == nil {
		return nil
	}
	return d.conflicts.err
}

package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"

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
	ct        *conntrack.Table
	defrag    *conntrack.Reassembler
	px        *proxy.Proxy
	st        *netstack.Stack
	tracker   *service.Tracker
	src       objectSource
	firstSync <-chan struct{}
	rules     rules.Options
	profiling bool
	dns       *clusterdns.Responder // nil with --dns=false
	notes     func() []string       // /healthz notes
	nodePorts *proxy.NodePorts
	rest      *restClientMetrics // client-go's; nil without a cluster source
	families  []service.Family   // served: the ip_family label's values
	// proxierHealth is kube-proxy's health state, for its counters.
	proxierHealth *admin.ProxierHealth
	dial          func() admin.DialView
	pf            *kube.PortForwarder // nil with --dial-via direct
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

// startAdmin serves the admin endpoints on addr until ctx ends; the returned
// function waits for the server to stop.
func startAdmin(ctx context.Context, addr string, d adminDeps, logger *zap.Logger) (func(), error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	sources := admin.Sources{
		Conntrack: d.ct,
		Proxy:     d.px,
		Tracker:   d.tracker,
		Gate:      func() admin.GateStats { return admin.GateStats(d.st.Stats()) },
		Families:  d.families,
	}
	if d.proxierHealth != nil {
		reg.MustRegister(d.proxierHealth) // kubeproxy_proxy_healthz_total, _livez_total
	}
	if d.rest != nil {
		if err := d.rest.register(reg); err != nil {
			return nil, fmt.Errorf("admin: registering the REST client metrics: %w", err)
		}
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
	cfg := admin.Config{
		Logger:    logger,
		Gatherer:  reg,
		Health:    admin.CheckAll(sourceHealth(d.src), admin.SyncHealth(d.tracker, admin.DefaultHealthTimeout, time.Now)),
		Ready:     admin.FirstTable(d.tracker),
		Table:     func() *service.Table { return d.px.Table() },
		Conntrack: d.ct,
		Rules:     d.rules,
		IPVS:      d.px.IPVS,
		Dial:      d.dial,
		Notes:     d.notes,
		Profiling: d.profiling,
	}
	if d.dns != nil { // a nil *Responder in an interface would not be nil
		sources.DNS, cfg.DNS = d.dns, d.dns
	}
	if err := admin.RegisterMetrics(reg, sources); err != nil {
		return nil, fmt.Errorf("admin: registering metrics: %w", err)
	}
	srv := admin.New(cfg)
	ln, err := srv.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("admin: %w", err)
	}
	done := make(chan struct{})
	go func() { // admin server
		defer close(done)
		if err := srv.ServeListener(ctx, ln); err != nil {
			logger.Error("admin server stopped", zap.Error(err))
		}
	}()
	return func() { <-done }, nil
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

package admin

// kube-proxy's service health servers (pkg/proxy/healthcheck/service_health.go):
// cloud load balancers send the external traffic of an
// externalTrafficPolicy: Local Service only to nodes whose
// healthCheckNodePort answers 200.
//
//  1. Sync, after each table: every Service with a healthCheckNodePort gets
//     an HTTP server on each NodePort address at that port; a Service that
//     lost it (or changed it) has its servers closed. A port that cannot be
//     opened is logged and listed (Failed), never fatal; the next Sync
//     tries again.
//  2. Each Service's count is its local ready endpoints: this node's
//     endpoints that are Ready, counted once per IP across the Service's
//     ports (kube-proxy's LocalReadyEndpoints), in the family of its first
//     ClusterIP. Terminating endpoints do not count, though they may still
//     serve: the signal must fail while only they are left.
//  3. A request gets 200 when the count is above zero and the proxier is
//     healthy, else 503, with kube-proxy's JSON body and headers.

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/service"
)

// ServiceHealth serves the health check node ports. It is safe for
// concurrent use.
type ServiceHealth struct {
	addrs   []netip.Addr
	healthy func() bool
	log     *zap.Logger

	mu     sync.RWMutex
	svcs   map[service.ServiceName]*hcService
	failed map[service.ServiceName]error
	closed bool
}

// hcService is one Service's health check: its port, servers and count.
type hcService struct {
	port    uint16
	servers []*http.Server
	local   int // under ServiceHealth.mu
}

// NewServiceHealth returns the health check servers' manager, serving on
// addrs (the NodePort addresses); healthy reports the proxier's health
// (ProxierHealth.IsHealthy; nil: always healthy).
func NewServiceHealth(addrs []netip.Addr, healthy func() bool, logger *zap.Logger) *ServiceHealth {
	if healthy == nil {
		healthy = func() bool { return true }
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	return &ServiceHealth{addrs: slices.Clone(addrs), healthy: healthy, log: logger,
		svcs: map[service.ServiceName]*hcService{}, failed: map[service.ServiceName]error{}}
}

// Sync opens, closes and updates the servers for table t (steps 1, 2).
func (s *ServiceHealth) Sync(t *service.Table) {
	want := map[service.ServiceName]uint16{}
	counts := map[service.ServiceName]int{}
	for name, ips := range localReady(t) {
		counts[name] = len(ips)
	}
	for _, p := range t.Ports() {
		if p.HealthCheckNodePort != 0 {
			want[p.Name.Service()] = p.HealthCheckNodePort
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	// Close before opening, as kube-proxy's SyncServices does: a port one
	// Service gives up may be the one another takes in the same table.
	// close waits for no handler, so it may run under the lock.
	for name, hc := range s.svcs {
		if port, ok := want[name]; !ok || port != hc.port {
			hc.close()
			delete(s.svcs, name)
			s.log.Info("health check node port closed", zap.Stringer("service", name), zap.Uint16("port", hc.port))
		}
	}
	for name := range s.failed {
		if _, ok := want[name]; !ok {
			delete(s.failed, name)
		}
	}
	for name, port := range want {
		if _, ok := s.svcs[name]; ok {
			continue
		}
		hc, err := s.open(name, port) // listening does not block; serving starts after the unlock
		if err != nil {
			if _, known := s.failed[name]; !known {
				s.log.Warn("cannot serve a health check node port; load balancers will not send this Service's traffic to this node",
					zap.Stringer("service", name), zap.Uint16("port", port), zap.Error(err))
			}
			s.failed[name] = err
			continue
		}
		delete(s.failed, name)
		s.svcs[name] = hc
		s.log.Info("health check node port open", zap.Stringer("service", name), zap.Uint16("port", port))
	}
	for name, hc := range s.svcs {
		hc.local = counts[name]
	}
}

// localReady returns, per Service with a health check node port, the IPs of
// its local Ready endpoints in the family of its first ClusterIP (step 2).
func localReady(t *service.Table) map[service.ServiceName]map[netip.Addr]struct{} {
	out := map[service.ServiceName]map[netip.Addr]struct{}{}
	for _, p := range t.Ports() {
		if p.HealthCheckNodePort == 0 || len(p.ClusterIPs) == 0 || p.ClusterIP != p.ClusterIPs[0] {
			continue
		}
		name := p.Name.Service()
		ips := out[name]
		if ips == nil {
			ips = map[netip.Addr]struct{}{}
			out[name] = ips
		}
		for _, e := range p.ExternalEndpoints {
			if e.Local && e.Ready {
				ips[e.Addr.Addr()] = struct{}{}
			}
		}
	}
	return out
}

// open starts name's servers on every address at port; on an error it
// closes those it opened.
func (s *ServiceHealth) open(name service.ServiceName, port uint16) (*hcService, error) {
	hc := &hcService{port: port}
	for _, a := range s.addrs {
		addr := net.JoinHostPort(a.String(), strconv.Itoa(int(port)))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			hc.close()
			return nil, err
		}
		srv := &http.Server{Handler: s.handler(name), ReadHeaderTimeout: 10 * time.Second}
		hc.servers = append(hc.servers, srv)
		go func() { // health check node port server
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Warn("health check node port server stopped", zap.Stringer("service", name), zap.String("address", addr), zap.Error(err))
			}
		}()
	}
	return hc, nil
}

// close closes the servers at once, as kube-proxy's closeAll does: a
// probe in flight is cut (it waits for no handler, so it may run under
// the manager's lock).
func (hc *hcService) close() {
	for _, srv := range hc.servers {
		_ = srv.Close()
	}
}

// handler answers name's health checks (step 3), in kube-proxy's layout.
func (s *ServiceHealth) handler(name service.ServiceName) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s.mu.RLock()
		hc := s.svcs[name]
		count := 0
		if hc != nil {
			count = hc.local
		}
		s.mu.RUnlock()
		healthy := s.healthy()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
		if count > 0 && healthy {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
			name.Namespace, name.Name, count, healthy)
	})
}

// Failed lists the health check node ports that could not be opened.
func (s *ServiceHealth) Failed() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.failed))
	for name, err := range s.failed {
		out = append(out, fmt.Sprintf("health check node port of %s is not served: %v", name, err))
	}
	slices.Sort(out)
	return out
}

// Close closes every server.
func (s *ServiceHealth) Close() {
	s.mu.Lock()
	s.closed = true
	all := s.svcs
	s.svcs = map[service.ServiceName]*hcService{}
	s.mu.Unlock()
	for _, hc := range all {
		hc.close()
	}
}

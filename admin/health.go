package admin

// Health: what /healthz and /livez answer, and the checks behind /healthz.
//
//  1. /livez answers 200 while the process serves HTTP at all;
//  2. /healthz runs Config.Health once per request: 200 "ok", or 503 and
//     the check's error;
//  3. SyncHealth is kube-proxy's meaning of that check (a service table
//     built, and no change waiting too long for the next); CheckAll chains
//     checks.

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/userproxy/userproxy/service"
)

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Health != nil {
		if err := s.cfg.Health(); err != nil {
			writeText(w, http.StatusServiceUnavailable, err.Error()+"\n")
			return
		}
	}
	body := "ok\n"
	if s.cfg.Notes != nil {
		for _, n := range s.cfg.Notes() {
			body += "note: " + n + "\n"
		}
	}
	writeText(w, http.StatusOK, body)
}

// readyz is /readyz: Ready, then Health, must pass.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	for _, check := range []func() error{s.cfg.Ready, s.cfg.Health} {
		if check == nil {
			continue
		}
		if err := check(); err != nil {
			writeText(w, http.StatusServiceUnavailable, err.Error()+"\n")
			return
		}
	}
	writeText(w, http.StatusOK, "ok\n")
}

func (s *Server) livez(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
}

// SyncHealth returns a health check for Config.Health with the meaning of
// kube-proxy's /healthz (pkg/proxy/healthcheck/proxy_health.go): healthy
// while starting, and unhealthy once a change has waited maxAge or more for
// a table (zero means DefaultHealthTimeout, kube-proxy's 2 x
// --iptables-sync-period), until the next table. The wait runs from the
// change's arrival (service.Health.OldestPending). now is the clock (nil:
// time.Now). The returned function is safe for concurrent use.
func SyncHealth(src interface{ Health() service.Health }, maxAge time.Duration, now func() time.Time) func() error {
	if maxAge <= 0 {
		maxAge = DefaultHealthTimeout
	}
	if now == nil {
		now = time.Now
	}
	return func() error {
		st := src.Health()
		if st.OldestPending.IsZero() {
			return nil
		}
		if waited := now().Sub(st.OldestPending); waited >= maxAge {
			return fmt.Errorf("%d changed services have waited %s for a new service table (the last went live at %s)",
				st.PendingChanges, waited.Truncate(time.Second), st.LastSyncTime.UTC().Format(time.RFC3339))
		}
		return nil
	}
}

// FirstTable returns a check for Config.Ready: unready until the first
// service table is live (kube-proxy's /healthz is healthy before that; a
// script that must wait for the proxy to serve waits on /readyz).
func FirstTable(src interface{ Health() service.Health }) func() error {
	return func() error {
		if src.Health().Syncs == 0 {
			return errors.New("no service table built yet: waiting for the source to deliver every Service and EndpointSlice")
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

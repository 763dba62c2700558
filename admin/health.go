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
	"sync"
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

func (s *Server) livez(w http.ResponseWriter, _ *http.Request) {
	writeText(w, http.StatusOK, "ok\n")
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

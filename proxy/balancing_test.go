package proxy

import (
	"cmp"
	"net/netip"
	"slices"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

func withAffinity(seconds int32) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Spec.SessionAffinity = v1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: &seconds}}
	}
}

// balancingRig is one process's proxy serving web at 10.96.0.1:80, on its
// own clock.
type balancingRig struct {
	p   *Proxy
	tr  *service.Tracker
	clk *wayClock
}

func newBalancingRig(t *testing.T, at time.Time, name string, eps []string, mods ...func(*v1.Service)) *balancingRig {
	t.Helper()
	clk := &wayClock{now: at}
	p, tr, _ := newTestProxyWith(t, Config{Clock: clk}, false)
	tr.OnServiceAdd(svc(name, "10.96.0.1", v1.ProtocolTCP, 80, mods...))
	tr.OnEndpointSliceAdd(slice(name, name+"-1", v1.ProtocolTCP, 8080, "", eps...))
	tr.OnSynced()
	return &balancingRig{p: p, tr: tr, clk: clk}
}

var balancingClient = conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort("192.0.2.1:5000"), netip.MustParseAddrPort("10.96.0.1:80"))

// pick routes a new flow from balancingClient and uncounts it at once.
func (r *balancingRig) pick(t *testing.T) pick {
	t.Helper()
	pk, _ := r.p.route(service.TCP, balancingClient)
	if !pk.ok {
		t.Fatal("no route")
	}
	pk.release()
	return pk
}

// After a handover the new process sends a pinned client where the old
// one did, within what was left of the pin; what its table does not have
// is dropped and counted. Each row's new table then changes once more (an
// endpoint joins), which a restored state must survive.
func TestRestoreBalancing(t *testing.T) {
	eps := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	rr, rrPersist := withScheduler("rr"), func(s *v1.Service) { withScheduler("rr")(s); withAffinity(600)(s) }
	tests := []struct {
		name      string
		old, new  []func(*v1.Service)
		newName   string        // the new table's Service; "" for web
		picks     int           // picks in the old process
		age       time.Duration // from the last pick to the save
		dropPin   bool          // the new table lacks the endpoint picked last
		restored  int
		dropped   int
		sticky    bool   // the next pick goes where the last old one went, by affinity
		nextAfter string // else, when set: the next pick is the endpoint after this one
	}{
		{"xt_recent: the pin holds", []func(*v1.Service){withAffinity(600)}, []func(*v1.Service){withAffinity(600)}, "", 1, time.Minute, false, 1, 0, true, ""},
		{"xt_recent: expired by the new timeout", []func(*v1.Service){withAffinity(600)}, []func(*v1.Service){withAffinity(30)}, "", 1, time.Minute, false, 0, 1, false, ""},
		{"xt_recent: the pinned endpoint left", []func(*v1.Service){withAffinity(600)}, []func(*v1.Service){withAffinity(600)}, "", 1, 0, true, 0, 1, false, ""},
		{"xt_recent: the service port is gone", []func(*v1.Service){withAffinity(600)}, []func(*v1.Service){withAffinity(600)}, "api", 1, 0, false, 0, 1, false, ""},
		{"xt_recent: another scheduler now", []func(*v1.Service){withAffinity(600)}, []func(*v1.Service){rrPersist}, "", 1, 0, false, 0, 1, false, ""},
		// A template and rr's position.
		{"persistence: the template holds", []func(*v1.Service){rrPersist}, []func(*v1.Service){rrPersist}, "", 1, time.Minute, false, 2, 0, true, ""},
		{"persistence: the destination left", []func(*v1.Service){rrPersist}, []func(*v1.Service){rrPersist}, "", 1, 0, true, 1, 1, false, ""},
		{"rr: the cursor goes on", []func(*v1.Service){rr}, []func(*v1.Service){rr}, "", 2, 0, false, 1, 0, false, "10.0.0.2:8080"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := newBalancingRig(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), "web", eps, tc.old...)
			var last pick
			for range tc.picks {
				last = old.pick(t)
			}
			old.clk.advance(tc.age)
			saved := old.p.SaveBalancing()

			name, newEps := cmp.Or(tc.newName, "web"), eps
			if tc.dropPin {
				newEps = slices.DeleteFunc(slices.Clone(eps), func(a string) bool { return a == last.endpoint.Addr().String() })
			}
			nw := newBalancingRig(t, time.Date(2031, 6, 1, 0, 0, 0, 0, time.UTC), name, newEps, tc.new...)
			restored, dropped, err := nw.p.RestoreBalancing(saved)
			if err != nil || restored != tc.restored || dropped != tc.dropped {
				t.Fatalf("RestoreBalancing = %d, %d, %v; want %d, %d, nil (saved %+v)", restored, dropped, err, tc.restored, tc.dropped, saved)
			}
			nw.tr.OnEndpointSliceUpdate(nil, slice(name, name+"-1", v1.ProtocolTCP, 8080, "", append(slices.Clone(newEps), "10.0.0.4")...))
			if tc.newName != "" {
				return
			}
			next := nw.pick(t)
			if tc.sticky && (next.endpoint != last.endpoint || !next.byAffinity) {
				t.Errorf("next pick %v (by affinity %v), want %v by affinity", next.endpoint, next.byAffinity, last.endpoint)
			}
			if !tc.sticky && next.byAffinity {
				t.Errorf("next pick %v by affinity: no pin should have been restored", next.endpoint)
			}
			if tc.nextAfter != "" {
				keys := next.port.EndpointKeys
				if i := slices.Index(keys, tc.nextAfter); i < 0 || keys[i+1] != next.endpoint.String() {
					t.Errorf("next pick %v, want the one after %s in %v", next.endpoint, tc.nextAfter, keys)
				}
			}
		})
	}
}

// A flow that moves is counted on its endpoint and its client's restored
// template, as if picked here: lc sees it, and the template lives while
// it does.
func TestAdoptedPickCounts(t *testing.T) {
	eps := []string{"10.0.0.1", "10.0.0.2"}
	mods := []func(*v1.Service){withScheduler("rr"), withAffinity(600)}
	old := newBalancingRig(t, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), "web", eps, mods...)
	first := old.pick(t)
	nw := newBalancingRig(t, time.Date(2031, 6, 1, 0, 0, 0, 0, time.UTC), "web", eps, mods...)
	if _, _, err := nw.p.RestoreBalancing(old.p.SaveBalancing()); err != nil {
		t.Fatal(err)
	}
	pk := nw.p.adoptedPick(balancingClient, first.endpoint, "ns/web:p")
	if pk.dest == nil || pk.tmpl == nil {
		t.Fatalf("adopted flow counted on dest %v, template %v; want both", pk.dest, pk.tmpl)
	}
	if a, i := pk.dest.conns.Load(); a != 0 || i != 1 {
		t.Fatalf("counts (%d, %d), want one inactive until its entry is bound", a, i)
	}
	pk.release()
	for _, bad := range []struct {
		endpoint netip.AddrPort
		port     string
	}{
		{first.endpoint, "ns/other:p"},
		{netip.MustParseAddrPort("10.0.0.9:8080"), "ns/web:p"},
	} {
		if pk := nw.p.adoptedPick(balancingClient, bad.endpoint, bad.port); pk.dest != nil || pk.tmpl != nil {
			t.Errorf("a flow to %v of %s was counted", bad.endpoint, bad.port)
		}
	}
}

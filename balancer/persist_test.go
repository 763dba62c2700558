package balancer

import (
	"net/netip"
	"testing"
	"time"
)

// Rows worked out from ip_vs_core.c (ip_vs_sched_persist) and ip_vs_conn.c
// (ip_vs_conn_expire: a template with controlled connections is re-armed
// instead of expiring; ip_vs_conn_put re-arms it on each use).
func TestPersistenceIPVSTemplates(t *testing.T) {
	const T = 10 * time.Second
	eps := testEndpoints(3)
	clientA := netip.MustParseAddr("10.0.0.1")
	clientB := netip.MustParseAddr("10.0.0.2")

	type step struct {
		advance time.Duration
		client  netip.Addr
		sched   int // what the scheduler would answer
		release int // release the template of the step with this index (-1 none), before picking
		want    int
		byTmpl  bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a client sticks while the template lives, the scheduler is not asked", []step{
			{0, clientA, 1, -1, 1, false},
			{time.Second, clientA, 2, -1, 1, true},
			{time.Second, clientB, 2, -1, 2, false},
			{time.Second, clientA, 0, -1, 1, true},
		}},
		{"a template with live connections outlives T", []step{
			{0, clientA, 1, -1, 1, false},
			{5 * T, clientA, 2, -1, 1, true},
		}},
		{"released and idle for T after its last use: expired", []step{
			{0, clientA, 1, -1, 1, false},
			{T / 2, clientA, 1, 0, 1, true}, // the first connection ended; a second starts at T/2
			{T, clientA, 2, 1, 2, false},    // the second ended just now, at 1.5T = T after the last use
		}},
		{"released but used again within T: kept", []step{
			{0, clientA, 1, -1, 1, false},
			{T - time.Nanosecond, clientA, 2, 0, 1, true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := newManualClock()
			p := NewPersistence(PersistenceConfig{Timeout: T, Clock: clk})
			tmpls := make([]*Template, len(tc.steps))
			for i, s := range tc.steps {
				clk.Advance(s.advance)
				if s.release >= 0 {
					tmpls[s.release].Release()
				}
				// Peek (userproxy explain) foretells the template's answer.
				if pi, ok := p.Peek(s.client, eps); ok != s.byTmpl || (ok && pi != s.want) {
					t.Fatalf("step %d: Peek %d %v, want %v (Pick: %d)", i, pi, ok, s.byTmpl, s.want)
				}
				asked := false
				got, tmpl, by := p.Pick(s.client, eps, func() int { asked = true; return s.sched })
				if got != s.want || by != s.byTmpl || asked == by || tmpl == nil {
					t.Fatalf("step %d: got %d byTemplate %v (scheduler asked %v, template %v), want %d %v", i, got, by, asked, tmpl != nil, s.want, s.byTmpl)
				}
				tmpls[i] = tmpl
			}
		})
	}
}

// TestPersistenceOutlivingT: a template whose timer fires while it controls
// a connection is re-armed with 60 s, not T (ip_vs_conn.c, expire_later:
// cp->timeout = 60*HZ), and keeps that timeout on later uses
// (ip_vs_sched_persist does not reset a found template's): used at 0 with
// T = 300 s and a connection ending at 750 s, it fires at 300, 360, ...,
// 720, finds the connection gone at 780 and expires then; a use at 400
// re-arms it for 60 s, not 300.
func TestPersistenceOutlivingT(t *testing.T) {
	const T = 300 * time.Second
	eps := testEndpoints(3)
	client := netip.MustParseAddr("2001:db8::1")
	clk := newManualClock()
	p := NewPersistence(PersistenceConfig{Timeout: T, Clock: clk})
	_, tmpl, _ := p.Pick(client, eps, func() int { return 2 })
	clk.Advance(750 * time.Second)
	tmpl.Release()
	clk.Advance(30*time.Second - time.Nanosecond) // 780 s - 1 ns
	if i, tm, by := p.Pick(client, eps, func() int { return 0 }); i != 2 || !by {
		t.Fatalf("just before 780 s: %d byTemplate %v, want 2 true", i, by)
	} else {
		tm.Release() // a short connection: the template is used at 780 s - 1 ns, now with 60 s
	}
	clk.Advance(60*time.Second - time.Nanosecond)
	if i, tm, by := p.Pick(client, eps, func() int { return 0 }); i != 2 || !by {
		t.Fatalf("60 s after a use under the 60 s timeout, less a nanosecond: %d byTemplate %v", i, by)
	} else {
		tm.Release()
	}
	clk.Advance(60 * time.Second)
	if i, _, by := p.Pick(client, eps, func() int { return 0 }); i != 0 || by {
		t.Fatalf("60 s after the last use with nothing controlled: %d byTemplate %v, want 0 false (a new template)", i, by)
	}
}

// TestPersistenceWithinT: a template used and released within T expires T
// after its last use, as the first firing finds nothing to control.
func TestPersistenceWithinT(t *testing.T) {
	const T = 10 * time.Second
	eps := testEndpoints(2)
	client := netip.MustParseAddr("10.0.0.1")
	clk := newManualClock()
	p := NewPersistence(PersistenceConfig{Timeout: T, Clock: clk})
	_, tmpl, _ := p.Pick(client, eps, func() int { return 1 })
	clk.Advance(time.Second)
	tmpl.Release()
	clk.Advance(T - time.Second - time.Nanosecond)
	if i, tm, by := p.Pick(client, eps, func() int { return 0 }); i != 1 || !by {
		t.Fatalf("just before T: %d byTemplate %v", i, by)
	} else {
		tm.Release()
	}
	clk.Advance(T)
	if i, _, by := p.Pick(client, eps, func() int { return 0 }); i != 0 || by {
		t.Fatalf("T after the last use: %d byTemplate %v, want a new template", i, by)
	}
}

// TestPersistenceDestinationGone: a template whose destination left the
// list is invalid (ip_vs_check_template); the scheduler picks again and
// the old template's connections release harmlessly.
func TestPersistenceDestinationGone(t *testing.T) {
	clk := newManualClock()
	p := NewPersistence(PersistenceConfig{Timeout: time.Minute, Clock: clk})
	client := netip.MustParseAddr("10.1.1.1")
	eps := testEndpoints(3)
	_, old, _ := p.Pick(client, eps, func() int { return 1 })
	shrunk := []Endpoint{eps[0], eps[2]}
	i, tmpl, by := p.Pick(client, shrunk, func() int { return 1 })
	if i != 1 || by || tmpl == old {
		t.Fatalf("after the destination left: %d byTemplate %v (same template %v)", i, by, tmpl == old)
	}
	old.Release()
	// The same destination moved to another index: the template follows.
	moved := []Endpoint{eps[2], eps[0]}
	if i, _, by := p.Pick(client, moved, func() int { return 1 }); i != 0 || !by {
		t.Fatalf("after a reorder: %d byTemplate %v, want 0 true", i, by)
	}
	if i, tmpl, _ := p.Pick(client, nil, func() int { return -1 }); i != -1 || tmpl != nil {
		t.Fatalf("no endpoints: %d %v", i, tmpl)
	}
}

// TestPersistenceBounded: a full map schedules new clients without a
// template until something expires.
func TestPersistenceBounded(t *testing.T) {
	clk := newManualClock()
	p := NewPersistence(PersistenceConfig{Timeout: time.Second, MaxTemplates: 4, Clock: clk})
	eps := testEndpoints(2)
	var held []*Template
	for i := range 6 {
		c := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
		_, tmpl, _ := p.Pick(c, eps, func() int { return i % 2 })
		if (tmpl == nil) != (i >= 4) {
			t.Fatalf("client %d: template %v", i, tmpl != nil)
		}
		held = append(held, tmpl)
	}
	for _, tmpl := range held[:4] {
		tmpl.Release()
	}
	clk.Advance(2 * time.Second) // past the hold-off and past T
	if _, tmpl, _ := p.Pick(netip.MustParseAddr("10.0.1.1"), eps, func() int { return 0 }); tmpl == nil || p.Len() != 1 {
		t.Fatalf("after expiry: template %v, %d held", tmpl != nil, p.Len())
	}
	if p.Sweep() != 0 {
		t.Fatal("swept a live template")
	}
}

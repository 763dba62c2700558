package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// The schedulers on the whole in-process datapath (sched.go): the stack
// over an in-memory link, the proxy, three echo endpoints on loopback
// (127.0.0.1-3, one port), and the counts IPVS() reports, which come from
// the flows' conntrack entries.

type schedPath struct {
	p  *Proxy
	st *netstack.Stack
	tr *service.Tracker
}

// echoOn listens on addr and echoes every connection until the test ends.
func echoOn(t *testing.T, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = io.Copy(c, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln, nil
}

// newSchedPath serves 10.96.0.1:80 over three endpoints with the scheduler
// and affinity mods give the Service.
func newSchedPath(t *testing.T, cfg Config, mods ...func(*v1.Service)) *schedPath {
	t.Helper()
	p, tr, ct := newTestProxyWith(t, cfg, true)
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 256).Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	st.SetFlowHandler(p)
	first, err := echoOn(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := first.Addr().(*net.TCPAddr).Port
	for _, a := range []string{"127.0.0.2", "127.0.0.3"} {
		if _, err := echoOn(t, net.JoinHostPort(a, strconv.Itoa(port))); err != nil {
			t.Skipf("loopback %s:%d: %v", a, port, err)
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		p.Shutdown(ctx)
		cancel()
		st.Close()
	})
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, mods...))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, int32(port), "", "127.0.0.1", "127.0.0.2", "127.0.0.3"))
	tr.OnSynced()
	return &schedPath{p: p, st: st, tr: tr}
}

// open dials the service and completes one echo, so that the flow is
// ESTABLISHED on both sides when it returns.
func (s *schedPath) open(t *testing.T) net.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := s.st.DialContext(ctx, "tcp", "10.96.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	expectExchange(t, c, c, "x")
	return c
}

func withScheduler(name string) func(*v1.Service) {
	return func(s *v1.Service) {
		s.Annotations = map[string]string{service.AnnotationScheduler: name}
	}
}

// counts returns the service's destinations' (ActiveConn, InActConn,
// Conns), in endpoint order.
func (s *schedPath) counts(t *testing.T) [][3]uint64 {
	t.Helper()
	vs := s.p.IPVS()
	if len(vs) != 1 {
		t.Fatalf("IPVS() lists %d services, want 1", len(vs))
	}
	var out [][3]uint64
	for _, d := range vs[0].Dests {
		out = append(out, [3]uint64{uint64(d.ActiveConn), uint64(d.InActConn), d.Stats.Conns})
	}
	return out
}

// waitCounts polls counts until want, or fails with the last seen.
func (s *schedPath) waitCounts(t *testing.T, want [][3]uint64) {
	t.Helper()
	var got [][3]uint64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if got = s.counts(t); fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
	}
	t.Fatalf("(active, inactive, scheduled) per endpoint %v, want %v", got, want)
}

// TestSchedulerLCLongLivedFlows: 30 long-lived connections opened one after
// another under lc end 10/10/10 active (ip_vs_lc.c: the least overhead,
// ties to the first), counted from the conntrack entries; closing them
// moves them to inactive (TIME_WAIT), and their entries' removal uncounts
// them.
func TestSchedulerLCLongLivedFlows(t *testing.T) {
	s := newSchedPath(t, Config{}, withScheduler("lc"))
	var conns []net.Conn
	for range 30 {
		conns = append(conns, s.open(t))
	}
	s.waitCounts(t, [][3]uint64{{10, 0, 10}, {10, 0, 10}, {10, 0, 10}})
	for _, c := range conns {
		c.Close()
	}
	s.waitCounts(t, [][3]uint64{{0, 10, 10}, {0, 10, 10}, {0, 10, 10}})
	s.p.Conntrack().Delete(conntrack.Filter{})
	s.waitCounts(t, [][3]uint64{{0, 0, 10}, {0, 0, 10}, {0, 0, 10}})
}

// TestSchedulerRandomIsNotBalanced: the same 30 connections under the
// lottery, with a fixed seed, do not split 10/10/10 — the case lc is for.
func TestSchedulerRandomIsNotBalanced(t *testing.T) {
	seed := uint64(7)
	s := newSchedPath(t, Config{Rand: balancer.NewSeededSource(seed)})
	for range 30 {
		s.open(t)
	}
	got := s.counts(t)
	total := uint64(0)
	balanced := true
	for _, c := range got {
		total += c[0]
		balanced = balanced && c[0] == 10
	}
	if total != 30 || balanced {
		t.Fatalf("seed %d: active per endpoint %v: want 30 in all, not 10 each", seed, got)
	}
	t.Logf("seed %d: random: (active, inactive, scheduled) %v", seed, got)
}

// TestSchedulerRRInOrder: rr hands 30 connections out in endpoint order
// (ip_vs_rr.c), 10 each.
func TestSchedulerRRInOrder(t *testing.T) {
	s := newSchedPath(t, Config{}, withScheduler("rr"))
	for i := range 30 {
		s.open(t)
		want := [][3]uint64{}
		for e := range 3 {
			n := uint64(i/3 + 1)
			if e > i%3 {
				n--
			}
			want = append(want, [3]uint64{n, 0, n})
		}
		s.waitCounts(t, want)
	}
}

// TestSchedulerDefaultAndPersistence: --scheduler rr applies to a Service
// that names none; with ClientIP affinity it becomes IPVS persistence, so
// one client's connections all go where its first went, and IPVS() shows
// `persistent T`.
func TestSchedulerDefaultAndPersistence(t *testing.T) {
	rr, err := balancer.ParseScheduler("rr", "")
	if err != nil {
		t.Fatal(err)
	}
	s := newSchedPath(t, Config{Scheduler: rr}, func(sv *v1.Service) { sv.Spec.SessionAffinity = v1.ServiceAffinityClientIP })
	for range 6 {
		s.open(t)
	}
	vs := s.p.IPVS()[0]
	if vs.Scheduler.Name != "rr" || vs.Persistent != service.DefaultAffinityTimeout || vs.Affinity != 0 {
		t.Fatalf("virtual service %+v", vs)
	}
	s.waitCounts(t, [][3]uint64{{6, 0, 6}, {0, 0, 0}, {0, 0, 0}})
	if hits := s.p.Stats().AffinityHits; hits != 5 {
		t.Errorf("affinity hits %d, want 5", hits)
	}
}

// TestIPVSStatsCountPackets: --stats' counters add the live entries' packets
// and bytes to those of ended flows.
func TestIPVSStatsCountPackets(t *testing.T) {
	s := newSchedPath(t, Config{}, withScheduler("rr"))
	c := s.open(t)
	d := s.p.IPVS()[0].Dests[0]
	if d.Stats.Conns != 1 || d.Stats.InPkts < 3 || d.Stats.OutPkts < 2 || d.Stats.InBytes < 120 {
		t.Fatalf("live flow: %+v", d.Stats)
	}
	c.Close()
	s.p.Conntrack().Delete(conntrack.Filter{})
	s.waitCounts(t, [][3]uint64{{0, 0, 1}, {0, 0, 0}, {0, 0, 0}})
	if e := s.p.IPVS()[0].Dests[0].Stats; e.InPkts < d.Stats.InPkts || e.OutBytes < d.Stats.OutBytes {
		t.Fatalf("after the flow ended: %+v, before %+v", e, d.Stats)
	}
}

// TestSchedulerDestsFollowEndpoints: an endpoint's dest (its counts) is kept
// across tables while it is listed, and kept apart ("gone", as in IPVS's
// trash) only once it left with flows still counted on it (review: listed
// endpoints were also kept as gone).
func TestSchedulerDestsFollowEndpoints(t *testing.T) {
	s := newSchedPath(t, Config{}, withScheduler("lc"))
	s.open(t)
	state := func() *portState {
		for _, st := range *s.p.states.Load() {
			return st
		}
		return nil
	}
	before := state().sets[setInternal].dests
	port := before[0] // lc: the first endpoint took the flow
	ep := s.p.Table().Ports()[0].Endpoints
	addrs := []string{}
	for _, e := range ep {
		addrs = append(addrs, e.Addr.Addr().String())
	}
	grown := slice("web", "web-1", v1.ProtocolTCP, int32(ep[0].Addr.Port()), "", append(addrs, "127.0.0.4")...)
	s.tr.OnEndpointSliceUpdate(nil, grown)
	st := state()
	if len(st.gone) != 0 || st.sets[setInternal].dests[0] != port {
		t.Fatalf("after an endpoint joined: gone %v, first dest kept %v", st.gone, st.sets[setInternal].dests[0] == port)
	}
	shrunk := slice("web", "web-1", v1.ProtocolTCP, int32(ep[0].Addr.Port()), "", addrs[1:]...)
	s.tr.OnEndpointSliceUpdate(nil, shrunk)
	if st := state(); len(st.gone) != 1 || st.gone[ep[0].Addr] != port {
		t.Fatalf("after the endpoint with the flow left: gone %v", st.gone)
	}
}

// TestSchedulerOnePerList: when a port's external set stops being its
// internal set (externalTrafficPolicy Cluster -> Local), each set gets a
// scheduler of its own; they do not share the one the old state shared
// (an rr cursor or an mh table serves one list).
func TestSchedulerOnePerList(t *testing.T) {
	p, tr, _ := newTestProxyWith(t, Config{}, true)
	lb := func(policy v1.ServiceExternalTrafficPolicy) *v1.Service {
		return svc("web", "10.96.0.1", v1.ProtocolTCP, 80, withScheduler("rr"), func(s *v1.Service) {
			s.Spec.Type = v1.ServiceTypeNodePort
			s.Spec.Ports[0].NodePort = 30080
			s.Spec.ExternalTrafficPolicy = policy
		})
	}
	es := slice("web", "web-1", v1.ProtocolTCP, 8080, "node-a", "10.0.0.1")
	es.Endpoints = append(es.Endpoints, slice("web", "x", v1.ProtocolTCP, 8080, "node-b", "10.0.0.2").Endpoints...)
	tr.OnServiceAdd(lb(v1.ServiceExternalTrafficPolicyCluster))
	tr.OnEndpointSliceAdd(es)
	tr.OnSynced()
	state := func() *portState {
		for _, st := range *p.states.Load() {
			return st
		}
		return nil
	}
	if st := state(); st.sets[setExternal] != st.sets[setInternal] {
		t.Fatal("Cluster policy: the external set is not the internal one")
	}
	tr.OnServiceUpdate(nil, lb(v1.ServiceExternalTrafficPolicyLocal))
	st := state()
	if st.sets[setExternal] == st.sets[setInternal] || st.sets[setExternal].sched == st.sets[setInternal].sched {
		t.Fatalf("Local policy: the sets or their schedulers are shared")
	}
	if len(st.sets[setExternal].eps) != 1 || len(st.sets[setInternal].eps) != 2 {
		t.Fatalf("sets: external %d, internal %d endpoints", len(st.sets[setExternal].eps), len(st.sets[setInternal].eps))
	}
}

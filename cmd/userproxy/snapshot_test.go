package main

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/handover"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// testSnapshot is a link, two TCP flows and two UDP flows with every
// field set.
func testSnapshot() (linkState, proxy.Moved) {
	l := linkState{name: "userproxy0", mtu: 65520, vnet: true, queues: 2, created: true,
		routes: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/112")}}
	var flows []proxy.MovedFlow
	for i, c := range []struct{ src, dst, ep string }{
		{"10.0.0.7:40000", "10.96.0.10:80", "10.244.1.5:8080"},
		{"[fd00::7]:40001", "[fd00:96::10]:443", "[fd00:244::5]:8443"},
	} {
		f := proxy.MovedFlow{
			Entry: conntrack.Saved{
				Original: conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort(c.src), netip.MustParseAddrPort(c.dst)),
				Status:   conntrack.StatusSeenReply | conntrack.StatusAssured, Packets: [2]uint64{10, 20}, Bytes: [2]uint64{1000, 20000},
				Age: time.Minute, Idle: time.Second, Timeout: 24 * time.Hour,
			},
			TCP: netstack.MovedTCP{IRS: 1, RcvNxt: 2, RcvAdv: 3, RcvWnd: 4, RcvShift: 7, FinIn: true, SockFull: true,
				ISS: 5, SndUna: 6, SndNxt: 7, SndMax: 8, SndWnd: 9, MaxSndWnd: 10, Recover: 11, SndWl1: 12, SndWl2: 13,
				SndShift: 7, PeerWS: -1, AdvMSS: 1460, MSS: 1400, FinSent: true, FinSeen: true, DupThresh: 3,
				SackOK: true, TS: true, TSRecent: 14, TSNow: 15, Cwnd: 16, Ssthresh: 17, SRTT: time.Millisecond,
				RTTVar: 2 * time.Millisecond, Measured: true, MinRTT: 3 * time.Millisecond, ReoDelay: 4 * time.Millisecond,
				ReoSeen: true, ReoMult: 2},
			Endpoint: netip.MustParseAddrPort(c.ep), ServicePort: "default/web:http",
		}
		f.Entry.TCP[0] = byte(i + 1)
		f.TCP.SynRcvd = i == 1
		flows = append(flows, f)
	}
	l.balancing = testBalancing()
	l.listeners = []string{"TCP 127.0.0.1:30080", healthListenerName("0.0.0.0:10256")}
	udp := []proxy.MovedUDP{{
		Entry: conntrack.Saved{
			Original: conntrack.MakeTuple(conntrack.UDP, netip.MustParseAddrPort("10.0.0.7:40002"), netip.MustParseAddrPort("10.96.0.53:53")),
			Status:   conntrack.StatusSeenReply, Packets: [2]uint64{3, 4}, Bytes: [2]uint64{300, 400},
			Age: 5 * time.Second, Idle: time.Second, Timeout: 2 * time.Minute,
		},
		Endpoint: netip.MustParseAddrPort("10.244.1.6:53"), ServicePort: "kube-system/dns:dns", ProxyProtocol: proxy.ProxyProtocolV2,
	}, {
		Entry: conntrack.Saved{
			Original: conntrack.MakeTuple(conntrack.UDP, netip.MustParseAddrPort("[fd00::7]:40003"), netip.MustParseAddrPort("[fd00:96::53]:53")),
			Age:      time.Second, Timeout: 29 * time.Second,
		},
		Endpoint: netip.MustParseAddrPort("[fd00:244::6]:53"), ServicePort: "kube-system/dns:dns",
	}}
	host := []proxy.MovedHost{{
		Entry: conntrack.Saved{
			Original: conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort("192.0.2.9:50000"), netip.MustParseAddrPort("192.0.2.1:30080")),
			Status:   conntrack.StatusSeenReply | conntrack.StatusAssured, Packets: [2]uint64{5, 6}, Bytes: [2]uint64{500, 600},
			Age: time.Minute, Idle: time.Second, Timeout: time.Hour,
		},
		Endpoint: netip.MustParseAddrPort("10.244.1.5:8080"), ServicePort: "default/web:http",
		Pending: [2][]byte{[]byte("to the endpoint"), nil}, EOF: [2]bool{false, true},
	}}
	host[0].Entry.TCP[0] = 3
	return l, proxy.Moved{TCP: flows, UDP: udp, Host: host}
}

// testBalancing is a port with affinity lists and one with IPVS sets, with
// every field set.
func testBalancing() proxy.Balancing {
	ep := func(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
	return proxy.Balancing{Ports: []proxy.PortBalancing{
		{Name: service.PortName{Namespace: "default", Name: "web", Port: "http"}, Protocol: service.TCP, Family: service.IPv4, Scheduler: "random",
			Affinity: []balancer.SavedList{{Endpoint: "10.244.1.5:8080", Clients: []balancer.ClientAge{
				{Addr: netip.MustParseAddr("10.0.0.7"), Age: time.Hour}, {Addr: netip.MustParseAddr("10.0.0.8"), Age: time.Second}}}}},
		{Name: service.PortName{Namespace: "default", Name: "db"}, Protocol: service.UDP, Family: service.IPv6, Scheduler: "wrr",
			Sets: []proxy.SetBalancing{
				{Set: 0, Scheduler: &balancer.SavedScheduler{Name: "wrr", Endpoints: []balancer.Endpoint{
					{Addr: ep("[fd00:244::5]:53"), Weight: 3}, {Addr: ep("[fd00:244::6]:53"), Weight: 1}}, Cursor: 1, Weight: 2},
					Templates: []balancer.SavedTemplate{
						{Client: netip.MustParseAddr("fd00::7"), Dest: ep("[fd00:244::5]:53"), Idle: time.Minute, Controls: 2, Rechecked: true},
						{Client: netip.MustParseAddr("fd00::8"), Dest: ep("[fd00:244::6]:53"), Idle: time.Minute, Released: time.Second}}},
				{Set: 2, Scheduler: &balancer.SavedScheduler{Name: "wrr", Cursor: -1}},
			}},
	}}
}

// TestSnapshotRoundTrip: the link and every field of every flow, TCP and
// UDP, read back as written.
func TestSnapshotRoundTrip(t *testing.T) {
	l, flows := testSnapshot()
	syns := [][]byte{make([]byte, 60), make([]byte, 80)}
	syns[0][0], syns[1][0] = 0x45, 0x60
	gotL, gotFlows, gotSYNs, err := decodeSnapshot(encodeSnapshot(l, flows, syns))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotSYNs, syns) {
		t.Errorf("SYNs: %x, want %x", gotSYNs, syns)
	}
	if !reflect.DeepEqual(gotL, l) {
		t.Errorf("link: %+v, want %+v", gotL, l)
	}
	if !reflect.DeepEqual(gotFlows, flows) {
		t.Errorf("flows:\n%+v\nwant\n%+v", gotFlows, flows)
	}
}

// TestSnapshotDecodeRefuses: a link the taker cannot use, and a flow that
// is not TCP, are refused as corrupt.
func TestSnapshotDecodeRefuses(t *testing.T) {
	l, flows := testSnapshot()
	bad := l
	bad.queues = 0
	if _, _, _, err := decodeSnapshot(encodeSnapshot(bad, flows, nil)); !errors.Is(err, handover.ErrCorrupt) {
		t.Errorf("no queues: %v", err)
	}
	twice := l
	twice.listeners = []string{"TCP 127.0.0.1:30080", "TCP 127.0.0.1:30080"}
	if _, _, _, err := decodeSnapshot(encodeSnapshot(twice, flows, nil)); !errors.Is(err, handover.ErrCorrupt) {
		t.Errorf("a listener twice: %v", err)
	}
	for name, m := range map[string]proxy.Moved{
		"a flow twice":      {TCP: []proxy.MovedFlow{flows.TCP[0], flows.TCP[0]}},
		"a UDP flow twice":  {UDP: []proxy.MovedUDP{flows.UDP[0], flows.UDP[0]}},
		"a host flow twice": {Host: []proxy.MovedHost{flows.Host[0], flows.Host[0]}},
		"a host flow holding more than a buffer": {Host: []proxy.MovedHost{func() proxy.MovedHost {
			f := flows.Host[0]
			f.Pending[1] = make([]byte, maxHostPending+1)
			return f
		}()}},
	} {
		if _, _, _, err := decodeSnapshot(encodeSnapshot(l, m, nil)); !errors.Is(err, handover.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	udp := flows.TCP[0]
	udp.Entry.Original = conntrack.MakeTuple(conntrack.UDP, udp.Entry.Original.Src(), udp.Entry.Original.Dst())
	if _, _, _, err := decodeSnapshot(encodeSnapshot(l, proxy.Moved{TCP: []proxy.MovedFlow{udp}}, nil)); !errors.Is(err, handover.ErrCorrupt) {
		t.Errorf("a UDP flow among the TCP ones: %v", err)
	}
	for name, change := range map[string]func(*proxy.MovedUDP){
		"a TCP flow among the UDP ones": func(f *proxy.MovedUDP) {
			f.Entry.Original = conntrack.MakeTuple(conntrack.TCP, f.Entry.Original.Src(), f.Entry.Original.Dst())
		},
		"a PROXY protocol v3":    func(f *proxy.MovedUDP) { f.ProxyProtocol = 3 },
		"no endpoint":            func(f *proxy.MovedUDP) { f.Endpoint = netip.AddrPort{} },
		"a negative UDP timeout": func(f *proxy.MovedUDP) { f.Entry.Timeout = -1 },
	} {
		bad := flows.UDP[0]
		change(&bad)
		if _, _, _, err := decodeSnapshot(encodeSnapshot(l, proxy.Moved{UDP: []proxy.MovedUDP{bad}}, nil)); !errors.Is(err, handover.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for name, change := range map[string]func(*proxy.Balancing){
		"a fourth endpoint set":      func(b *proxy.Balancing) { b.Ports[1].Sets[0].Set = 3 },
		"a cursor past its list":     func(b *proxy.Balancing) { b.Ports[1].Sets[0].Scheduler.Cursor = 2 },
		"a cursor before the head":   func(b *proxy.Balancing) { b.Ports[1].Sets[0].Scheduler.Cursor = -2 },
		"a negative age":             func(b *proxy.Balancing) { b.Ports[0].Affinity[0].Clients[0].Age = -1 },
		"a port of another protocol": func(b *proxy.Balancing) { b.Ports[0].Protocol = 132 },
		"a template's negative idle": func(b *proxy.Balancing) { b.Ports[1].Sets[0].Templates[0].Idle = -1 },
	} {
		bad := l
		bad.balancing = testBalancing()
		change(&bad.balancing)
		if _, _, _, err := decodeSnapshot(encodeSnapshot(bad, flows, nil)); !errors.Is(err, handover.ErrCorrupt) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestSnapshotWithoutBalancing: a snapshot from a build that wrote no
// balancing and no udp section reads as one with no such state; a section
// this build does not know is skipped.
func TestSnapshotWithoutBalancing(t *testing.T) {
	l, flows := testSnapshot()
	secs, err := handover.Sections(encodeSnapshot(l, flows, nil))
	if err != nil {
		t.Fatal(err)
	}
	var s handover.Snapshot
	for _, id := range []uint16{sectionLink, sectionFlows, sectionSYNs} {
		s.Section(id, func(e *handover.Enc) { appendRaw(e, secs[id]) })
	}
	s.Section(99, func(e *handover.Enc) { e.String("from a later build") })
	gotL, gotFlows, _, err := decodeSnapshot(s.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(gotL.balancing.Ports) != 0 || len(gotFlows.UDP) != 0 || !reflect.DeepEqual(gotFlows.TCP, flows.TCP) {
		t.Fatalf("balancing %+v, %d TCP and %d UDP flows; want none and the TCP flows", gotL.balancing, len(gotFlows.TCP), len(gotFlows.UDP))
	}
}

// FuzzDecodeSnapshot: any bytes, and any body in a valid container, decode
// to an error or to values within their bounds, never a panic.
func FuzzDecodeSnapshot(f *testing.F) {
	l, flows := testSnapshot()
	snap := encodeSnapshot(l, flows, [][]byte{make([]byte, 60)})
	f.Add(snap)
	secs, err := handover.Sections(snap)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(secs[sectionBalancing]) // for wrapBalancing
	f.Add(secs[sectionUDP])       // for wrapUDP
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, wrapBody(b), wrapBalancing(b), wrapUDP(b)} {
			l, flows, syns, err := decodeSnapshot(in)
			if err != nil {
				continue
			}
			if l.queues < 1 || l.queues > 1024 || len(flows.TCP)+len(flows.UDP) > len(in) || len(syns) > len(in) {
				t.Fatalf("decoded %d queues, %d flows from %d bytes", l.queues, len(flows.TCP)+len(flows.UDP), len(in))
			}
			for _, f := range flows.UDP {
				checkUDPFlow(t, f)
			}
			restoreBalancing(t, l.balancing)
		}
	})
}

// wrapBody puts b in a snapshot's header, so that the fuzzer's bytes reach
// the sections.
func wrapBody(b []byte) []byte {
	var s handover.Snapshot
	if len(b) >= 2 {
		s.Section(sectionLink, func(e *handover.Enc) {
			e.String("userproxy0")
			e.U32(1500)
			e.Bool(true)
			e.U32(1)
			e.Bool(false)
			e.U32(0)
		})
		s.Section(sectionFlows, func(e *handover.Enc) { e.U32(uint32(b[0])); appendRaw(e, b[1:]) })
		s.Section(sectionSYNs, func(e *handover.Enc) { e.U32(0) })
	}
	return s.Bytes()
}

// wrapBalancing puts b in a snapshot as its balancing section, beside a
// valid link and no flows.
func wrapBalancing(b []byte) []byte { return wrapSection(sectionBalancing, b) }

// wrapUDP puts b in a snapshot as its udp section, beside a valid link
// and no other flows.
func wrapUDP(b []byte) []byte { return wrapSection(sectionUDP, b) }

// wrapSection puts b in a snapshot as section id, beside a valid link, no
// flows and no SYNs.
func wrapSection(id uint16, b []byte) []byte {
	var s handover.Snapshot
	s.Section(sectionLink, func(e *handover.Enc) {
		e.String("userproxy0")
		e.U32(1500)
		e.Bool(false)
		e.U32(1)
		e.Bool(false)
		e.U32(0)
	})
	s.Section(sectionFlows, func(e *handover.Enc) { e.U32(0) })
	s.Section(sectionSYNs, func(e *handover.Enc) { e.U32(0) })
	s.Section(id, func(e *handover.Enc) { appendRaw(e, b) })
	return s.Bytes()
}

// checkUDPFlow holds a decoded UDP flow to what the decoder promises, and
// hands its entry to a conntrack table, as adoption does: a refusal is
// fine, a panic or an entry that is not the flow's is not.
func checkUDPFlow(t *testing.T, f proxy.MovedUDP) {
	if f.Entry.Original.Proto() != conntrack.UDP || !f.Endpoint.IsValid() || f.ProxyProtocol > proxy.ProxyProtocolV2 {
		t.Fatalf("decoded UDP flow %+v", f)
	}
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if ct.Restore(f.Entry) == nil {
		if info, ok := ct.Get(f.Entry.Original); !ok || info.Original != f.Entry.Original {
			t.Fatalf("restored %v, got %+v", f.Entry.Original, info)
		}
	}
}

// restoreBalancing hands decoded state to what restores it in the next
// process (balancer's Restore functions, as RestoreBalancing calls them):
// a refusal is fine, a panic or growth past the bounds is not, and what
// is accepted is all counted.
func restoreBalancing(t *testing.T, b proxy.Balancing) {
	const listSize, maxTemplates = 4, 8
	for _, p := range b.Ports {
		a := balancer.NewAffinity(balancer.AffinityConfig{Timeout: time.Hour, ListSize: listSize})
		in := 0
		for _, l := range p.Affinity {
			in += len(l.Clients)
		}
		if r, d, err := a.Restore(p.Affinity); err == nil {
			if r+d != in {
				t.Fatalf("affinity: %d restored and %d dropped of %d", r, d, in)
			}
			for _, l := range p.Affinity {
				if n := len(a.Clients(l.Endpoint)); n > listSize {
					t.Fatalf("a list of %d clients, limit %d", n, listSize)
				}
			}
		}
		for _, s := range p.Sets {
			ps := balancer.NewPersistence(balancer.PersistenceConfig{Timeout: time.Hour, MaxTemplates: maxTemplates})
			if r, d, err := ps.Restore(s.Templates); err == nil && (r+d != len(s.Templates) || ps.Len() > maxTemplates) {
				t.Fatalf("templates: %d restored and %d dropped of %d, %d held", r, d, len(s.Templates), ps.Len())
			}
			if v := s.Scheduler; v != nil {
				for _, name := range []string{"rr", "wrr"} {
					cfg, _ := balancer.ParseScheduler(name, "")
					sched := cfg.New(nil)
					eps := []balancer.Endpoint{{Addr: netip.MustParseAddrPort("10.0.0.1:80"), Weight: 1}}
					if balancer.RestoreScheduler(sched, *v, eps) == nil && sched.Pick(eps, balancer.Flow{}) != 0 {
						t.Fatalf("%s restored from %+v picks off its list", name, v)
					}
				}
			}
		}
	}
}

func appendRaw(e *handover.Enc, b []byte) {
	for _, c := range b {
		e.U8(c)
	}
}

package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
)

// check verifies the table's internal invariants: every entry is in its
// shard's map and heap exactly once, the heap is ordered, heap keys never
// pass the real expiry, the non-ASSURED list holds exactly the non-ASSURED
// entries, and the counts agree. Tests call it after concurrent or fuzzed
// work; it must run with no other goroutine using the table.
func (t *Table) check() error {
	total := 0
	for i := range t.shards {
		sh := &t.shards[i]
		if len(sh.heap) != sh.idx.n {
			return fmt.Errorf("shard %d: heap %d, index %d", i, len(sh.heap), sh.idx.n)
		}
		var n [2]int
		unassured := 0
		inIndex := 0
		for j, s := range sh.idx.slots {
			e := s.e
			if e == nil {
				continue
			}
			inIndex++
			k := e.key
			if sh2, h := t.locate(&k); sh2 != sh || h != s.hash {
				return fmt.Errorf("entry %v in the wrong shard or with a wrong hash", k)
			}
			if got := sh.idx.get(&k, s.hash); got != e {
				return fmt.Errorf("entry %v at slot %d cannot be found", k, j)
			}
			if int(e.heapIdx) >= len(sh.heap) || e.heapIdx < 0 || sh.heap[e.heapIdx].e != e {
				return fmt.Errorf("entry %v: bad heap index %d", k, e.heapIdx)
			}
			if at := sh.heap[e.heapIdx].at; at > e.expires {
				return fmt.Errorf("entry %v: heap key %d after expiry %d", k, at, e.expires)
			}
			if e.status&StatusAssured == 0 {
				unassured++
			}
			n[protoSlot(k.proto)]++
		}
		for j := 1; j < len(sh.heap); j++ {
			if sh.heap[(j-1)/2].at > sh.heap[j].at {
				return fmt.Errorf("shard %d: heap out of order at %d", i, j)
			}
		}
		if inIndex != sh.idx.n || (len(sh.idx.slots) > 0 && sh.idx.n*2 > len(sh.idx.slots)) {
			return fmt.Errorf("shard %d: index holds %d, counts %d in %d slots", i, inIndex, sh.idx.n, len(sh.idx.slots))
		}
		listed := 0
		var prev *entry
		for e := sh.head; e != nil; e = e.next {
			if e.prev != prev {
				return fmt.Errorf("shard %d: broken list links", i)
			}
			if e.status&StatusAssured != 0 || sh.idx.get(&e.key, e.key.hash(t.seed)) != e {
				return fmt.Errorf("shard %d: list holds %v (status %v)", i, e.key, e.status)
			}
			prev = e
			listed++
			if listed > sh.idx.n {
				return fmt.Errorf("shard %d: list loops", i)
			}
		}
		if sh.tail != prev {
			return fmt.Errorf("shard %d: tail is not the last entry", i)
		}
		if listed != unassured {
			return fmt.Errorf("shard %d: list %d, non-ASSURED entries %d", i, listed, unassured)
		}
		if n != sh.n {
			return fmt.Errorf("shard %d: counts %v, want %v", i, sh.n, n)
		}
		total += sh.idx.n
	}
	if c := t.count.Load(); c != int64(total) {
		return fmt.Errorf("count %d, entries %d", c, total)
	}
	if int64(total) > t.max {
		return fmt.Errorf("%d entries over Max %d", total, t.max)
	}
	return nil
}

func mustCheck(t testing.TB, tab *Table) {
	t.Helper()
	if err := tab.check(); err != nil {
		t.Fatal(err)
	}
}

// TestEntrySize holds the entry to the DESIGN.md memory figure.
func TestEntrySize(t *testing.T) {
	size := unsafe.Sizeof(entry{})
	t.Logf("sizeof(entry) = %d bytes, sizeof(Tuple) = %d, sizeof(Result) = %d, sizeof(EntryInfo) = %d",
		size, unsafe.Sizeof(Tuple{}), unsafe.Sizeof(Result{}), unsafe.Sizeof(EntryInfo{}))
	if size >= 256 {
		t.Errorf("entry is %d bytes, want under 256", size)
	}
}

func TestDefaultMax(t *testing.T) {
	for _, c := range []struct{ cpus, want int }{
		{0, 131072}, {1, 131072}, {2, 131072}, {4, 131072}, {5, 163840}, {8, 262144}, {32, 1048576}, {64, 1048576},
	} {
		if got := DefaultMax(c.cpus); got != c.want {
			t.Errorf("DefaultMax(%d) = %d, want %d", c.cpus, got, c.want)
		}
	}
	if c := DefaultConfig(); c.Max < 131072 || c.Shards != 64 || c.Timeouts != DefaultTimeouts() {
		t.Errorf("DefaultConfig() = %+v", c)
	}
}

func TestNewTableConfig(t *testing.T) {
	for _, c := range []Config{
		{Shards: 3},
		{Shards: -2},
		{Shards: 1 << 17},
		{Max: -1},
		{Timeouts: Timeouts{UDP: -time.Second}},
	} {
		if _, err := NewTable(c); !errors.Is(err, errConfig) {
			t.Errorf("NewTable(%+v): %v, want a config error", c, err)
		}
	}
	tab, err := NewTable(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if s := tab.Stats(); s.Max != 131072 || len(tab.shards) != 64 || tab.tcpTO[TCPEstablished] != int64(24*time.Hour) {
		t.Errorf("zero Config gave max %d, %d shards, established %v", s.Max, len(tab.shards), time.Duration(tab.tcpTO[TCPEstablished]))
	}
	tab, err = NewTable(Config{Shards: 1, Timeouts: Timeouts{UDP: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if tab.udpTO != int64(time.Second) || tab.streamTO != int64(120*time.Second) || tab.shift != 64 {
		t.Errorf("udp %v stream %v shift %d", tab.udpTO, tab.streamTO, tab.shift)
	}
}

// TestChecksumAgainstReference compares the optimised sum with the plain one
// on random data of every length up to 300 bytes.
func TestChecksumAgainstReference(t *testing.T) {
	rng := testRand(t)
	for n := 0; n <= 300; n++ {
		for k := 0; k < 5; k++ {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			if k == 0 {
				for i := range b {
					b[i] = 0xff
				}
			}
			want := ^refChecksum(b)
			if got := fold(sum(b, 0)); got != want && !(got == 0xffff && want == 0) && !(got == 0 && want == 0xffff) {
				t.Fatalf("len %d: fold(sum) = %#04x, reference %#04x (% x)", n, got, want, b)
			}
		}
	}
}

// TestExpiryTCP: every state expires after exactly its timeout, found by
// Sweep, with OnRemove told why.
func TestExpiryTCP(t *testing.T) {
	to := DefaultTimeouts()
	want := map[TCPState]time.Duration{
		TCPSynSent: to.TCPSynSent, TCPSynSent2: to.TCPSynSent, TCPSynRecv: to.TCPSynRecv,
		TCPEstablished: to.TCPEstablished, TCPFinWait: to.TCPFinWait, TCPCloseWait: to.TCPCloseWait,
		TCPLastAck: to.TCPLastAck, TCPTimeWait: to.TCPTimeWait, TCPClose: to.TCPClose,
	}
	for state, timeout := range want {
		t.Run(state.String(), func(t *testing.T) {
			var removed []EntryInfo
			var why []RemoveReason
			tab, clk := newTestTable(t, func(c *Config) {
				c.OnRemove = func(i EntryInfo, r RemoveReason) { removed = append(removed, i); why = append(why, r) }
			})
			f := newFlow(t, tab, clk, client4, service4)
			for _, s := range reach[state] {
				f.mustSend(s.dir, s.flags, 0)
			}
			i, ok := f.info()
			if !ok || i.State != state || i.Timeout != timeout {
				t.Fatalf("setup: %v %v (present %v), want %v %v", i.State, i.Timeout, ok, state, timeout)
			}
			clk.Advance(timeout - 1)
			if n := tab.Sweep(); n != 0 {
				t.Fatalf("Sweep removed %d a nanosecond early", n)
			}
			if _, ok := f.info(); !ok {
				t.Fatal("gone a nanosecond early")
			}
			clk.Advance(1)
			if _, ok := f.info(); ok {
				t.Error("Get still finds the expired entry")
			}
			if n := tab.Sweep(); n != 1 {
				t.Fatalf("Sweep removed %d, want 1", n)
			}
			if len(removed) != 1 || why[0] != RemoveExpired || removed[0].State != state || removed[0].Timeout != 0 {
				t.Errorf("OnRemove: %v %v", removed, why)
			}
			if s := tab.Stats(); s.Expired != 1 || s.Entries != 0 {
				t.Errorf("stats %+v", s)
			}
			mustCheck(t, tab)
		})
	}
}

// TestExpiryShortenedTimeout: a refreshed entry whose timeout then shrinks
// (RST after a long ESTABLISHED life) is swept at the new, earlier time.
func TestExpiryShortenedTimeout(t *testing.T) {
	to := DefaultTimeouts()
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.handshake()
	for range 5 {
		clk.Advance(time.Hour)
		f.mustSend(Original, flagACK|flagPSH, 10)
		f.mustSend(Reply, flagACK, 0)
	}
	if n := tab.Sweep(); n != 0 {
		t.Fatalf("swept %d live entries", n)
	}
	f.mustSend(Reply, flagRST, 0)
	clk.Advance(to.TCPClose - 1)
	if n := tab.Sweep(); n != 0 {
		t.Fatalf("swept %d early", n)
	}
	clk.Advance(1)
	if n := tab.Sweep(); n != 1 {
		t.Fatalf("swept %d, want 1", n)
	}
	mustCheck(t, tab)
}

// TestExpiryUDP: 30 s without a reply, 30 s when replied but younger than
// 2 s, 120 s (and ASSURED) once replied and older than 2 s.
func TestExpiryUDP(t *testing.T) {
	to := DefaultTimeouts()
	req := udpPacket(client4, service4, 30, ipOpts{})
	resp := udpPacket(service4, client4, 60, ipOpts{})
	tuple := MakeTuple(UDP, client4, service4)
	type step struct {
		at      time.Duration // since the first datagram
		dir     Direction
		timeout time.Duration
		status  Status
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"unreplied", []step{{0, Original, to.UDP, 0}, {10 * time.Second, Original, to.UDP, 0}}},
		{"replied young", []step{{0, Original, to.UDP, 0}, {time.Second, Reply, to.UDP, StatusSeenReply}, {2 * time.Second, Original, to.UDP, StatusSeenReply}}},
		{"stream", []step{{0, Original, to.UDP, 0}, {time.Second, Reply, to.UDP, StatusSeenReply},
			{2*time.Second + 1, Original, to.UDPStream, StatusSeenReply | StatusAssured},
			{5 * time.Second, Reply, to.UDPStream, StatusSeenReply | StatusAssured}}},
		{"first reply after 2s", []step{{0, Original, to.UDP, 0}, {3 * time.Second, Reply, to.UDP, StatusSeenReply},
			{4 * time.Second, Reply, to.UDPStream, StatusSeenReply | StatusAssured}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab, clk := newTestTable(t, nil)
			start := clk.Now()
			for _, s := range c.steps {
				clk.Advance(time.Duration(start + int64(s.at) - clk.Now()))
				pkt := req
				if s.dir == Reply {
					pkt = resp
				}
				r := tab.Classify(pkt, s.dir)
				if r.Verdict == New {
					if err := tab.Confirm(&r); err != nil {
						t.Fatal(err)
					}
				} else if r.Verdict != Established {
					t.Fatalf("at %v: %v %v", s.at, r.Verdict, r.Reason)
				}
				i, _ := tab.Get(tuple)
				if i.Timeout != s.timeout || i.Status != s.status {
					t.Errorf("at %v: timeout %v status %v, want %v %v", s.at, i.Timeout, i.Status, s.timeout, s.status)
				}
			}
			last := c.steps[len(c.steps)-1]
			clk.Advance(last.timeout - 1)
			if tab.Sweep() != 0 {
				t.Fatal("expired early")
			}
			clk.Advance(1)
			// Lazy expiry: the next datagram finds no live entry and is New.
			r := tab.Classify(req, Original)
			if r.Verdict != New {
				t.Fatalf("after expiry: %v", r.Verdict)
			}
			if s := tab.Stats(); s.Expired != 1 || s.Entries != 0 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestEarlyDrop: a full table drops its oldest non-ASSURED entry for a new
// flow, refuses the flow when every entry is ASSURED, and prefers expired
// entries to either.
func TestEarlyDrop(t *testing.T) {
	type ev struct {
		ID  uint64
		Why RemoveReason
	}
	setup := func(t *testing.T, shards, max int) (*Table, *ManualClock, *[]ev) {
		var events []ev
		tab, clk := newTestTable(t, func(c *Config) {
			c.Shards, c.Max = shards, max
			c.OnRemove = func(i EntryInfo, r RemoveReason) { events = append(events, ev{i.ID, r}) }
		})
		return tab, clk, &events
	}
	clientPort := func(p uint16) netip.AddrPort { return netip.AddrPortFrom(client4.Addr(), p) }

	t.Run("evicts the oldest non-assured", func(t *testing.T) {
		tab, clk, events := setup(t, 1, 3)
		a := newFlow(t, tab, clk, clientPort(1), service4)
		b := newFlow(t, tab, clk, clientPort(2), service4)
		c := newFlow(t, tab, clk, clientPort(3), service4)
		a.mustSend(Original, flagSYN, 0)
		b.handshake() // ASSURED
		c.mustSend(Original, flagSYN, 0)
		ai, _ := a.info()
		d := newFlow(t, tab, clk, clientPort(4), service4)
		if r := d.mustSend(Original, flagSYN, 0); r.Verdict != New {
			t.Fatalf("verdict %v", r.Verdict)
		}
		if _, ok := a.info(); ok {
			t.Error("oldest non-assured entry survived")
		}
		for _, f := range []*flow{b, c, d} {
			if _, ok := f.info(); !ok {
				t.Errorf("%v was dropped", f.c)
			}
		}
		if diff := cmp.Diff([]ev{{ai.ID, RemoveEvicted}}, *events); diff != "" {
			t.Errorf("OnRemove (-want +got):\n%s", diff)
		}
		if s := tab.Stats(); s.Evicted != 1 || s.TableFull != 0 || s.Entries != 3 || s.Inserted != 4 {
			t.Errorf("stats %+v", s)
		}
		mustCheck(t, tab)
	})

	t.Run("refuses when all are assured", func(t *testing.T) {
		tab, clk, events := setup(t, 1, 2)
		for p := uint16(1); p <= 2; p++ {
			newFlow(t, tab, clk, clientPort(p), service4).handshake()
		}
		d := newFlow(t, tab, clk, clientPort(9), service4)
		r := tab.Classify(tcpPacket(d.seg(Original, flagSYN, 0)), Original)
		if r.Verdict != New {
			t.Fatalf("classify: %v", r.Verdict)
		}
		if err := tab.Confirm(&r); !errors.Is(err, ErrTableFull) {
			t.Fatalf("Confirm: %v, want ErrTableFull", err)
		}
		if _, ok := d.info(); ok {
			t.Error("refused flow was inserted")
		}
		// UDP is refused the same way, and INVALID is not touched.
		ru := tab.Classify(udpPacket(clientPort(10), service4, 1, ipOpts{}), Original)
		if err := tab.Confirm(&ru); !errors.Is(err, ErrTableFull) {
			t.Fatalf("UDP Confirm: %v", err)
		}
		if s := tab.Stats(); s.TableFull != 2 || s.Evicted != 0 || s.InvalidTotal != 0 || s.Entries != 2 {
			t.Errorf("stats %+v", s)
		}
		if len(*events) != 0 {
			t.Errorf("OnRemove called: %v", *events)
		}
		mustCheck(t, tab)
	})

	t.Run("expired entries go first", func(t *testing.T) {
		tab, clk, events := setup(t, 1, 2)
		a := newFlow(t, tab, clk, clientPort(1), service4)
		a.mustSend(Original, flagSYN, 0)
		clk.Advance(time.Minute)
		b := newFlow(t, tab, clk, clientPort(2), service4)
		b.mustSend(Original, flagSYN, 0)
		clk.Advance(61 * time.Second) // a's SYN_SENT timeout has passed, b's has not
		c := newFlow(t, tab, clk, clientPort(3), service4)
		c.mustSend(Original, flagSYN, 0)
		if len(*events) != 1 || (*events)[0].Why != RemoveExpired {
			t.Errorf("OnRemove %v, want one expiry", *events)
		}
		if _, ok := b.info(); !ok {
			t.Error("live non-assured entry was dropped instead of the expired one")
		}
		mustCheck(t, tab)
	})

	t.Run("evicts from another shard", func(t *testing.T) {
		tab, clk, events := setup(t, 4, 2)
		// Two non-assured flows, then a third in a shard holding neither.
		var flows []*flow
		used := map[*shard]bool{}
		for p := uint16(1); len(flows) < 3; p++ {
			f := newFlow(t, tab, clk, clientPort(p), service4)
			k := f.tuple()
			sh, _ := tab.locate(&k)
			if len(flows) < 2 || !used[sh] {
				if len(flows) == 2 && used[sh] {
					continue
				}
				used[sh] = true
				flows = append(flows, f)
			}
		}
		flows[0].mustSend(Original, flagSYN, 0)
		flows[1].mustSend(Original, flagSYN, 0)
		flows[2].mustSend(Original, flagSYN, 0)
		if len(*events) != 1 || (*events)[0].Why != RemoveEvicted {
			t.Errorf("OnRemove %v, want one eviction", *events)
		}
		if _, ok := flows[2].info(); !ok {
			t.Error("new flow not inserted")
		}
		mustCheck(t, tab)
	})
}

// TestConfirmJoin: two New results for one tuple (two goroutines racing on a
// SYN and its retransmission): the second Confirm joins the first's entry.
func TestConfirmJoin(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	pkt := tcpPacket(f.seg(Original, flagSYN, 0))
	r1 := tab.Classify(pkt, Original)
	r2 := tab.Classify(pkt, Original)
	if r1.Verdict != New || r2.Verdict != New {
		t.Fatalf("%v %v", r1.Verdict, r2.Verdict)
	}
	if err := tab.Confirm(&r1); err != nil || r1.Verdict != New {
		t.Fatalf("first: %v %v", err, r1.Verdict)
	}
	if err := tab.Confirm(&r2); err != nil || r2.Verdict != Established {
		t.Fatalf("second: %v %v", err, r2.Verdict)
	}
	if err := tab.Confirm(&r2); !errors.Is(err, ErrNotNew) {
		t.Errorf("confirming an Established result: %v", err)
	}
	if s := tab.Stats(); s.Entries != 1 || s.Inserted != 1 || s.Joined != 1 {
		t.Errorf("stats %+v", s)
	}
	// UDP: the joining datagram is counted on the entry.
	u := udpPacket(client4, service4, 10, ipOpts{})
	u1, u2 := tab.Classify(u, Original), tab.Classify(u, Original)
	if tab.Confirm(&u1) != nil || tab.Confirm(&u2) != nil || u2.Verdict != Established {
		t.Fatalf("udp join: %v", u2.Verdict)
	}
	if i, _ := tab.Get(MakeTuple(UDP, client4, service4)); i.Packets[Original] != 2 {
		t.Errorf("udp packets %v", i.Packets)
	}
	// A Result that is not New is refused.
	var zero Result
	if err := tab.Confirm(&zero); !errors.Is(err, ErrNotNew) {
		t.Errorf("zero result: %v", err)
	}
	mustCheck(t, tab)
}

// TestFormat checks the conntrack -L lines exactly.
func TestFormat(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.handshake()
	if !tab.Bind(f.tuple(), &Binding{Endpoint: pod4, ServicePort: "default/web:http"}) {
		t.Fatal("Bind failed")
	}
	clk.Advance(3 * time.Second)
	i, _ := f.info()
	want := "tcp      6 86397 ESTABLISHED src=10.0.0.1 dst=10.96.0.10 sport=5555 dport=80 packets=2 bytes=80 " +
		"src=10.244.0.5 dst=10.0.0.1 sport=8080 dport=5555 packets=1 bytes=40 [ASSURED] mark=0 use=1"
	if got := i.String(); got != want {
		t.Errorf("tcp:\n got %s\nwant %s", got, want)
	}

	u := udpPacket(client4, netip.MustParseAddrPort("10.96.0.10:53"), 0, ipOpts{})
	r := tab.Classify(u, Original)
	if err := tab.Confirm(&r); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2500 * time.Millisecond)
	i, _ = tab.Get(r.Tuple)
	want = "udp      17 27 src=10.0.0.1 dst=10.96.0.10 sport=5555 dport=53 packets=1 bytes=28 [UNREPLIED] " +
		"src=10.96.0.10 dst=10.0.0.1 sport=53 dport=5555 packets=0 bytes=0 mark=0 use=1"
	if got := i.String(); got != want {
		t.Errorf("udp:\n got %s\nwant %s", got, want)
	}

	f6 := newFlow(t, tab, clk, client6, service6)
	f6.mustSend(Original, flagSYN, 0)
	i, _ = f6.info()
	want = "tcp      6 120 SYN_SENT src=fd00::1 dst=fd00:96::10 sport=5555 dport=80 packets=1 bytes=60 [UNREPLIED] " +
		"src=fd00:96::10 dst=fd00::1 sport=80 dport=5555 packets=0 bytes=0 mark=0 use=1"
	if got := i.String(); got != want {
		t.Errorf("tcp6:\n got %s\nwant %s", got, want)
	}
}

// TestBindListDelete covers Bind, Get, List and Delete with filters.
func TestBindListDelete(t *testing.T) {
	var deleted []string
	tab, clk := newTestTable(t, func(c *Config) {
		c.OnRemove = func(i EntryInfo, r RemoveReason) {
			if r != RemoveDeleted {
				t.Errorf("OnRemove reason %v", r)
			}
			deleted = append(deleted, i.Original.String()+" "+i.ServicePort)
		}
	})
	dns := netip.MustParseAddrPort("10.96.0.10:53")
	podA := netip.MustParseAddrPort("10.244.0.5:53")
	podB := netip.MustParseAddrPort("10.244.1.7:53")
	var udp []Tuple
	for p := uint16(1000); p < 1006; p++ {
		r := tab.Classify(udpPacket(netip.AddrPortFrom(client4.Addr(), p), dns, 10, ipOpts{}), Original)
		if err := tab.Confirm(&r); err != nil {
			t.Fatal(err)
		}
		ep := podA
		if p%2 == 1 {
			ep = podB
		}
		if !tab.Bind(r.Tuple, &Binding{Endpoint: ep, ServicePort: "kube-system/kube-dns:dns"}) {
			t.Fatal("Bind failed")
		}
		udp = append(udp, r.Tuple)
	}
	tcp := newFlow(t, tab, clk, client4, service4)
	tcp.handshake()
	tab.Bind(tcp.tuple(), &Binding{Endpoint: netip.AddrPortFrom(netip.AddrFrom16(podA.Addr().As16()), 80), ServicePort: "default/web:http"}) // 4in6 is unmapped
	tcp6 := newFlow(t, tab, clk, client6, service6)
	tcp6.mustSend(Original, flagSYN, 0)

	if tab.Bind(MakeTuple(TCP, client4, pod4), &Binding{Endpoint: pod4, ServicePort: "x"}) {
		t.Error("Bind of an unknown tuple succeeded")
	}
	if i, _ := tab.Get(tcp.tuple()); i.Endpoint.Addr() != podA.Addr() || i.Reply().Src().Addr() != podA.Addr() {
		t.Errorf("endpoint %v reply %v", i.Endpoint, i.Reply())
	}

	ids := func(list []EntryInfo) []string {
		var s []string
		for _, i := range list {
			s = append(s, i.Original.String())
		}
		slices.Sort(s)
		return s
	}
	tuples := func(ts ...Tuple) []string {
		var s []string
		for _, t := range ts {
			s = append(s, t.String())
		}
		slices.Sort(s)
		return s
	}
	for _, c := range []struct {
		name string
		f    Filter
		want []string
	}{
		{"all", Filter{}, tuples(append(slices.Clone(udp), tcp.tuple(), tcp6.tuple())...)},
		{"tcp", Filter{Protocol: TCP}, tuples(tcp.tuple(), tcp6.tuple())},
		{"udp to dns", Filter{Protocol: UDP, Dst: dns.Addr(), DstPort: 53}, tuples(udp...)},
		{"endpoint B", Filter{Endpoint: podB.Addr()}, tuples(udp[1], udp[3], udp[5])},
		{"endpoint A port 80", Filter{Endpoint: podA.Addr(), EndpointPort: 80}, tuples(tcp.tuple())},
		{"service port", Filter{ServicePort: "default/web:http"}, tuples(tcp.tuple())},
		{"source port", Filter{SrcPort: 1002}, tuples(udp[2])},
		{"v6 source", Filter{Src: client6.Addr()}, tuples(tcp6.tuple())},
		{"nothing", Filter{Protocol: UDP, ServicePort: "default/web:http"}, nil},
	} {
		if diff := cmp.Diff(c.want, ids(tab.List(c.f))); diff != "" {
			t.Errorf("List %s (-want +got):\n%s", c.name, diff)
		}
	}

	// UDP cleanup when endpoint B goes away: its flows are deleted.
	if n := tab.Delete(Filter{Protocol: UDP, Endpoint: podB.Addr()}); n != 3 {
		t.Errorf("Delete removed %d, want 3", n)
	}
	if len(deleted) != 3 || !strings.HasSuffix(deleted[0], "kube-system/kube-dns:dns") {
		t.Errorf("OnRemove got %v", deleted)
	}
	// The next datagram of a deleted flow is New again.
	if r := tab.Classify(udpPacket(netip.AddrPortFrom(client4.Addr(), 1001), dns, 10, ipOpts{}), Original); r.Verdict != New {
		t.Errorf("after Delete: %v", r.Verdict)
	}
	s := tab.Stats()
	if s.Entries != 5 || s.EntriesUDP != 3 || s.EntriesTCP != 2 || s.Deleted != 3 || tab.Len() != 5 {
		t.Errorf("stats %+v len %d", s, tab.Len())
	}
	if n := tab.Delete(Filter{}); n != 5 || tab.Len() != 0 {
		t.Errorf("flush removed %d, left %d", n, tab.Len())
	}
	mustCheck(t, tab)
}

// TestListSkipsExpired: List and Get hide entries whose time has passed even
// before Sweep reclaims them.
func TestListSkipsExpired(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	r := tab.Classify(udpPacket(client4, service4, 1, ipOpts{}), Original)
	if err := tab.Confirm(&r); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second)
	if l := tab.List(Filter{}); len(l) != 0 {
		t.Errorf("List returned expired %v", l)
	}
	if tab.Len() != 1 {
		t.Errorf("Len %d before Sweep", tab.Len())
	}
	if tab.Bind(r.Tuple, &Binding{Endpoint: pod4, ServicePort: "x"}) {
		t.Error("Bind on an expired entry")
	}
}

func TestStrings(t *testing.T) {
	for r := ReasonNone; r < NumReasons; r++ {
		s := r.String()
		if s == "" || strings.ContainsAny(s, " -") || strings.ToLower(s) != s || strings.HasPrefix(s, "reason_") {
			t.Errorf("Reason(%d) = %q is not a label", r, s)
		}
	}
	got := []string{
		New.String(), Established.String(), Related.String(), Invalid.String(),
		Original.String(), Reply.String(), TCP.String(), UDP.String(), ICMP.String(), ICMPv6.String(), Protocol(47).String(),
		TCPSynSent2.String(), TCPState(42).String(), (StatusSeenReply | StatusAssured).String(),
		RemoveExpired.String(), RemoveEvicted.String(), RemoveDeleted.String(), RemoveKilled.String(), RemoveReopened.String(),
		Tuple{}.String(), MakeTuple(UDP, client4, service4).String(), MakeTuple(TCP, client4, service6).String(),
	}
	want := []string{
		"new", "established", "related", "invalid", "original", "reply", "tcp", "udp", "icmp", "icmpv6", "47",
		"SYN_SENT2", "STATE_42", "SEEN_REPLY|ASSURED", "expired", "evicted", "deleted", "killed", "reopened",
		"invalid", "udp 10.0.0.1:5555->10.96.0.10:80", "invalid",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// DeleteFlow removes one flow's entry, and with an owner only the entry
// bound to that owner.
func TestDeleteFlow(t *testing.T) {
	var removed []uint64
	tab, err := NewTable(Config{Clock: NewManualClock(0), OnRemove: func(i EntryInfo, why RemoveReason) {
		if why != RemoveDeleted {
			t.Errorf("removal reason %v, want deleted", why)
		}
		removed = append(removed, i.ID)
	}})
	if err != nil {
		t.Fatal(err)
	}
	flow := func(port uint16) Tuple {
		return MakeTuple(UDP, netip.AddrPortFrom(client4.Addr(), port), service4)
	}
	for _, port := range []uint16{1000, 1001} {
		r := tab.Classify(udpPacket(netip.AddrPortFrom(client4.Addr(), port), service4, 1, ipOpts{}), Original)
		if err := tab.Confirm(&r); err != nil || r.Verdict != New {
			t.Fatalf("confirm: %v %v", err, r.Verdict)
		}
	}
	mine, other := new(int), new(int)
	tab.Bind(flow(1001), &Binding{Endpoint: pod4, Owner: mine})
	if tab.DeleteFlow(flow(1001), other) {
		t.Error("DeleteFlow removed an entry bound to another owner")
	}
	if !tab.DeleteFlow(flow(1001), mine) || !tab.DeleteFlow(flow(1000), nil) {
		t.Error("DeleteFlow did not remove the entries")
	}
	if tab.DeleteFlow(flow(1000), nil) || tab.Len() != 0 || len(removed) != 2 {
		t.Errorf("after deleting both: len %d, %d removals", tab.Len(), len(removed))
	}
}

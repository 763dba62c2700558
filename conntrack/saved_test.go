package conntrack

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestSaveRestore: an entry saved from one table and restored in another
// (a new process, its clock on another origin) goes on as it would have:
// the next in-window segments are ESTABLISHED, one far outside the window
// INVALID as the old table would find it, the flow's end moves it to
// TIME_WAIT, and a UDP entry keeps its status and what was left of its
// timeout.
func TestSaveRestore(t *testing.T) {
	a, clkA := newTestTable(t, nil)
	b, clkB := newTestTable(t, nil)
	clkB.Advance(37 * time.Hour) // another origin
	f := newFlow(t, a, clkA, netip.MustParseAddrPort("10.0.0.7:40000"), netip.MustParseAddrPort("10.96.0.10:80"))
	f.synOpt = [2][]byte{cat(tcpOptWScale(7), tcpOptSackPerm()), cat(tcpOptWScale(7), tcpOptSackPerm())}
	f.handshake()
	f.mustSend(Original, flagACK|flagPSH, 500)
	f.mustSend(Reply, flagACK, 0)
	clkA.Advance(10 * time.Second)
	s, ok := a.Save(f.tuple())
	if !ok {
		t.Fatal("Save: no entry")
	}
	if err := b.Restore(s); err != nil {
		t.Fatal(err)
	}
	ia, _ := a.Get(f.tuple())
	f.tab, f.clk = b, clkB
	ib, ok := f.info()
	if !ok || ib.State != TCPEstablished || ib.Status != ia.Status || ib.Timeout != ia.Timeout || ib.Age != ia.Age || ib.Packets != ia.Packets {
		t.Fatalf("restored %+v; saved from %+v", ib, ia)
	}
	if err := b.Restore(s); err != ErrTracked {
		t.Fatalf("restoring a live tuple again: %v", err)
	}
	// A segment far outside the window: INVALID in both tables.
	far := f.seg(Original, flagACK, 100)
	far.seq += 1 << 30
	for name, tab := range map[string]*Table{"old": a, "restored": b} {
		if r := tab.Classify(tcpPacket(far), Original); r.Verdict != Invalid {
			t.Fatalf("%s table: a segment outside the window is %v", name, r.Verdict)
		}
	}
	f.mustSend(Original, flagACK|flagPSH, 1000)
	f.mustSend(Reply, flagACK|flagPSH, 3000)
	f.mustSend(Original, flagACK|flagFIN, 0)
	f.mustSend(Reply, flagACK|flagFIN, 0)
	f.mustSend(Original, flagACK, 0)
	if i, _ := f.info(); i.State != TCPTimeWait {
		t.Fatalf("after both FINs: %v", i.State)
	}

	u := MakeTuple(UDP, netip.MustParseAddrPort("10.0.0.7:5353"), netip.MustParseAddrPort("10.96.0.10:53"))
	if err := a.Track(u); err != nil {
		t.Fatal(err)
	}
	clkA.Advance(5 * time.Second)
	su, _ := a.Save(u)
	if err := b.Restore(su); err != nil {
		t.Fatal(err)
	}
	iu, _ := b.Get(u)
	if iu.Timeout != su.Timeout {
		t.Fatalf("UDP timeout %v after restore, %v left when saved", iu.Timeout, su.Timeout)
	}
	clkB.Advance(su.Timeout)
	b.Sweep()
	if _, ok := b.Get(u); ok {
		t.Fatal("the restored UDP entry outlived its timeout")
	}
}

// TestRestoreRefuses: saves out of range are refused with the field named;
// nothing is inserted.
func TestRestoreRefuses(t *testing.T) {
	a, clkA := newTestTable(t, nil)
	f := newFlow(t, a, clkA, netip.MustParseAddrPort("10.0.0.7:40000"), netip.MustParseAddrPort("10.96.0.10:80"))
	f.handshake()
	good, _ := a.Save(f.tuple())
	b, _ := newTestTable(t, nil)
	for _, c := range []struct {
		name, want string
		mod        func(s *Saved)
	}{
		{"no tuple", "tuple", func(s *Saved) { s.Original = Tuple{} }},
		{"expired", "timeout", func(s *Saved) { s.Timeout = 0 }},
		{"idle longer than alive", "idle", func(s *Saved) { s.Idle = s.Age + time.Second }},
		{"state past the last", "state", func(s *Saved) { s.TCP[SavedTCPLen-6] = 200 }},
		{"state none", "state", func(s *Saved) { s.TCP[SavedTCPLen-6] = 0 }},
		{"window scale", "scale", func(s *Saved) { s.TCP[16] = 15 }},
		{"direction", "direction", func(s *Saved) { s.TCP[SavedTCPLen-5] = 2 }},
	} {
		s := good
		c.mod(&s)
		if err := b.Restore(s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error naming %q", c.name, err, c.want)
		}
	}
	if b.Len() != 0 {
		t.Fatalf("%d entries after refusals", b.Len())
	}
}

// FuzzRestore: any saved TCP state that Restore accepts, then any segment
// of the flow either way: the table classifies without panicking, and an
// accepted state reads back as saved.
func FuzzRestore(f *testing.F) {
	a, clkA := newTestTable(f, nil)
	fl := newFlow(f, a, clkA, netip.MustParseAddrPort("10.0.0.7:40000"), netip.MustParseAddrPort("10.96.0.10:80"))
	fl.handshake()
	good, _ := a.Save(fl.tuple())
	f.Add(good.TCP[:], uint32(0), uint8(flagACK), uint16(100), false)
	f.Fuzz(func(t *testing.T, state []byte, seq uint32, flags uint8, payload uint16, reply bool) {
		s := good
		copy(s.TCP[:], state)
		b, clk := newTestTable(t, nil)
		if err := b.Restore(s); err != nil {
			return
		}
		if back, ok := b.Save(s.Original); !ok || back.TCP != s.TCP {
			t.Fatalf("restored state reads back as %x, saved %x", back.TCP, s.TCP)
		}
		g := newFlow(t, b, clk, fl.c, fl.s)
		dir := Original
		if reply {
			dir = Reply
		}
		seg := g.seg(dir, flags, int(payload%1500))
		seg.seq += seq
		seg.ack += seq * 7
		b.Classify(tcpPacket(seg), dir)
	})
}

package conntrack

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

// TestTrackedFlows: a flow the table sees no packets of is listed as
// ESTABLISHED and ASSURED, counts as active for a bound Counter, lives as
// long as it is touched, and leaves by timeout or DeleteFlow with OnRemove.
func TestTrackedFlows(t *testing.T) {
	var removed []RemoveReason
	tab, clk := newTestTable(t, func(c *Config) {
		c.OnRemove = func(_ EntryInfo, why RemoveReason) { removed = append(removed, why) }
	})
	nodePort := netip.MustParseAddrPort("127.0.0.1:30080")
	client := netip.MustParseAddrPort("127.0.0.1:50000")
	tcp := MakeTuple(TCP, client, nodePort)
	udp := MakeTuple(UDP, client, nodePort)
	for _, tu := range []Tuple{tcp, udp} {
		if err := tab.Track(tu); err != nil {
			t.Fatal(err)
		}
	}
	if err := tab.Track(tcp); !errors.Is(err, ErrTracked) {
		t.Fatalf("second Track: %v", err)
	}
	rec := &recorder{t: t, inactive: 1}
	if !tab.Bind(tcp, &Binding{Endpoint: pod4, ServicePort: "ns/np:http", Counter: rec}) || rec.active != 1 {
		t.Fatalf("Bind: active %d", rec.active)
	}
	i, ok := tab.Get(tcp)
	if !ok || i.State != TCPEstablished || i.Status&StatusAssured == 0 || i.Timeout != DefaultTimeouts().TCPEstablished {
		t.Fatalf("tracked TCP entry %+v", i)
	}
	// A UDP flow starts as its first datagram would: unreplied, 30 s, not
	// ASSURED; a reply more than 2 s in makes it a stream (udpPacket).
	if u, ok := tab.Get(udp); !ok || u.Timeout != DefaultTimeouts().UDP || u.Status != 0 {
		t.Fatalf("tracked UDP entry %+v", u)
	}
	clk.Advance(DefaultTimeouts().UDP - 1)
	if !tab.Touch(udp, Original, nil) {
		t.Fatal("Touch: gone")
	}
	if u, _ := tab.Get(udp); u.Timeout != DefaultTimeouts().UDP || u.Status != 0 {
		t.Fatalf("after a datagram from the client: %+v", u)
	}
	tab.Touch(udp, Reply, nil)
	if u, _ := tab.Get(udp); u.Timeout != DefaultTimeouts().UDPStream || u.Status != StatusSeenReply|StatusAssured {
		t.Fatalf("after a reply: %+v", u)
	}
	clk.Advance(DefaultTimeouts().UDPStream - 1)
	if tab.Sweep() != 0 {
		t.Fatal("a touched entry expired")
	}
	clk.Advance(1)
	if tab.Sweep() != 1 || tab.Touch(udp, Reply, nil) {
		t.Fatal("the UDP entry did not expire a timeout after its last touch")
	}
	if !tab.DeleteFlow(tcp, nil) || rec.removed != 1 || len(removed) != 2 {
		t.Fatalf("DeleteFlow: removed %d, OnRemove %v", rec.removed, removed)
	}
	mustCheck(t, tab)
}

// TestReopenTrackedFlow: the host's kernel accepted a new connection on a
// 4-tuple whose old flow has not yet deleted its entry (its socket in
// TIME_WAIT, tcp_timewait_state_process's TCP_TW_SYN). Reopen replaces the
// old entry as the kernel's conntrack replaces a reopened TIME_WAIT entry:
// OnRemove says reopened and names the old owner, the old Counter is told
// Removed, the old owner's DeleteFlow and Touch leave the new entry alone.
// An entry not yet bound (its front end still setting up) is not replaced,
// and a UDP tuple is still refused while live.
func TestReopenTrackedFlow(t *testing.T) {
	type removal struct {
		why   RemoveReason
		owner any
	}
	var removed []removal
	tab, clk := newTestTable(t, func(c *Config) {
		c.OnRemove = func(i EntryInfo, why RemoveReason) { removed = append(removed, removal{why, i.Owner}) }
	})
	nodePort := netip.MustParseAddrPort("127.0.0.1:30080")
	client := netip.MustParseAddrPort("127.0.0.1:50000")
	tcp := MakeTuple(TCP, client, nodePort)
	if err := tab.Reopen(tcp); err != nil { // nothing to reopen: Track
		t.Fatal(err)
	}
	if err := tab.Reopen(tcp); !errors.Is(err, ErrTracked) || len(removed) != 0 {
		t.Fatalf("Reopen over an unbound entry: %v, OnRemove %v; want ErrTracked and nothing removed", err, removed)
	}
	oldOwner := new(int)
	rec := &recorder{t: t, inactive: 1}
	if !tab.Bind(tcp, &Binding{Endpoint: pod4, ServicePort: "ns/np:http", Counter: rec, Owner: oldOwner}) {
		t.Fatal("Bind")
	}
	old, _ := tab.Get(tcp)
	if err := tab.Reopen(tcp); err != nil {
		t.Fatalf("Reopen over a live entry: %v", err)
	}
	if len(removed) != 1 || removed[0].why != RemoveReopened || removed[0].owner != oldOwner || rec.removed != 1 {
		t.Fatalf("OnRemove %v, Counter removed %d; want one reopened removal of the old owner", removed, rec.removed)
	}
	i, ok := tab.Get(tcp)
	if !ok || i.ID == old.ID || i.Owner != nil || i.State != TCPEstablished || i.Status&StatusAssured == 0 {
		t.Fatalf("after Reopen: %+v present %v, want a fresh unbound ESTABLISHED entry", i, ok)
	}
	if tab.Touch(tcp, Original, oldOwner) {
		t.Fatal("the old owner's Touch refreshed the new entry")
	}
	newOwner := new(int)
	if !tab.Bind(tcp, &Binding{Endpoint: pod4, ServicePort: "ns/np:http", Owner: newOwner}) {
		t.Fatal("Bind the new flow")
	}
	clk.Advance(time.Hour)
	if tab.Touch(tcp, Reply, oldOwner) {
		t.Fatal("the old owner's Touch refreshed the newer flow's entry")
	}
	if i, _ := tab.Get(tcp); i.Timeout != DefaultTimeouts().TCPEstablished-time.Hour {
		t.Fatalf("timeout %v after a foreign Touch, want it left at %v", i.Timeout, DefaultTimeouts().TCPEstablished-time.Hour)
	}
	if !tab.Touch(tcp, Reply, newOwner) {
		t.Fatal("the owner's own Touch failed")
	}
	if i, _ := tab.Get(tcp); i.Timeout != DefaultTimeouts().TCPEstablished {
		t.Fatalf("timeout %v after the owner's Touch, want %v", i.Timeout, DefaultTimeouts().TCPEstablished)
	}
	if tab.DeleteFlow(tcp, oldOwner) {
		t.Fatal("the old owner's DeleteFlow removed the new entry")
	}
	if s := tab.Stats(); s.Killed != 1 || s.Entries != 1 {
		t.Fatalf("stats %+v, want one killed and one entry", s)
	}
	udp := MakeTuple(UDP, client, nodePort)
	if err := tab.Reopen(udp); err != nil {
		t.Fatal(err)
	}
	if err := tab.Reopen(udp); !errors.Is(err, ErrTracked) {
		t.Fatalf("Reopen of a live UDP flow: %v, want ErrTracked", err)
	}
	mustCheck(t, tab)
}

package conntrack

import (
	"errors"
	"net/netip"
	"testing"
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
	if !tab.Touch(udp, Original) {
		t.Fatal("Touch: gone")
	}
	if u, _ := tab.Get(udp); u.Timeout != DefaultTimeouts().UDP || u.Status != 0 {
		t.Fatalf("after a datagram from the client: %+v", u)
	}
	tab.Touch(udp, Reply)
	if u, _ := tab.Get(udp); u.Timeout != DefaultTimeouts().UDPStream || u.Status != StatusSeenReply|StatusAssured {
		t.Fatalf("after a reply: %+v", u)
	}
	clk.Advance(DefaultTimeouts().UDPStream - 1)
	if tab.Sweep() != 0 {
		t.Fatal("a touched entry expired")
	}
	clk.Advance(1)
	if tab.Sweep() != 1 || tab.Touch(udp, Reply) {
		t.Fatal("the UDP entry did not expire a timeout after its last touch")
	}
	if !tab.DeleteFlow(tcp, nil) || rec.removed != 1 || len(removed) != 2 {
		t.Fatalf("DeleteFlow: removed %d, OnRemove %v", rec.removed, removed)
	}
	mustCheck(t, tab)
}

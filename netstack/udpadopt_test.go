package netstack

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/userproxy/userproxy/conntrack"
)

// An adopted UDP flow, with no gVisor endpoint behind it, gets the
// client's datagrams through its bypass and answers from the service
// address through the gate; a reply past the MTU is dropped, and after
// Close every reply fails.
func TestAdoptUDP(t *testing.T) {
	st, link, ct := newTestStack(t, accept)
	client, svc := netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.53:53")
	tuple := conntrack.MakeTuple(conntrack.UDP, client, svc)
	if _, err := st.AdoptUDP(conntrack.MakeTuple(conntrack.TCP, client, svc)); err == nil {
		t.Error("a TCP tuple adopted as a UDP flow")
	}
	// The entry the previous process saved, restored.
	if err := ct.Restore(conntrack.Saved{Original: tuple, Status: conntrack.StatusSeenReply, Age: 3 * time.Second, Idle: time.Second, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
	r, err := st.AdoptUDP(tuple)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tuple() != tuple || r.Client() != client || r.Service() != svc || r.Conn != nil {
		t.Fatalf("request %v, %v -> %v, Conn %v", r.Tuple(), r.Client(), r.Service(), r.Conn)
	}
	got := make(chan string, 4)
	stop := r.Forward(func(p []byte) { got <- string(p) })
	defer stop()
	link.Inject(udpDatagram(client, svc, []byte("question")))
	select {
	case p := <-got:
		if p != "question" {
			t.Fatalf("forwarded %q", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client's datagram did not reach the adopted flow")
	}
	if err := r.Reply([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p := link.Read(ctx)
	if p == nil {
		t.Fatal("no reply on the link")
	}
	checkUDPReply(t, p, svc, client, len("answer"))
	if err := r.Reply(make([]byte, link.MTU())); !errors.Is(err, ErrReplyDropped) {
		t.Errorf("a reply past the MTU: %v, want ErrReplyDropped", err)
	}
	_ = r.Close()
	if err := r.Reply([]byte("late")); err == nil || errors.Is(err, ErrReplyDropped) {
		t.Errorf("Reply after Close: %v, want an error that ends the flow", err)
	}
}

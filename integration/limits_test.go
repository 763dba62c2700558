package integration

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
)

// echoLines answers each line with the line.
func echoLines(c net.Conn) {
	rd := bufio.NewReader(c)
	for {
		l, err := rd.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := c.Write([]byte(l)); err != nil {
			return
		}
	}
}

// roundTrip sends a line and expects it back.
func roundTrip(c net.Conn, rd *bufio.Reader, msg string) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return err
	}
	got, err := rd.ReadString('\n')
	if err != nil {
		return err
	}
	if got != msg+"\n" {
		return fmt.Errorf("got %q", got)
	}
	return nil
}

// A full conntrack table refuses new flows (counted as table full) and never
// touches the established ones: their entries are ASSURED, which early drop
// spares, as the kernel's does.
func TestLimitConntrackTableFull(t *testing.T) {
	link := netstack.NewMemoryLink(0, 64)
	h := newRigWith(t, &link.Link, 1, rigLimits{conntrackMax: 4})
	cl := &inProcessClient{r: h, link: link}
	be := startTCPBackend(t, "127.0.0.1", echoLines)
	h.addService("web", "10.96.0.10", v1.ProtocolTCP, 80, false, be.addr)

	var streams []net.Conn
	var readers []*bufio.Reader
	for i := range 4 {
		c, err := cl.dial("tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		defer c.Close()
		rd := bufio.NewReader(c)
		if err := roundTrip(c, rd, "hello"); err != nil {
			t.Fatal(err)
		}
		streams, readers = append(streams, c), append(readers, rd)
	}
	// The table is full of ASSURED flows: the fifth is refused.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c, err := h.st.DialContext(ctx, "tcp", "10.96.0.10:80"); err == nil {
		c.Close()
		t.Fatal("a flow beyond --conntrack-max was admitted")
	}
	if n := h.ct.Stats().TableFull; n == 0 {
		t.Error("the refusal is not counted in conntrack's TableFull")
	}
	if n := h.st.Stats().TableFull; n == 0 {
		t.Error("the refusal is not counted by the gate")
	}
	for i, c := range streams {
		if err := roundTrip(c, readers[i], "still here"); err != nil {
			t.Fatalf("established stream %d harmed by the full table: %v", i, err)
		}
	}
}

// Over the UDP session limit a new flow is refused (counted as table_full);
// the flows within the limit keep working.
func TestLimitUDPSessions(t *testing.T) {
	link := netstack.NewMemoryLink(0, 64)
	h := newRigWith(t, &link.Link, 1, rigLimits{udpSessions: 2})
	cl := &inProcessClient{r: h, link: link}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := serveUDP(t, pc, func(b []byte) []byte { return b })
	h.addService("dns", "10.96.0.53", v1.ProtocolUDP, 53, false, ep)
	svc := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("10.96.0.53:53"))
	ask := func(c net.PacketConn) error {
		if _, err := c.WriteTo([]byte("q"), svc); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _, err := c.ReadFrom(make([]byte, 16))
		return err
	}
	var flows []net.PacketConn
	for range 3 {
		c, err := cl.listenPacket("udp4")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		flows = append(flows, c)
	}
	for i := range 2 {
		if err := ask(flows[i]); err != nil {
			t.Fatalf("flow %d within the limit: %v", i, err)
		}
	}
	if err := ask(flows[2]); err == nil {
		t.Fatal("a third UDP flow got through a limit of two sessions")
	}
	if got := h.px.Stats().Flows[1][proxy.ResultTableFull]; got == 0 {
		t.Error("the refused UDP flow is not counted as table_full")
	}
	for i := range 2 {
		if err := ask(flows[i]); err != nil {
			t.Fatalf("flow %d within the limit harmed: %v", i, err)
		}
	}
}

// A SYN flood from one client address fills only that client's share of
// the in-flight handshakes: another client still connects.
func TestLimitInFlightPerClient(t *testing.T) {
	link := netstack.NewMemoryLink(0, 1024)
	h := newRigWith(t, &link.Link, 1, rigLimits{inFlight: 64, inFlightPerClient: 8})
	cl := &inProcessClient{r: h, link: link}
	// The flooder never ACKs our SYN-ACKs, so its handshakes stay in flight
	// (until HandshakeTimeout).
	be := startTCPBackend(t, "127.0.0.1", echoLines)
	h.addService("web", "10.96.0.10", v1.ProtocolTCP, 80, false, be.addr)
	flooder := netip.MustParseAddr("192.0.2.66")
	for i := range 200 {
		link.Inject(tcpSegment(flooder, uint16(10000+i), netip.MustParseAddr("10.96.0.10"), 80, 0x02, uint32(i)*7919, 0))
	}
	waitFor(t, "the flood to hit the per-client limit", func() bool { return h.st.Stats().InFlightLimited > 0 })
	c, err := cl.dial("tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatalf("another client during the flood: %v (stats %+v)", err, h.st.Stats())
	}
	defer c.Close()
	if err := roundTrip(c, bufio.NewReader(c), "ok"); err != nil {
		t.Fatal(err)
	}
	if s := h.st.Stats(); s.TCPInFlight > 8+1 {
		t.Errorf("%d handshakes in flight; one client's share is 8", s.TCPInFlight)
	}
}

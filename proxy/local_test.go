package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// echoHandler answers each line (TCP) or datagram (UDP) with "local:" and
// the input.
type echoHandler struct{}

func (echoHandler) ServeTCP(c net.Conn) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if _, err := io.WriteString(c, "local:"+line); err != nil {
			return
		}
	}
}

func (echoHandler) ServeUDP(c net.Conn) {
	buf := make([]byte, 512)
	for {
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		if _, err := c.Write(append([]byte("local:"), buf[:n]...)); err != nil {
			return
		}
	}
}

// localStack runs a proxy with a local handler at 10.96.0.10:53 behind an
// in-memory stack.
func localStack(t *testing.T) (*Proxy, *netstack.Stack, *service.Tracker) {
	t.Helper()
	p, tr, ct := newTestProxy(t)
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 256).Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	st.SetFlowHandler(p)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		p.Shutdown(ctx)
		cancel()
		st.Close()
	})
	p.SetLocal(netip.MustParseAddrPort("10.96.0.10:53"), echoHandler{})
	tr.OnSynced()
	return p, st, tr
}

// exchange sends msg to 10.96.0.10:53 on a new flow and returns the reply
// (waiting up to wait for it).
func exchange(t *testing.T, st *netstack.Stack, network, msg string, wait time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, network, "10.96.0.10:53")
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

// A local handler serves TCP and UDP at its address; a Service that claims
// the address on port 53 in either protocol takes over, and when it goes
// the handler serves again.
func TestLocalHandler(t *testing.T) {
	p, st, tr := localStack(t)
	for _, network := range []string{"tcp", "udp"} {
		if got, err := exchange(t, st, network, "hi\n", 3*time.Second); err != nil || got != "local:hi\n" {
			t.Fatalf("%s to the local address: %q, %v", network, got, err)
		}
	}
	if s := p.Stats(); s.Flows[0][ResultLocal] != 1 || s.Flows[1][ResultLocal] != 1 {
		t.Errorf("local flows counted %d TCP, %d UDP; want 1, 1", s.Flows[0][ResultLocal], s.Flows[1][ResultLocal])
	}
	// Other addresses are still refused.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if c, err := st.DialContext(ctx, "tcp", "10.96.0.11:53"); err == nil {
		c.Close()
		t.Fatal("a TCP connection to an address with no service nor local server was accepted")
	}

	// A UDP-only Service at 10.96.0.10:53 without endpoints: its verdict
	// (REJECT) applies to UDP, and TCP is refused too (the address is
	// the Service's now).
	kubeDNS := svc("kube-dns", "10.96.0.10", v1.ProtocolUDP, 53)
	tr.OnServiceAdd(kubeDNS)
	for _, network := range []string{"tcp", "udp"} {
		// A wrong answer would come within milliseconds in-process.
		if got, err := exchange(t, st, network, "hi\n", 300*time.Millisecond); err == nil {
			t.Fatalf("%s while a Service without endpoints owns the address: %q", network, got)
		}
	}
	// With an endpoint, UDP goes to it.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // the Service's endpoint: answers "svc:" and the datagram
		defer close(done)
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("svc:"), buf[:n]...), from)
		}
	}()
	defer func() { pc.Close(); <-done }()
	ep := pc.LocalAddr().(*net.UDPAddr).AddrPort()
	tr.OnEndpointSliceAdd(slice("kube-dns", "kube-dns-1", v1.ProtocolUDP, int32(ep.Port()), "", ep.Addr().String()))
	if got, err := exchange(t, st, "udp", "hi\n", 3*time.Second); err != nil || got != "svc:hi\n" {
		t.Fatalf("UDP while a Service with an endpoint owns the address: %q, %v", got, err)
	}
	// The Service goes: the local handler answers again.
	tr.OnServiceDelete(kubeDNS)
	for _, network := range []string{"tcp", "udp"} {
		if got, err := exchange(t, st, network, "again\n", 3*time.Second); err != nil || got != "local:again\n" {
			t.Fatalf("%s after the Service left: %q, %v", network, got, err)
		}
	}
}

// Admit's answers for flows to a local server's address.
func TestAdmitLocal(t *testing.T) {
	p, tr, _ := newTestProxy(t)
	p.SetLocal(netip.MustParseAddrPort("10.96.0.10:53"), echoHandler{})
	client := netip.MustParseAddrPort("192.0.2.1:5000")
	flow := func(proto conntrack.Protocol, dst string) conntrack.Tuple {
		return conntrack.MakeTuple(proto, client, netip.MustParseAddrPort(dst))
	}
	if got := p.Admit(flow(conntrack.UDP, "10.96.0.10:53")); got != netstack.Reject {
		t.Fatalf("before the first table: %v, want Reject", got)
	}
	tr.OnServiceAdd(svc("web", "10.96.0.10", v1.ProtocolTCP, 80)) // same IP, another port: no claim on :53
	tr.OnSynced()
	cases := []struct {
		name string
		flow conntrack.Tuple
		want netstack.Decision
	}{
		{"UDP to the local address", flow(conntrack.UDP, "10.96.0.10:53"), netstack.Accept},
		{"TCP to the local address", flow(conntrack.TCP, "10.96.0.10:53"), netstack.Accept},
		{"another port of the IP", flow(conntrack.UDP, "10.96.0.10:54"), netstack.Reject},
		{"another IP", flow(conntrack.UDP, "10.96.0.11:53"), netstack.Reject},
	}
	for _, c := range cases {
		if got := p.Admit(c.flow); got != c.want {
			t.Errorf("%s: Admit = %v, want %v", c.name, got, c.want)
		}
	}
	tr.OnServiceAdd(svc("kube-dns", "10.96.0.10", v1.ProtocolUDP, 53)) // no endpoints
	if got := p.Admit(flow(conntrack.TCP, "10.96.0.10:53")); got != netstack.Reject {
		t.Errorf("TCP to a local address a UDP Service claims: %v, want Reject", got)
	}
	p.SetLocal(netip.MustParseAddrPort("10.96.0.10:53"), nil)
	tr.OnServiceDelete(svc("kube-dns", "10.96.0.10", v1.ProtocolUDP, 53))
	if got := p.Admit(flow(conntrack.UDP, "10.96.0.10:53")); got != netstack.Reject {
		t.Errorf("after SetLocal(nil): %v, want Reject", got)
	}
}

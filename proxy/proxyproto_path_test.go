package proxy

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// frontEnds runs a proxy with both front ends: a stack over an in-memory
// link (the TUN's stand-in) and NodePorts on 127.0.0.1.
func frontEnds(t *testing.T) (*Proxy, *service.Tracker, *netstack.Stack, *NodePorts) {
	t.Helper()
	p, tr, ct := newTestProxyWith(t, Config{}, true)
	st, err := netstack.New(netstack.Options{Link: &netstack.NewMemoryLink(0, 256).Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	st.SetFlowHandler(p)
	np := p.NewNodePorts([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	t.Cleanup(func() {
		np.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		p.Shutdown(ctx)
		cancel()
		st.Close()
	})
	return p, tr, st, np
}

// The PROXY protocol on the datapath (issue 16): a Service annotated
// userproxy.io/proxy-protocol gets the header first on each endpoint
// connection, with the client's address and the destination it used, read
// by an endpoint that parses it as a receiver does (ppRead, written from
// the spec apart from the encoder).
func TestProxyProtocolOnTheDatapath(t *testing.T) {
	p, tr, st, np := frontEnds(t)
	epAddr, headers := ppEchoServer(t)
	epPort, _ := strconv.Atoi(epAddr[len("127.0.0.1:"):])
	nodePort := freePort(t)
	annotate := func(v string, nodePort int) func(*v1.Service) {
		return func(s *v1.Service) {
			s.Annotations = map[string]string{service.AnnotationProxyProtocol: v}
			if nodePort != 0 {
				s.Spec.Type = v1.ServiceTypeNodePort
				s.Spec.Ports[0].NodePort = int32(nodePort)
			}
		}
	}
	tr.OnServiceAdd(svc("v1", "10.96.0.1", v1.ProtocolTCP, 80, annotate("v1", 0)))
	tr.OnEndpointSliceAdd(slice("v1", "v1-1", v1.ProtocolTCP, int32(epPort), "", "127.0.0.1"))
	tr.OnServiceAdd(svc("v2", "10.96.0.2", v1.ProtocolTCP, 81, annotate("v2", nodePort)))
	tr.OnEndpointSliceAdd(slice("v2", "v2-1", v1.ProtocolTCP, int32(epPort), "", "127.0.0.1"))
	tr.OnSynced()
	np.Sync(p.Table())

	check := func(name string, c net.Conn, version int, proto string, dst string) {
		t.Helper()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "payload"); err != nil {
			t.Fatal(err)
		}
		var r ppResult
		select {
		case r = <-headers:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the endpoint got no connection", name)
		}
		want := ppHeader{version: version, command: 0x1, proto: proto,
			src: netip.MustParseAddrPort(c.LocalAddr().String()), dst: netip.MustParseAddrPort(dst)}
		want.length = 16 + 12 // v2 over IPv4: the fixed part and the address block
		if version == 1 {
			want.length = len("PROXY TCP4 " + want.src.Addr().String() + " " + want.dst.Addr().String() + " " +
				strconv.Itoa(int(want.src.Port())) + " " + strconv.Itoa(int(want.dst.Port())) + "\r\n")
		}
		if r.err != nil || r.h != want {
			t.Fatalf("%s: header %+v, %v; want %+v", name, r.h, r.err, want)
		}
		buf := make([]byte, len("payload"))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "payload" {
			t.Fatalf("%s: echo %q %v", name, buf, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "tcp", "10.96.0.1:80")
	if err != nil {
		t.Fatal(err)
	}
	check("ClusterIP, v1", c, 1, "TCP4", "10.96.0.1:80")
	c, err = st.DialContext(ctx, "tcp", "10.96.0.2:81")
	if err != nil {
		t.Fatal(err)
	}
	check("ClusterIP, v2", c, 2, "TCP4", "10.96.0.2:81")
	hc, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(nodePort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	check("NodePort, v2", hc, 2, "TCP4", "127.0.0.1:"+strconv.Itoa(nodePort))
}

// TestProxyProtocolUDPDatagrams: under v2 each datagram of a UDP flow
// starts with the header (a header alone would be a datagram of its own),
// on the TUN path and through a NodePort.
func TestProxyProtocolUDPDatagrams(t *testing.T) {
	p, tr, st, np := frontEnds(t)
	// The endpoint parses each datagram's header and answers "ok <src> <dst> <payload>".
	ep, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := ep.ReadFrom(buf)
			if err != nil {
				return
			}
			h, err := ppParse(buf[:n])
			reply := "bad header: " + errString(err)
			if err == nil {
				reply = "ok " + h.proto + " " + h.src.String() + " " + h.dst.String() + " " + string(buf[h.length:n])
			}
			_, _ = ep.WriteTo([]byte(reply), from)
		}
	}()
	t.Cleanup(func() { ep.Close(); <-done })
	nodePort := freePort(t)
	tr.OnServiceAdd(svc("dns", "10.96.0.53", v1.ProtocolUDP, 53, func(s *v1.Service) {
		s.Annotations = map[string]string{service.AnnotationProxyProtocol: "v2"}
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(nodePort)
	}))
	tr.OnEndpointSliceAdd(slice("dns", "dns-1", v1.ProtocolUDP, int32(ep.LocalAddr().(*net.UDPAddr).Port), "", "127.0.0.1"))
	tr.OnSynced()
	np.Sync(p.Table())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tunConn, err := st.DialContext(ctx, "udp", "10.96.0.53:53")
	if err != nil {
		t.Fatal(err)
	}
	hostConn, err := net.Dial("udp", "127.0.0.1:"+strconv.Itoa(nodePort))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		c    net.Conn
		dst  string
	}{{"TUN", tunConn, "10.96.0.53:53"}, {"NodePort", hostConn, "127.0.0.1:" + strconv.Itoa(nodePort)}} {
		defer tc.c.Close()
		_ = tc.c.SetDeadline(time.Now().Add(5 * time.Second))
		for _, msg := range []string{"q1", "q2"} {
			if _, err := io.WriteString(tc.c, msg); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 512)
			n, err := tc.c.Read(buf)
			want := "ok UDP4 " + tc.c.LocalAddr().String() + " " + tc.dst + " " + msg
			if err != nil || string(buf[:n]) != want {
				t.Fatalf("%s: %q %v, want %q", tc.name, buf[:n], err, want)
			}
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

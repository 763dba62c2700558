package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
)

// The PROXY protocol through the real binary on a real TUN (issue 16): an
// endpoint reads the header with go-proxyproto, a PROXY protocol library
// written apart from ours, and must find the client's address and port and
// the destination the client used, for v1 and v2, over a ClusterIP and a
// NodePort.

type ppSeen struct {
	h   *proxyproto.Header
	err error
}

// ppEndpoint listens in the namespace and reports each connection's header,
// then echoes one line.
func ppEndpoint(t *testing.T, b *binNS) (int, <-chan ppSeen) {
	var ln net.Listener
	if err := b.c.run(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	seen := make(chan ppSeen, 4)
	serveTCP(t, ln, func(c net.Conn) {
		r := bufio.NewReader(c)
		h, err := proxyproto.Read(r)
		seen <- ppSeen{h, err}
		if err == nil {
			line, _ := r.ReadString('\n')
			_, _ = io.WriteString(c, line)
		}
	})
	return ln.Addr().(*net.TCPAddr).Port, seen
}

func TestBinaryProxyProtocol(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	port, seen := ppEndpoint(t, b)
	const nodePort = 30090
	cfg := filepath.Join(t.TempDir(), "pp.yaml")
	// svc is a Service with the given header version; nodePort adds a
	// NodePort to it.
	svc := func(name, ip, version string, nodePort int) string {
		typ, np := "ClusterIP", ""
		if nodePort != 0 {
			typ, np = "NodePort", fmt.Sprintf(", nodePort: %d", nodePort)
		}
		return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default, annotations: {userproxy.io/proxy-protocol: %s}}
spec:
  clusterIP: %s
  type: %s
  ports: [{name: http, protocol: TCP, port: 80%s}]
`, name, version, ip, typ, np) + sliceYAML(name+"-1", name, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port)), "")
	}
	writeFile(t, cfg, svc("pp1", "10.96.0.51", "v1", 0)+svc("pp2", "10.96.0.52", "v2", nodePort))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxpp0",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "info")
	b.waitHealthy(p)

	for _, tc := range []struct {
		name    string
		dst     string
		version byte
	}{
		{"ClusterIP, v1", "10.96.0.51:80", 1},
		{"ClusterIP, v2", "10.96.0.52:80", 2},
		{"NodePort, v2", fmt.Sprintf("127.0.0.1:%d", nodePort), 2},
	} {
		c, err := b.c.dial("tcp", tc.dst)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "hello\n"); err != nil {
			t.Fatal(err)
		}
		var s ppSeen
		select {
		case s = <-seen:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the endpoint got no connection", tc.name)
		}
		if s.err != nil || s.h.Version != tc.version || s.h.Command != proxyproto.PROXY ||
			s.h.SourceAddr.String() != c.LocalAddr().String() || s.h.DestinationAddr.String() != tc.dst {
			t.Fatalf("%s: header %+v (%v); want v%d PROXY from %s to %s", tc.name, s.h, s.err, tc.version, c.LocalAddr(), tc.dst)
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || line != "hello\n" {
			t.Fatalf("%s: after the header: %q %v", tc.name, line, err)
		}
		t.Logf("%s: v%d %s -> %s", tc.name, s.h.Version, s.h.SourceAddr, s.h.DestinationAddr)
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

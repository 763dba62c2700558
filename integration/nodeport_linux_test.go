package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// NodePorts through the real binary (issue 16): served on loopback by
// default, IPv4 and IPv6, listed by `conntrack list` with the address the
// client used; a NodePort taken on the host is reported on /healthz and in
// the metrics while the other NodePorts are served.

func nodePortConfig(ep4, ep6 netip.AddrPort, np, clash int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: np, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.40
  clusterIPs: [10.96.0.40, "fd00:96::40"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports: [{name: http, protocol: TCP, port: 80, nodePort: %d}]
`, np) + sliceYAML("np-4", "np", ep4, "") + sliceYAML("np-6", "np", ep6, "") + fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: clash, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.41
  ports: [{name: http, protocol: TCP, port: 80, nodePort: %d}]
`, clash) + sliceYAML("clash-4", "clash", ep4, "")
}

func TestBinaryNodePorts(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	var ln4, ln6 net.Listener
	if err := b.c.run(func() (err error) {
		if ln4, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
		ln6, err = net.Listen("tcp", "[::1]:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ep4 := serveTCP(t, ln4, holdServer("4")).addr
	ep6 := serveTCP(t, ln6, holdServer("6")).addr
	const np, clash = 30080, 30081
	// Something on the host holds the clashing NodePort already.
	var squatter net.Listener
	if err := b.c.run(func() (err error) { squatter, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", clash)); return err }); err != nil {
		t.Fatal(err)
	}
	defer squatter.Close()
	cfg := filepath.Join(t.TempDir(), "np.yaml")
	writeFile(t, cfg, nodePortConfig(ep4, ep6, np, clash))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxnp0",
		"--service-cidr", "10.96.0.0/12", "--service-cidr", "fd00:96::/64",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "info")
	b.waitHealthy(p)

	var conns []net.Conn
	for _, tc := range []struct{ addr, want string }{
		{fmt.Sprintf("127.0.0.1:%d", np), "4"},
		{fmt.Sprintf("[::1]:%d", np), "6"},
	} {
		var c net.Conn
		if err := b.c.run(func() (err error) { c, err = net.DialTimeout("tcp", tc.addr, 5*time.Second); return err }); err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != tc.want {
			t.Fatalf("%s: %q %v, want %q", tc.addr, buf, err, tc.want)
		}
		conns = append(conns, c)
	}
	out, err := exec.Command("ip", "netns", "exec", b.name, bin, "conntrack", "list", "--protocol", "tcp").CombinedOutput()
	if err != nil {
		t.Fatalf("conntrack list: %v\n%s", err, out)
	}
	for _, want := range []string{"dst=127.0.0.1 sport=", fmt.Sprintf("dport=%d", np), "dst=::1", "ESTABLISHED"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("conntrack list lacks %q:\n%s", want, out)
		}
	}
	t.Logf("conntrack list:\n%s", out)

	code, body, err := b.get("/healthz")
	if err != nil || code != http.StatusOK || !strings.Contains(body, fmt.Sprintf("note: NodePort TCP 127.0.0.1:%d is not served", clash)) {
		t.Fatalf("/healthz: %d %q %v", code, body, err)
	}
	_, metrics, _ := b.get("/metrics")
	if metricValue(metrics, `userproxy_nodeport_sockets{state="failed"}`) != 1 || metricValue(metrics, `userproxy_nodeport_sockets{state="open"}`) != 2 {
		t.Fatalf("nodeport_sockets:\n%s", grepLines(metrics, "nodeport"))
	}
	for _, c := range conns {
		c.Close()
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

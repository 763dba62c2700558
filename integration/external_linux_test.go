package integration

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// External addresses through the real binary on a real TUN (issue 16):
// load-balancer IPs (IPv4 and IPv6) and an externalIP get their own routes
// into the TUN, reach the endpoint, and lose their routes when the Service
// loses them; loadBalancerSourceRanges refuse a client outside them.

// lbConfig is a LoadBalancer Service "lb" with the given ingress IPs and
// externalIPs, ranges as its loadBalancerSourceRanges, over endpoint ep
// (and its IPv6 twin ep6, for the IPv6 family).
func lbConfig(ep, ep6 netip.AddrPort, ingress, externalIPs, ranges []string) string {
	ing := make([]string, len(ingress))
	for i, ip := range ingress {
		ing[i] = fmt.Sprintf("{ip: %q}", ip)
	}
	q := func(l []string) string {
		out := make([]string, len(l))
		for i, s := range l {
			out[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(out, ", ") + "]"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30, "fd00:96::30"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  externalIPs: %s
  loadBalancerSourceRanges: %s
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30080}]
status:
  loadBalancer:
    ingress: [%s]
`, q(externalIPs), q(ranges), strings.Join(ing, ", ")) + sliceYAML("lb-4", "lb", ep, "") + sliceYAML("lb-6", "lb", ep6, "")
}

// tunRoutes lists the destinations routed into dev in the namespace.
func tunRoutes(t *testing.T, b *binNS, dev string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := b.c.run(func() error {
		l, err := netlink.LinkByName(dev)
		if err != nil {
			return err
		}
		rs, err := netlink.RouteList(l, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Dst != nil {
				out[r.Dst.String()] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBinaryExternalAddresses(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	if err := b.c.run(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		// A second client, outside the source ranges, and the IPv6 client.
		for _, p := range []netip.Prefix{netip.MustParsePrefix("192.0.2.77/32"), tunClient6} {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(p)}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ep := b.tcpEndpoint("v4")
	var ln6 net.Listener
	if err := b.c.run(func() (err error) { ln6, err = net.Listen("tcp", "[::1]:0"); return err }); err != nil {
		t.Fatal(err)
	}
	ep6 := serveTCP(t, ln6, nameServer("v6")).addr
	cfg := filepath.Join(t.TempDir(), "lb.yaml")
	ingress := []string{"198.51.100.10", "2001:db8:100::10"}
	// The ranges admit 192.0.2.1 (and the IPv6 client); 192.0.2.77 is outside.
	ranges := []string{"192.0.2.0/28", "2001:db8::/64"}
	writeFile(t, cfg, lbConfig(ep, ep6, ingress, []string{"203.0.113.10"}, ranges))
	const dev = "upxext0"
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", dev,
		"--service-cidr", "10.96.0.0/12", "--service-cidr", "fd00:96::/64",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "info")
	b.waitHealthy(p)

	routes := tunRoutes(t, b, dev)
	for _, want := range []string{"198.51.100.10/32", "2001:db8:100::10/128", "203.0.113.10/32"} {
		if !routes[want] {
			t.Fatalf("no route %s into %s: %v", want, dev, routes)
		}
	}
	for _, tc := range []struct{ from, to, want string }{
		{"192.0.2.1", "198.51.100.10:80", "v4"},
		{"2001:db8::1", "[2001:db8:100::10]:80", "v6"},
		{"192.0.2.77", "203.0.113.10:80", "v4"}, // externalIPs are not filtered
	} {
		var c net.Conn
		err := b.c.run(func() (err error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: netip.MustParseAddr(tc.from).AsSlice()}, Timeout: 5 * time.Second}
			c, err = d.Dial("tcp", tc.to)
			return err
		})
		if err != nil {
			t.Fatalf("%s -> %s: %v", tc.from, tc.to, err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 8)
		n, _ := c.Read(buf)
		c.Close()
		if string(buf[:n]) != tc.want {
			t.Fatalf("%s -> %s: got %q, want %q", tc.from, tc.to, buf[:n], tc.want)
		}
	}
	// Outside the source ranges: dropped (the SYN gets no answer), and
	// counted.
	err := b.c.run(func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: netip.MustParseAddr("192.0.2.77").AsSlice()}, Timeout: time.Second}
		c, err := d.Dial("tcp", "198.51.100.10:80")
		if err == nil {
			c.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a client outside loadBalancerSourceRanges: %v, want a timeout (dropped)", err)
	}
	if _, body, _ := b.get("/metrics"); metricValue(body, `userproxy_flows_total{protocol="tcp",result="dropped_source_range"}`) < 1 {
		t.Fatalf("dropped_source_range not counted:\n%s", grepLines(body, "flows_total"))
	}

	// The IPv6 LB IP and the externalIP leave the Service: their routes go,
	// the remaining one stays.
	writeFile(t, cfg, lbConfig(ep, ep6, ingress[:1], nil, ranges))
	deadline := time.Now().Add(5 * time.Second)
	for {
		routes = tunRoutes(t, b, dev)
		if !routes["2001:db8:100::10/128"] && !routes["203.0.113.10/32"] && routes["198.51.100.10/32"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("routes after the change: %v", routes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	// On exit, run removes the routes it added.
	if out, err := exec.Command("ip", "netns", "exec", b.name, "ip", "route", "show", "198.51.100.10").CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("after exit: route %q, %v", out, err)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

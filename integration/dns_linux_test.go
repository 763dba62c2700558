//go:build linux

package integration

// Cluster DNS through the real binary on a TUN (root; everything in a
// namespace the test creates): dig and a Go resolver ask 10.96.0.10 from the
// client's side of the TUN, the answers follow a changed config file, and a
// Service that owns 10.96.0.10:53 takes the queries over.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// requireDig returns the path of dig; without it the test is skipped, or
// fails under CI (which installs bind9-dnsutils).
func requireDig(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("dig")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatal("this test needs dig (Debian: bind9-dnsutils), and CI must have it")
	}
	t.Skip("needs dig (Debian: bind9-dnsutils)")
	return ""
}

// dig runs dig inside the namespace against 10.96.0.10 and returns its
// output (+short unless the arguments say otherwise).
func (b *binNS) dig(args ...string) (string, error) {
	b.t.Helper()
	all := append([]string{"netns", "exec", b.name, "dig", "@10.96.0.10", "+time=2", "+tries=1"}, args...)
	out, err := exec.Command("ip", all...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// digShort is dig +short, failing the test when dig fails.
func (b *binNS) digShort(args ...string) string {
	b.t.Helper()
	out, err := b.dig(append([]string{"+short"}, args...)...)
	if err != nil {
		b.t.Fatalf("dig %v: %v\n%s", args, err, out)
	}
	return out
}

// dnsConfig is the cluster of the DNS tests: acc/web (ClusterIP webIP, TCP
// 80) with one endpoint, acc/db (headless, two endpoints, one with a
// hostname), acc/many (headless, 60 endpoints: an answer too large for 512
// bytes), and, when kubeDNS is valid, kube-system/kube-dns owning
// 10.96.0.10:53/UDP with that endpoint.
func dnsConfig(webIP string, web, kubeDNS netip.AddrPort) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Service
metadata: {name: web, namespace: acc}
spec:
  clusterIP: %[1]s
  clusterIPs: [%[1]s]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: %[2]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: acc, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: ["%[3]s"]}]
ports: [{name: http, protocol: TCP, port: %[2]d}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: acc}
spec:
  clusterIP: None
  ports: [{name: pg, protocol: TCP, port: 5432}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: db-1, namespace: acc, labels: {kubernetes.io/service-name: db}}
addressType: IPv4
endpoints: [{addresses: ["198.51.100.1"], hostname: db-0}, {addresses: ["198.51.100.2"]}]
ports: [{name: pg, protocol: TCP, port: 5432}]
---
apiVersion: v1
kind: Service
metadata: {name: many, namespace: acc}
spec:
  clusterIP: None
  ports: [{name: http, protocol: TCP, port: 80}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: many-1, namespace: acc, labels: {kubernetes.io/service-name: many}}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 80}]
endpoints:
`, webIP, web.Port(), web.Addr())
	for i := range 60 {
		fmt.Fprintf(&b, "- addresses: [\"198.51.100.%d\"]\n", 100+i)
	}
	if kubeDNS.IsValid() {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: %[1]d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv4
endpoints: [{addresses: ["%[2]s"]}]
ports: [{name: dns, protocol: UDP, port: %[1]d}]
`, kubeDNS.Port(), kubeDNS.Addr())
	}
	return b.String()
}

// output is what the process wrote so far (read under the writer's lock).
func output(p *proc) string { return p.cmd.Stdout.(*lockedWriter).String() }

// pollDig asks until the +short answer is want (bounded; no assertion on
// how fast).
func (b *binNS) pollDig(want string, args ...string) {
	b.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := b.dig(append([]string{"+short"}, args...)...)
		if err == nil && out == want {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("dig %v: %q, %v; want %q", args, out, err, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestBinaryDNS(t *testing.T) {
	requireRoot(t)
	requireDig(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	web := b.tcpEndpoint("web-a")
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, dnsConfig("10.96.5.5", web, netip.AddrPort{}))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxdns0",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "debug")
	b.waitHealthy(p)

	// A over UDP and TCP, with and without the final dot, in any case.
	for _, args := range [][]string{
		{"web.acc.svc.cluster.local"},
		{"web.acc.svc.cluster.local."},
		{"WEB.Acc.svc.Cluster.Local"},
		{"+tcp", "web.acc.svc.cluster.local"},
	} {
		if got := b.digShort(args...); got != "10.96.5.5" {
			t.Errorf("dig %v: %q, want 10.96.5.5", args, got)
		}
	}
	// SRV, PTR, a headless service and its endpoint, NXDOMAIN, REFUSED.
	checks := []struct {
		args []string
		want string
	}{
		{[]string{"_http._tcp.web.acc.svc.cluster.local", "SRV"}, "0 100 80 web.acc.svc.cluster.local."},
		{[]string{"-x", "10.96.5.5"}, "web.acc.svc.cluster.local."},
		{[]string{"db.acc.svc.cluster.local"}, "198.51.100.1\n198.51.100.2"},
		{[]string{"db-0.db.acc.svc.cluster.local"}, "198.51.100.1"},
		{[]string{"AAAA", "web.acc.svc.cluster.local"}, ""},
	}
	for _, c := range checks {
		if got := b.digShort(c.args...); got != c.want {
			t.Errorf("dig %v: %q, want %q", c.args, got, c.want)
		}
	}
	for _, c := range []struct {
		name, status string
	}{
		{"nope.acc.svc.cluster.local", "status: NXDOMAIN"},
		{"example.com", "status: REFUSED"},
	} {
		if out, _ := b.dig(c.name); !strings.Contains(out, c.status) {
			t.Errorf("dig %s: want %q in\n%s", c.name, c.status, out)
		}
	}

	// A large answer: truncated over UDP without EDNS0, whole over TCP (dig
	// retries by itself after TC).
	out, _ := b.dig("+noedns", "+ignore", "many.acc.svc.cluster.local")
	if !strings.Contains(out, " tc ") && !strings.Contains(out, " tc;") {
		t.Errorf("60 A records over UDP without EDNS0: no TC flag in\n%s", out)
	}
	if got := strings.Split(b.digShort("+noedns", "many.acc.svc.cluster.local"), "\n"); len(got) != 60 {
		t.Errorf("after TC dig retried over TCP and got %d records, want 60", len(got))
	}

	// A Go client resolves the name through 10.96.0.10 and connects to it.
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return b.c.dial(network, "10.96.0.10:53")
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addrs, err := resolver.LookupHost(ctx, "web.acc.svc.cluster.local")
	if err != nil || !slices.Equal(addrs, []string{"10.96.5.5"}) {
		t.Fatalf("LookupHost: %v, %v", addrs, err)
	}
	if got, err := b.fetchName(net.JoinHostPort(addrs[0], "80")); err != nil || got != "web-a" {
		t.Fatalf("connecting to the resolved address: %q, %v", got, err)
	}

	// The Service moves to another ClusterIP: the next table answers it.
	writeFile(t, cfg, dnsConfig("10.96.5.7", web, netip.AddrPort{}))
	b.pollDig("10.96.5.7", "web.acc.svc.cluster.local")
	if got := b.digShort("-x", "10.96.5.7"); got != "web.acc.svc.cluster.local." {
		t.Errorf("PTR of the new ClusterIP: %q", got)
	}
	if got := b.digShort("-x", "10.96.5.5"); got != "" {
		t.Errorf("PTR of the old ClusterIP: %q, want none", got)
	}
	if got, err := b.fetchName("10.96.5.7:80"); err != nil || got != "web-a" {
		t.Fatalf("the new ClusterIP: %q, %v", got, err)
	}

	// /debug/dns and /metrics.
	if _, body, _ := b.get("/debug/dns"); !strings.Contains(body, "dns 10.96.0.10:53: answering") {
		t.Errorf("/debug/dns:\n%s", body)
	}
	_, metrics, _ := b.get("/metrics")
	for _, series := range []string{`userproxy_dns_queries_total{rcode="NOERROR",type="A"}`, `userproxy_dns_queries_total{rcode="NXDOMAIN",type="A"}`,
		`userproxy_dns_queries_total{rcode="NOERROR",type="SRV"}`, `userproxy_dns_queries_total{rcode="NOERROR",type="PTR"}`,
		`userproxy_flows_total{protocol="udp",result="local"}`, `userproxy_flows_total{protocol="tcp",result="local"}`} {
		if v := metric(metrics, series); v < 1 {
			t.Errorf("%s = %v, want at least 1", series, v)
		}
	}
	if v := metric(metrics, "userproxy_dns_truncated_total"); v < 1 {
		t.Errorf("userproxy_dns_truncated_total = %v", v)
	}

	if err := p.stop(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	log := output(p)
	for _, want := range []string{
		`not registered with the host's resolver (not in the host's network namespace)`, // not the host's resolved
		`nameserver 10.96.0.10`,
		`"msg":"dns query"`, // one debug line per query
		`"name":"_http._tcp.web.acc.svc.cluster.local."`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q", want)
		}
	}
}

// A Service owning 10.96.0.10:53 (a cluster's kube-dns reached through the
// proxy) gets the queries; the responder steps aside, says so, and answers
// again when the Service goes.
func TestBinaryDNSStepsAside(t *testing.T) {
	requireRoot(t)
	requireDig(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	web := b.tcpEndpoint("web-a")
	// kube-dns: answers every A question with 192.0.2.99.
	var pc net.PacketConn
	if err := b.c.run(func() (err error) { pc, err = net.ListenPacket("udp", "127.0.0.1:0"); return err }); err != nil {
		t.Fatal(err)
	}
	kubeDNS := serveUDP(t, pc, func(q []byte) []byte {
		var m dns.Msg
		if m.Unpack(q) != nil || len(m.Question) != 1 {
			return nil
		}
		r := new(dns.Msg)
		r.SetReply(&m)
		rr, _ := dns.NewRR(m.Question[0].Name + " 30 IN A 192.0.2.99")
		r.Answer = append(r.Answer, rr)
		out, _ := r.Pack()
		return out
	})
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, dnsConfig("10.96.5.5", web, kubeDNS))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxdns1",
		"--min-sync-period", "0", "--log-format", "json")
	b.waitHealthy(p)

	if got := b.digShort("web.acc.svc.cluster.local"); got != "192.0.2.99" {
		t.Fatalf("with kube-dns in the table: %q, want kube-dns's answer 192.0.2.99", got)
	}
	if _, body, _ := b.get("/debug/dns"); !strings.Contains(body, "stepped aside for kube-system/kube-dns") {
		t.Errorf("/debug/dns:\n%s", body)
	}
	if !strings.Contains(output(p), "dns: stepped aside for kube-system/kube-dns") {
		t.Error("the log does not say the responder stepped aside")
	}

	// kube-dns goes: the responder answers again.
	writeFile(t, cfg, dnsConfig("10.96.5.5", web, netip.AddrPort{}))
	b.pollDig("10.96.5.5", "web.acc.svc.cluster.local")
	if err := p.stop(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if !strings.Contains(output(p), "dns: answering again") {
		t.Error("the log does not say the responder answers again")
	}
}

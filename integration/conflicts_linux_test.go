//go:build linux

package integration

// The silent failures of a node moving from kube-proxy (root): kube-proxy's
// rules left in nat PREROUTING/OUTPUT (here loaded with iptables-restore from
// `userproxy rules --format restore --jump-rules`, what kube-proxy writes),
// a ClusterIP left on kube-ipvs0 by its IPVS mode, and a Service whose
// ClusterIP lies outside every --service-cidr. Each gives a log line, a
// metric and a failing /readyz naming it; `userproxy cleanup` removes the
// first two, the file's fix the third, and the ClusterIP is then answered
// by userproxy.

import (
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// conflictConfig is quickConfig's web Service and, with outside, a second
// one whose ClusterIP (k3s' range) lies outside the default service CIDR.
func conflictConfig(web, dns netip.AddrPort, outside bool) string {
	cfg := quickConfig(web, dns)
	if outside {
		cfg += fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: k3s-dns, namespace: kube-system}
spec:
  clusterIP: 10.43.0.10
  clusterIPs: [10.43.0.10]
  ports: [{name: tcp, protocol: TCP, port: 80, targetPort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: k3s-dns-1, namespace: kube-system, labels: {kubernetes.io/service-name: k3s-dns}}
addressType: IPv4
endpoints: [{addresses: [%s]}]
ports: [{name: tcp, protocol: TCP, port: %d}]
`, web.Port(), web.Addr(), web.Port())
	}
	return cfg
}

func TestConflictsAndCleanup(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"iptables-save", "iptables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s: %v (apt-get install iptables)", tool, err)
		}
	}
	bin := userproxyBinary(t)
	b := newBinNS(t)
	web, dns := b.tcpEndpoint("a"), b.udpEcho()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, conflictConfig(web, dns, true))

	// kube-proxy's rules for the same objects, hooked into PREROUTING and
	// OUTPUT, and its IPVS mode's dummy device with a ClusterIP on it.
	rulesOut, err := exec.Command(bin, "rules", "--config", cfg, "--format", "restore", "--jump-rules").Output()
	if err != nil {
		t.Fatalf("userproxy rules: %v", err)
	}
	restore := exec.Command("ip", "netns", "exec", b.name, "iptables-restore")
	restore.Stdin = strings.NewReader(string(rulesOut))
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore of kube-proxy's rules: %v\n%s", err, out)
	}
	// (kube-proxy's is a dummy device; this kernel may have no dummy
	// driver, so a veth of that name stands in.)
	if err := inNS(b.ns, func() error {
		d := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "kube-ipvs0"}, PeerName: "kube-ipvs0p"}
		if err := netlink.LinkAdd(d); err != nil {
			return err
		}
		return netlink.AddrAdd(d, &netlink.Addr{IPNet: prefixNet(netip.MustParsePrefix("10.96.0.10/32"))})
	}); err != nil {
		t.Fatalf("kube-ipvs0: %v", err)
	}

	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxcf0",
		"--min-sync-period", "0", "--log-format", "json", "--control-socket", filepath.Join(dir, "ctl.sock"))
	var ready string
	waitWithin(t, 30*time.Second, "/readyz to name the three causes", func() bool {
		code, body, _ := b.get("/readyz")
		ready = body
		return code == http.StatusServiceUnavailable && strings.Contains(body, "kube_proxy_rules") &&
			strings.Contains(body, "local_cluster_ips") && strings.Contains(body, "cluster_ip_outside_service_cidrs")
	})
	t.Logf("/readyz: %s", strings.TrimSpace(ready))
	if !strings.Contains(ready, "userproxy cleanup") || !strings.Contains(ready, "kube-system/k3s-dns") || !strings.Contains(ready, "--service-cidr") {
		t.Errorf("/readyz does not say what to do: %s", ready)
	}
	if code, _, _ := b.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d: the proxy itself is healthy", code)
	}
	// kube-proxy's health server stays healthy (the proxier keeps up) and
	// its JSON says why Services fail.
	if code, body, _ := b.getAt("127.0.0.1:10256", "/healthz"); code != http.StatusOK || !strings.Contains(body, `"problems":[`) ||
		!strings.Contains(body, "kube_proxy_rules") || !strings.Contains(body, "local_cluster_ips") {
		t.Errorf("health server /healthz: %d %s", code, body)
	}
	_, metrics, _ := b.get("/metrics")
	for _, cause := range []string{"kube_proxy_rules", "local_cluster_ips", "cluster_ip_outside_service_cidrs"} {
		if !strings.Contains(metrics, fmt.Sprintf(`userproxy_host_conflicts{cause=%q} 1`, cause)) {
			t.Errorf("userproxy_host_conflicts{cause=%q} is not 1", cause)
		}
	}
	if !strings.Contains(metrics, `userproxy_host_conflicts{cause="service_cidr_route"} 0`) {
		t.Errorf("userproxy_host_conflicts{cause=\"service_cidr_route\"} is not 0")
	}
	if log := p.output(); strings.Count(log, "Service traffic does not reach the proxy") < 3 {
		t.Errorf("the log does not name each cause:\n%s", log)
	}

	// The cleanup, and the file's fix.
	out, err := exec.Command("ip", "netns", "exec", b.name, bin, "cleanup").CombinedOutput()
	if err != nil {
		t.Fatalf("userproxy cleanup: %v\n%s", err, out)
	}
	t.Logf("userproxy cleanup:\n%s", strings.TrimSpace(string(out)))
	if left, _ := exec.Command("ip", "netns", "exec", b.name, "iptables-save", "-t", "nat").Output(); strings.Contains(string(left), "KUBE-") {
		t.Errorf("KUBE- chains left after the cleanup:\n%s", left)
	}
	writeFile(t, cfg, conflictConfig(web, dns, false))
	waitWithin(t, 30*time.Second, "/readyz to pass", func() bool { code, _, _ := b.get("/readyz"); return code == http.StatusOK })
	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "a" {
		t.Fatalf("the ClusterIP after the cleanup: %q, %v", got, err)
	}
	if _, list, _ := b.get("/debug/conntrack"); !strings.Contains(list, "dst=10.96.0.10") {
		t.Errorf("the ClusterIP's flow is not in userproxy's conntrack table: %s", list)
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("userproxy exit: %v", err)
	}
}

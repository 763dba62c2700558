//go:build linux

package integration

import (
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestExplain: userproxy explain, asking the running binary, agrees with
// what the datapath does: a ClusterIP routed into the TUN is forwarded
// (and --dial connects), a service name reads as its ClusterIP, a client
// pinned by ClientIP affinity is shown on the endpoint that answered it,
// an unknown port is rejected as the datapath rejects it, and a source no
// reply can reach is dropped.
func TestExplain(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	web, dns, other := b.tcpEndpoint("a"), b.udpEcho(), b.tcpEndpoint("b")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(web, dns)+fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: sticky, namespace: default}
spec:
  clusterIP: 10.96.0.30
  sessionAffinity: ClientIP
  ports: [{name: http, protocol: TCP, port: 80, targetPort: %d}]
`, web.Port())+sliceYAML("sticky-1", "sticky", web, "")+sliceYAML("sticky-2", "sticky", other, ""))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxex0",
		"--min-sync-period", "0", "--log-format", "json", "--control-socket", filepath.Join(dir, "ctl.sock"))
	waitWithin(t, 30*time.Second, "/readyz", func() bool { code, _, _ := b.get("/readyz"); return code == http.StatusOK })
	explain := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", b.name, bin, "explain", "--tun-name", "upxex0"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("explain %v: %v\n%s", args, err, out)
		}
		t.Logf("userproxy explain %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	wants := func(out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("explain output lacks %q", w)
			}
		}
	}

	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "a" {
		t.Fatalf("the datapath: 10.96.0.10:80 answers %q, %v", got, err)
	}
	wants(explain("10.96.0.10:80", "--dial"), "routes 10.96.0.10 into upxex0, the proxy's TUN", "ClusterIP of the service port default/web:http",
		web.String(), "chance 1.0000", "verdict: FORWARD", "--dial: connected to 10.96.0.10:80")
	wants(explain("web.default.svc.cluster.local:http"), "10.96.0.10:80/TCP", "verdict: FORWARD")

	// Affinity: the endpoint that answered is the one explain pins.
	got, err := b.fetchName("10.96.0.30:80")
	if err != nil {
		t.Fatal(err)
	}
	pinned := map[string]string{"a": web.String(), "b": other.String()}[got]
	out := explain("10.96.0.30:80")
	wants(out, "is pinned to "+pinned, "verdict: FORWARD")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "<- this client") && !strings.Contains(line, pinned) {
			t.Errorf("explain pins another endpoint than the datapath (%s): %s", pinned, line)
		}
	}

	// Refusals, as the datapath refuses them.
	if _, err := b.fetchName("10.96.0.10:81"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("the datapath: 10.96.0.10:81: %v, want refused", err)
	}
	wants(explain("10.96.0.10:81"), "no service port is 81/TCP", "verdict: REJECT")
	wants(explain("10.96.0.10:80", "--from", "0.0.0.0"), "no reply can reach", "verdict: DROP")
	if err := p.stop(t); err != nil {
		t.Fatalf("userproxy exit: %v", err)
	}
}

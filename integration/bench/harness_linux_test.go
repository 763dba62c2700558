package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestHarnessShort runs the whole harness in short mode (about a second per
// cell) as CI does, so that it keeps working: every cell must produce a
// figure on every path, and the memory and control-plane tables must be
// complete. The figures themselves are not judged here (see BENCHMARKS.md).
func TestHarnessShort(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("CI runs as root: the harness needs namespaces and a TUN device")
		}
		t.Skip("needs root (namespaces, TUN device, iptables)")
	}
	for _, tool := range []string{"iperf3", "iptables-restore", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the harness needs %s (apt-get install iperf3 iptables iproute2): %v", tool, err)
		}
	}
	dir := t.TempDir()
	for _, b := range [][2]string{{"bench", "github.com/userproxy/userproxy/integration/bench"}, {"userproxy", "github.com/userproxy/userproxy/cmd/userproxy"}} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b[0]), b[1]).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "bench"), "-short", "-userproxy", filepath.Join(dir, "userproxy"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	t.Logf("harness output:\n%s", out)
	if err != nil {
		t.Fatalf("harness: %v", err)
	}
	text := string(out)
	figure := `[0-9]+(\.[0-9]+)?`
	for _, row := range []string{
		`\| veth, no NAT \(direct\) \|`, `\| kernel iptables \(kube-proxy rules\) \|`, `\| userproxy \(TUN\) \|`,
	} {
		re := regexp.MustCompile(row + ` ` + figure + ` Gbit/s \(` + figure + `x\) \| ` + figure + ` \(` + figure + `x\) \| ` +
			figure + ` / ` + figure + ` µs .* \| ` + figure + ` \(` + figure + `x\) \|`)
		if !re.MatchString(text) {
			t.Errorf("no complete datapath row matching %s", row)
		}
	}
	for _, want := range []string{"idle proxied TCP connections |", "UDP flows |", "conntrack entries", "| 1000 |", "| userproxy (TUN) | "} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

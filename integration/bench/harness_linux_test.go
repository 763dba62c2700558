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
// figure on every path that runs, each userspace peer found on this machine
// must run (pasta always in CI, which installs passt), a peer not found must
// say why, and the memory and control-plane tables must be complete. The
// figures themselves are not judged here (see BENCHMARKS.md).
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
	rows := []string{"veth, no NAT (direct)", "kernel iptables (kube-proxy rules)", "userproxy (TUN)", "userproxy (NodePort on 127.0.0.1)"}
	for _, peer := range []struct{ row, bin string }{{"pasta (passt, tap)", "pasta"}, {"tun2socks (gVisor, TUN)", "tun2socks"}} {
		if _, err := exec.LookPath(peer.bin); err == nil {
			rows = append(rows, peer.row)
			continue
		} else if peer.bin == "pasta" && os.Getenv("CI") != "" {
			t.Errorf("CI installs passt (.ci/run), but: %v", err)
		}
		if !strings.Contains(text, "- peer "+peer.row+": not run: ") || !strings.Contains(text, "| "+peer.row+" | not run: ") {
			t.Errorf("%s is not installed, and the output does not say so", peer.bin)
		}
	}
	// A complete row: every datapath cell begins with a figure and its
	// ratio to the kernel path; userproxy's also carry the best peer's. The
	// pod-like client's two cells (the 4th and 5th) are "–" on the rows
	// that have no pod-like client: direct and NodePort.
	figure := `[0-9]+(\.[0-9]+)?`
	value := regexp.MustCompile(`^` + figure + `( / ` + figure + `)? (Gbit/s |µs )?\(` + figure + `x`)
	for _, row := range rows {
		var cells []string
		for _, l := range strings.Split(text, "\n") {
			if c, ok := strings.CutPrefix(l, "| "+row+" | "); ok {
				cells = strings.Split(strings.TrimSuffix(c, " |"), " | ")
				break
			}
		}
		if len(cells) != 8 {
			t.Errorf("datapath row %q: %d cells, want 8: %q", row, len(cells), cells)
			continue
		}
		noPod := row == rows[0] || row == rows[3]
		for i, c := range cells {
			if noPod && (i == 3 || i == 4) {
				if c != "–" {
					t.Errorf("datapath row %q has no pod-like client, but cell %d is %q", row, i+1, c)
				}
				continue
			}
			if !value.MatchString(c) {
				t.Errorf("datapath row %q, cell %d: no figure: %q", row, i+1, c)
			}
			if strings.HasPrefix(row, "userproxy") && len(rows) > 4 && !strings.Contains(c, "best peer") {
				t.Errorf("datapath row %q, cell %d: no ratio to the best peer: %q", row, i+1, c)
			}
		}
		if row != rows[0] && row != rows[1] && !strings.Contains(text, "| "+row+": CPU per cell (per operation) / peak RSS | ") {
			t.Errorf("no CPU row for %q", row)
		}
	}
	for _, want := range []string{"idle proxied TCP connections |", "UDP flows |", "conntrack entries", "| 1000 |", "| userproxy (TUN) | "} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

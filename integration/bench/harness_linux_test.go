package main

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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

// TestIperfNotReady runs iperf3's client on 127.0.0.1 against each way its
// server can be not ready, and one way a test can fail, and checks which
// ones the harness retries: a server busy with another test (one
// ACCESS_DENIED byte, then close, as iperf_accept in iperf_server_api.c
// answers), one closing its listener with the client in the accept queue
// (cleanup_server at a test's end; the kernel resets the queued
// connection), none listening; and a server killed after the test's stream
// connected, which is not retried.
func TestIperfNotReady(t *testing.T) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI installs iperf3 (.ci/run), but: %v", err)
		}
		t.Skip("needs iperf3")
	}
	client := func(t *testing.T, port int, secs string) iperfResult {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, "iperf3", "-c", "127.0.0.1", "-p", strconv.Itoa(port), "-t", secs, "-J").Output()
		var r iperfResult
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("iperf3's report: %v\n%s", err, out)
		}
		t.Logf("iperf3: connected %d, error %q", len(r.Start.Connected), r.Error)
		return r
	}
	listen := func(t *testing.T) (*net.TCPListener, int) {
		t.Helper()
		l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l, l.Addr().(*net.TCPAddr).Port
	}

	t.Run("busy", func(t *testing.T) {
		l, port := listen(t)
		go func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte{0xff}) // ACCESS_DENIED, (signed char)-1
			_ = c.Close()
		}()
		if r := client(t, port, "1"); !iperfNotReady(r) {
			t.Errorf("a busy server's refusal (%q) is not retried", r.Error)
		}
	})

	t.Run("listener closed with the client queued", func(t *testing.T) {
		l, port := listen(t)
		go func() {
			// Close once the client is in the accept queue: a listening
			// socket's tcpi_unacked is the queue's length (tcp_get_info).
			rc, err := l.SyscallConn()
			if err != nil {
				return
			}
			for range 2000 {
				var queued uint32
				_ = rc.Control(func(fd uintptr) {
					if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
						queued = info.Unacked
					}
				})
				if queued > 0 {
					time.Sleep(50 * time.Millisecond) // and its cookie with it
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			_ = l.Close()
		}()
		if r := client(t, port, "1"); !iperfNotReady(r) {
			t.Errorf("a reset from the accept queue (%q) is not retried", r.Error)
		}
	})

	t.Run("nothing listening", func(t *testing.T) {
		l, port := listen(t)
		_ = l.Close()
		if r := client(t, port, "1"); !iperfNotReady(r) {
			t.Errorf("a refused connection (%q) is not retried", r.Error)
		}
	})

	t.Run("server killed during the test", func(t *testing.T) {
		l, port := listen(t)
		_ = l.Close() // the port, for iperf3's own server
		srv := exec.Command("iperf3", "-s", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
		for range 200 { // until it listens
			if c, err := net.Dial("tcp4", l.Addr().String()); err == nil {
				_ = c.Close()
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		// That probe was a client to iperf3 too: its server reads a
		// cookie, fails, and listens again.
		time.Sleep(200 * time.Millisecond)
		go func() {
			time.Sleep(1500 * time.Millisecond)
			_ = srv.Process.Kill()
		}()
		r := client(t, port, "5")
		if r.Error == "" {
			t.Fatal("the test did not fail with its server killed")
		}
		if iperfNotReady(r) {
			t.Errorf("a test that failed after its stream connected (%q) would be retried", r.Error)
		}
		// The same report with the accept queue's reset message: a reset
		// after a stream connected is the path's failure either way.
		r.Error = "unable to receive control message: Connection reset by peer"
		if len(r.Start.Connected) == 0 || iperfNotReady(r) {
			t.Errorf("a reset after %d stream(s) connected would be retried", len(r.Start.Connected))
		}
	})
}

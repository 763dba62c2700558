package main

import (
	"context"
	"encoding/json"
	"fmt"
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
	want := len((&harness{}).allCells())
	for _, row := range rows {
		var cells []string
		for _, l := range strings.Split(text, "\n") {
			if c, ok := strings.CutPrefix(l, "| "+row+" | "); ok {
				cells = strings.Split(strings.TrimSuffix(c, " |"), " | ")
				break
			}
		}
		if len(cells) != want {
			t.Errorf("datapath row %q: %d cells, want %d: %q", row, len(cells), want, cells)
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

// TestIperfNotReadyReports decides reports in the wordings of iperf3 3.12
// and of later versions, whose messages add hints between the start and
// the errno.
func TestIperfNotReadyReports(t *testing.T) {
	report := func(connectingTo bool, streams int, msg string) iperfResult {
		var r iperfResult
		if connectingTo {
			r.Start.ConnectingTo = json.RawMessage(`{"host":"10.96.0.10","port":5201}`)
		}
		for range streams {
			r.Start.Connected = append(r.Start.Connected, json.RawMessage(`{"socket":5}`))
		}
		r.Error = msg
		return r
	}
	for _, tc := range []struct {
		r     iperfResult
		retry bool
	}{
		{report(false, 0, "the server is busy running a test. try again later"), true},
		{report(false, 0, "unable to connect to server: Connection refused"), true},
		{report(false, 0, "unable to connect to server - server may have stopped running or use a different port, firewall issue, etc.: Connection refused"), true},
		{report(false, 0, "unable to receive control message: Connection reset by peer"), true},
		{report(false, 0, "unable to receive control message - port may not be available, the other side may have stopped running, etc.: Connection reset by peer"), true},
		{report(false, 0, "unable to send cookie to server: Connection reset by peer"), true},
		{report(false, 0, "unable to send cookie to server: Broken pipe"), true},
		{report(false, 0, "unable to receive control message - port may not be available, the other side may have stopped running, etc.: Transport endpoint is not connected"), true},
		// The server answered: a reset now is the path's.
		{report(true, 0, "unable to receive control message: Connection reset by peer"), false},
		{report(true, 1, "unable to receive control message: Connection reset by peer"), false},
		{report(true, 1, "unable to write to stream socket: Connection reset by peer"), false},
		{report(false, 0, "unable to connect to server: No route to host"), false},
		{report(false, 0, "control socket has closed unexpectedly"), false},
		{report(true, 1, ""), false},
	} {
		if why := iperfNotReady(tc.r); (why != "") != tc.retry {
			t.Errorf("connecting_to %t, %d streams, %q: retried %t (%q), want %t",
				len(tc.r.Start.ConnectingTo) > 0, len(tc.r.Start.Connected), tc.r.Error, why != "", why, tc.retry)
		}
	}
}

// TestIperfNotReady runs iperf3's client on 127.0.0.1 against each way its
// server can be not ready, and one way a test can fail, to check that this
// machine's iperf3 reports them as TestIperfNotReadyReports expects: a
// server busy with another test (one ACCESS_DENIED byte, then close, as
// iperf_accept in iperf_server_api.c answers), a listener closed with the
// client in its accept queue (cleanup_server at a test's end; the kernel
// resets the queued connection), none listening; and a server killed after the test's stream
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
		t.Logf("iperf3: answered %t, connected %d, error %q", len(r.Start.ConnectingTo) > 0, len(r.Start.Connected), r.Error)
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
	// serve runs f, which serves l, on a goroutine that the test waits
	// for after closing l (which ends an Accept still waiting).
	serve := func(t *testing.T, l *net.TCPListener, f func()) {
		done := make(chan struct{})
		go func() { defer close(done); f() }()
		t.Cleanup(func() { _ = l.Close(); <-done })
	}
	// queued waits until l's accept queue holds a connection: a listening
	// socket's tcpi_unacked is the queue's length (tcp_get_info).
	queued := func(l *net.TCPListener) bool {
		rc, err := l.SyscallConn()
		if err != nil {
			return false
		}
		for range 2000 {
			var n uint32
			var gerr error
			if err := rc.Control(func(fd uintptr) {
				var info *unix.TCPInfo
				info, gerr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
				if gerr == nil {
					n = info.Unacked
				}
			}); err != nil || gerr != nil {
				return false
			}
			if n > 0 {
				return true
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}
	wantRetried := func(t *testing.T, r iperfResult, what string) {
		t.Helper()
		if why := iperfNotReady(r); why == "" {
			t.Errorf("%s (%q) is not retried", what, r.Error)
		}
	}

	t.Run("busy", func(t *testing.T) {
		l, port := listen(t)
		serve(t, l, func() {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte{0xff}) // ACCESS_DENIED, (signed char)-1
			_ = c.Close()
		})
		wantRetried(t, client(t, port, "1"), "a busy server's refusal")
	})

	t.Run("listener closed with the client queued", func(t *testing.T) {
		l, port := listen(t)
		serve(t, l, func() {
			queued(l)
			_ = l.Close()
		})
		wantRetried(t, client(t, port, "1"), "a reset from the accept queue")
	})

	t.Run("nothing listening", func(t *testing.T) {
		l, port := listen(t)
		_ = l.Close()
		wantRetried(t, client(t, port, "1"), "a refused connection")
	})

	t.Run("server killed during the test", func(t *testing.T) {
		l, port := listen(t)
		_ = l.Close() // the port, for iperf3's own server
		srv := exec.Command("iperf3", "-s", "-B", "127.0.0.1", "-p", strconv.Itoa(port))
		var stderr strings.Builder
		srv.Stderr = &stderr
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
		// srvErr ends the server and returns what it wrote (read only
		// after Wait: exec copies it on a goroutine of its own).
		srvErr := func() string { _ = srv.Process.Kill(); _ = srv.Wait(); return stderr.String() }
		if !listening(t, port) {
			t.Fatalf("iperf3's server did not listen on port %d: %s", port, srvErr())
		}
		kill := time.AfterFunc(1500*time.Millisecond, func() { _ = srv.Process.Kill() })
		t.Cleanup(func() { kill.Stop() })
		r := client(t, port, "5")
		if len(r.Start.Connected) == 0 || r.Error == "" {
			t.Fatalf("the test did not fail after its stream connected (server: %s)", srvErr())
		}
		if why := iperfNotReady(r); why != "" {
			t.Errorf("a test that failed after its stream connected (%q) would be retried as %q", r.Error, why)
		}
	})
}

// listening waits until a socket listens on 127.0.0.1:port, read from
// /proc/net/tcp (state 0A, TCP_LISTEN): neither a probe connection, which
// iperf3's server would take for a client, nor a probe bind, which could
// take the port from it.
func listening(t *testing.T, port int) bool {
	t.Helper()
	want := fmt.Sprintf("0100007F:%04X", port)
	for range 500 {
		b, err := os.ReadFile("/proc/net/tcp")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			if f := strings.Fields(line); len(f) > 3 && f[1] == want && f[3] == "0A" {
				return true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

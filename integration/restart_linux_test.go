//go:build linux

package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/handover"
)

// TestBinaryRestartSIGHUP: tried as an operator would, `kill -HUP` on a
// running proxy while an iperf3 test moves bytes both ways through a
// ClusterIP. The proxy starts its binary again, hands its TUN and flows to
// it and exits 0; the iperf3 test goes on to its end with every interval
// moving bytes; the old process's log says what moved. Then the binary's
// file is replaced by another build (an upgrade) and `userproxy restart`
// restarts the new process the same way: the process serving afterwards
// runs the new file, and the stream still goes on.
func TestBinaryRestartSIGHUP(t *testing.T) {
	requireRoot(t)
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Fatal("iperf3 is needed (.ci/run installs it)")
	}
	// The processes a restart starts are children of the proxy, which
	// exits: this test adopts them (a subreaper), to reap and stop them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) }()

	b := newBinNS(t)
	dir := t.TempDir()
	// The binary runs from a path of its own, which the upgrade replaces.
	exe := filepath.Join(dir, "userproxy")
	copyFile(t, userproxyBinary(t), exe)
	const iperfPort = 15201
	ep := netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", iperfPort))
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho()))
	sock := filepath.Join(dir, "run", "upxhup0.handover")
	logPath := filepath.Join(dir, "userproxy.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	readLog := func() string { out, _ := os.ReadFile(logPath); return string(out) }

	// The proxy's output goes to a file, not a pipe: the processes it
	// starts write to the same file after it exits.
	old := exec.Command("ip", "netns", "exec", b.name, exe, "run", "--config", cfg, "--tun-name", "upxhup0",
		"--tcp-translate=true", "--tun-portable=false",
		"--handover-socket", sock, "--control-socket", filepath.Join(dir, "run", "upxhup0.sock"), "--min-sync-period", "0")
	old.Stdout, old.Stderr = logFile, logFile
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	oldExited := make(chan error, 1)
	go func() { oldExited <- old.Wait() }()
	var pids []int // every proxy process, stopped at the end
	t.Cleanup(func() {
		for _, pid := range pids {
			stopOrphan(t, pid)
		}
		if t.Failed() {
			t.Logf("userproxy log:\n%s", readLog())
		}
	})
	pids = append(pids, old.Process.Pid)
	defer func() {
		if old.ProcessState == nil {
			_ = old.Process.Kill()
			<-oldExited
		}
	}()
	waitReady(t, b, oldExited)

	server := exec.Command("ip", "netns", "exec", b.name, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", strconv.Itoa(iperfPort))
	var serverOut strings.Builder
	server.Stdout, server.Stderr = &serverOut, &serverOut
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = server.Process.Kill(); _ = server.Wait() }()
	waitListening(t, b.name, iperfPort)

	// 10 s both ways; SIGHUP at about 3 s, the upgrade at about 6 s.
	const seconds = 10
	client := exec.Command("ip", "netns", "exec", b.name, "iperf3", "-c", "10.96.0.10", "-p", "80", "--bidir", "-J",
		"-t", strconv.Itoa(seconds), "-i", "1", "--connect-timeout", "5000")
	var clientOut, clientErr strings.Builder
	client.Stdout, client.Stderr = &clientOut, &clientErr
	if err := client.Start(); err != nil {
		t.Fatal(err)
	}
	clientDone := make(chan error, 1)
	go func() { clientDone <- client.Wait() }()
	defer func() {
		if client.ProcessState == nil {
			_ = client.Process.Kill()
			<-clientDone
		}
	}()
	time.Sleep(3 * time.Second)

	// 1. kill -HUP.
	if err := old.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-oldExited:
		if err != nil {
			t.Fatalf("the proxy exited with %v after SIGHUP, want status 0", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the proxy did not hand over within 60 s of SIGHUP")
	}
	first := restartedPID(t, readLog(), 1)
	pids = append(pids, first)
	waitServes(t, sock, first)
	if !regexp.MustCompile(`"msg":"handed over".*"flowsMoved":[2-9]`).MatchString(readLog()) {
		t.Errorf("the old process does not log the iperf3 flows it moved")
	}
	time.Sleep(2 * time.Second)

	// 2. An upgrade: another build at the binary's path, and `userproxy
	// restart`.
	other := filepath.Join(dir, "userproxy.new")
	copyFile(t, otherUserproxyBinary(t), other)
	if err := os.Rename(other, exe); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "exec", b.name, exe, "restart", "--handover-socket", sock).CombinedOutput()
	if err != nil {
		t.Fatalf("userproxy restart: %v: %s", err, out)
	}
	m := regexp.MustCompile(`^pid (\d+) handed over to pid (\d+)\n$`).FindStringSubmatch(string(out))
	if m == nil || m[1] != strconv.Itoa(first) {
		t.Fatalf("userproxy restart says %q, want pid %d handed over to another", out, first)
	}
	second, _ := strconv.Atoi(m[2])
	pids = append(pids, second)
	reapIfOurs(first)
	if want := restartedPID(t, readLog(), 2); want != second {
		t.Errorf("userproxy restart names pid %d, the log pid %d", second, want)
	}
	var running, upgraded unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/exe", second), &running); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(exe, &upgraded); err != nil {
		t.Fatal(err)
	}
	if running.Ino != upgraded.Ino {
		t.Errorf("after the upgrade pid %d runs inode %d, not the new file's %d", second, running.Ino, upgraded.Ino)
	}

	select {
	case err := <-clientDone:
		if err != nil {
			t.Fatalf("iperf3: %v\n%s\n%s", err, clientErr.String(), clientOut.String())
		}
	case <-time.After(seconds*time.Second + 30*time.Second):
		t.Fatalf("iperf3 did not end")
	}
	checkIperfIntervals(t, clientOut.String(), seconds)
	if strings.Contains(readLog(), "could not be taken") {
		t.Error("a restart reset flows it was handed")
	}
	if !regexp.MustCompile(`"msg":"took over"`).MatchString(readLog()) {
		t.Error("no process logged its takeover")
	}
	code, _, err := b.get("/readyz")
	if err != nil || code != http.StatusOK {
		t.Errorf("after two restarts /readyz: %d %v", code, err)
	}
}

// checkIperfIntervals fails the test unless iperf3's JSON report shows
// every one-second interval of both directions moving bytes.
func checkIperfIntervals(t *testing.T, report string, seconds int) {
	t.Helper()
	var r struct {
		Error     string `json:"error"`
		Intervals []struct {
			Streams []struct {
				Bytes  int64 `json:"bytes"`
				Sender bool  `json:"sender"`
			} `json:"streams"`
		} `json:"intervals"`
		End struct {
			SumSent          struct{ Bytes int64 } `json:"sum_sent"`
			SumReceived      struct{ Bytes int64 } `json:"sum_received"`
			SumSentBidir     struct{ Bytes int64 } `json:"sum_sent_bidir_reverse"`
			SumReceivedBidir struct{ Bytes int64 } `json:"sum_received_bidir_reverse"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(report), &r); err != nil {
		t.Fatalf("iperf3's report: %v\n%s", err, report)
	}
	if r.Error != "" {
		t.Fatalf("iperf3: %s", r.Error)
	}
	if len(r.Intervals) < seconds {
		t.Fatalf("iperf3 reported %d intervals, want %d", len(r.Intervals), seconds)
	}
	for i, iv := range r.Intervals {
		var up, down int64
		for _, s := range iv.Streams {
			if s.Sender {
				up += s.Bytes
			} else {
				down += s.Bytes
			}
		}
		if up == 0 || down == 0 {
			t.Errorf("iperf3 interval %d moved %d bytes up, %d down: the stream stalled", i, up, down)
		}
	}
	t.Logf("iperf3 through two restarts: %d bytes up, %d bytes down in %d s",
		r.End.SumReceived.Bytes, r.End.SumReceivedBidir.Bytes, seconds)
	if r.End.SumReceived.Bytes == 0 || r.End.SumReceivedBidir.Bytes == 0 {
		t.Error("iperf3 received nothing in one direction")
	}
}

// waitServes waits until pid serves the handover socket: the new process
// listens on it once it serves.
func waitServes(t *testing.T, sock string, pid int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		got, err := handover.ServerPID(sock)
		if err == nil && got == pid {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the handover socket is served by pid %d (%v), want the new process %d", got, err, pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restartedPID reads from the log the pid of the process the n-th SIGHUP
// started (n from 1).
func restartedPID(t *testing.T, log string, n int) int {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if !strings.Contains(line, `"msg":"SIGHUP: restarting: a new process takes over"`) {
			continue
		}
		if n--; n > 0 {
			continue
		}
		var l struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.PID == 0 {
			t.Fatalf("a restart's log line without its pid: %s", line)
		}
		return l.PID
	}
	t.Fatalf("the log has no restart number %d", n)
	return 0
}

// processRuns reports whether pid exists and is not a zombie.
func processRuns(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// reapIfOurs reaps pid if it is a zombie child of this process (adopted as
// the subreaper).
func reapIfOurs(pid int) {
	var ws unix.WaitStatus
	_, _ = unix.Wait4(pid, &ws, unix.WNOHANG, nil)
}

// stopOrphan ends a proxy this test adopted: SIGTERM, then SIGKILL after
// 15 s, and reaps it.
func stopOrphan(t *testing.T, pid int) {
	if !processRuns(pid) {
		reapIfOurs(pid)
		return
	}
	_ = unix.Kill(pid, unix.SIGTERM)
	for deadline := time.Now().Add(15 * time.Second); processRuns(pid); {
		if time.Now().After(deadline) {
			t.Errorf("pid %d did not exit within 15 s of SIGTERM", pid)
			_ = unix.Kill(pid, unix.SIGKILL)
			break
		}
		reapIfOurs(pid)
		time.Sleep(20 * time.Millisecond)
	}
	reapIfOurs(pid)
}

// waitReady waits for /readyz, failing if the process exits first.
func waitReady(t *testing.T, b *binNS, exited <-chan error) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if code, _, err := b.get("/readyz"); err == nil && code == http.StatusOK {
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("userproxy exited before it was ready: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("userproxy not ready after 30 s")
		}
	}
}

// waitListening waits until a TCP port listens in namespace ns.
func waitListening(t *testing.T, ns string, port int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		out, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-Hltn", fmt.Sprintf("sport = :%d", port)).Output()
		if strings.TrimSpace(string(out)) != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on port %d in %s", port, ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// copyFile copies an executable.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestBinaryHandoverOldKilled: the old process is killed (SIGKILL) in the
// middle of a handover — a taker has connected to its handover socket and
// said hello, and waits for its answer. The taker starts clean: it opens
// the device again and serves. Every long-lived stream the dead process
// held ends with a reset, none hangs (the new process answers their
// segments with a RST: netstack.Options.StrayResets), new connections
// work, and once the new process stops nothing is left: no device, no
// route, no socket file.
func TestBinaryHandoverOldKilled(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	ep := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(c, c) })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho()))
	sock := filepath.Join(dir, "run", "upxkill0.handover")
	control := filepath.Join(dir, "run", "upxkill0.sock")
	args := func(extra ...string) []string {
		return append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxkill0",
			"--tcp-translate=true", "--tun-portable=false",
			"--handover-socket", sock, "--control-socket", control, "--min-sync-period", "0"}, extra...)
	}
	old := startProc(t, args()...)
	b.waitHealthy(old)

	// Streams that write and read their echo without pause: each has a
	// segment in flight when the old process dies.
	const streams = 20
	var (
		wg    sync.WaitGroup
		stop  atomic.Bool
		ended [streams]chan error
	)
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range streams {
		conn, err := b.c.dial("tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		ended[i] = make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			out, in := bytes.Repeat([]byte{byte(i)}, 1000), make([]byte, 1000)
			for !stop.Load() {
				// Long enough for the clients' backoff: a hang shows as
				// this deadline passing.
				_ = conn.SetDeadline(time.Now().Add(45 * time.Second))
				if _, err := conn.Write(out); err != nil {
					ended[i] <- err
					return
				}
				if _, err := io.ReadFull(conn, in); err != nil {
					ended[i] <- err
					return
				}
				if !bytes.Equal(in, out) {
					ended[i] <- errors.New("the echo differs")
					return
				}
			}
			ended[i] <- nil
		}()
	}
	time.Sleep(time.Second)

	// The old process stops where it stands; a taker connects and says
	// hello; the old process is killed before it can answer.
	if err := old.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	taker := startProc(t, args("--take-over")...)
	waitConnected(t, b.name, sock)
	if err := old.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.exited
	b.waitHealthy(taker)
	if !strings.Contains(taker.output(), "the running proxy died before it answered: a clean start") {
		t.Fatalf("the taker does not say the old process died in the handover:\n%s", taker.output())
	}
	if !strings.Contains(taker.output(), "ended without cleaning up") {
		t.Errorf("the taker does not say it answers the dead process's clients with RSTs:\n%s", taker.output())
	}

	start := time.Now()
	for i := range streams {
		select {
		case err := <-ended[i]:
			if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
				t.Errorf("stream %d ended with %v, want a reset", i, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("stream %d neither reset nor ended in 60 s", i)
		}
	}
	t.Logf("the %d streams of the killed process were reset within %v of the new process's start", streams, time.Since(start).Round(time.Millisecond))
	for n := range 5 {
		if got, err := b.fetchEcho("10.96.0.10:80", "ping"); err != nil || got != "ping" {
			t.Fatalf("connection %d through the new process: %q, %v", n, got, err)
		}
	}
	if _, body, err := b.get("/metrics"); err != nil {
		t.Error(err)
	} else if m := regexp.MustCompile(`(?m)^userproxy_gate_stray_resets_total (\d+)$`).FindStringSubmatch(body); m == nil {
		t.Error("no userproxy_gate_stray_resets_total in the new process's metrics")
	} else if n, _ := strconv.Atoi(m[1]); n < 1 {
		t.Errorf("userproxy_gate_stray_resets_total is %d", n)
	}

	if err := taker.stop(t); err != nil {
		t.Fatalf("the new process: %v", err)
	}
	if out, err := exec.Command("ip", "-n", b.name, "link", "show", "upxkill0").CombinedOutput(); err == nil {
		t.Errorf("the device is left behind:\n%s", out)
	}
	if out, _ := exec.Command("ip", "-n", b.name, "route", "show", "10.96.0.0/12").CombinedOutput(); len(bytes.TrimSpace(out)) != 0 {
		t.Errorf("a route is left behind: %s", out)
	}
	for _, p := range []string{sock, control} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is left behind", p)
		}
	}
}

// waitConnected waits until a connection to the unix socket at path
// waits in its backlog (its listener, not accepting, shows a receive queue
// of one or more in ss).
func waitConnected(t *testing.T, ns, path string) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; {
		out, _ := exec.Command("ip", "netns", "exec", ns, "ss", "-Hxl").Output()
		for _, line := range strings.Split(string(out), "\n") {
			// u_seq LISTEN <Recv-Q> <Send-Q> <path> ...
			if f := strings.Fields(line); len(f) >= 5 && strings.HasPrefix(f[4], path) {
				if n, _ := strconv.Atoi(f[2]); n > 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody connected to %s within 60 s:\n%s", path, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fetchEcho sends msg to addr and reads its echo.
func (b *binNS) fetchEcho(addr, msg string) (string, error) {
	c, err := b.c.dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return "", fmt.Errorf("after %d bytes: %w", len(got), err)
	}
	return string(got), nil
}

//go:build linux

package integration

import (
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A second `userproxy run` started by mistake while one serves leaves the
// first one's flows alone: with the same flags it fails on the health
// server's port; with its own ports but the same device it is refused the
// TUN, whose queues the first holds (a multi-queue device takes a queue from
// anyone who asks, and the kernel then moves flows onto it: openTUN checks
// the queues attached, as tun_attach refuses a single-queue device with
// EBUSY). Either way it exits non-zero at once, naming the cause, and an
// echo through the first every 10 ms never waits long: the gap between two
// answers is bounded at 190 ms, below the 200 ms a single lost segment
// costs (the least retransmission timeout, Linux's TCP_RTO_MIN and the
// translator's) and far above the 10-12 ms it takes here. The first run
// has two queues whatever the CPUs, so that the device is multi-queue and
// only run's own check, not the kernel's EBUSY, can refuse the second.
func TestBinarySecondRunLeavesFlowsAlone(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	ep := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(c, c) })
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho()))
	first := []string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxtwice0", "--tun-queues", "2", "--min-sync-period", "0"}
	p := startProc(t, first...)
	b.waitHealthy(p)

	for _, c := range []struct {
		name  string
		extra []string
		want  string
	}{
		{"same flags", nil, "10256"},
		{"own ports, same device", []string{"--healthz-bind-address", "127.0.0.1:20256", "--admin-addr", "127.0.0.1:20249"},
			"another process holds it"},
	} {
		t.Run(c.name, func(t *testing.T) {
			conn, err := b.c.dial("tcp", "10.96.0.10:80")
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// The echo loop: 10 ms apart, each answered within 5 s; the
			// longest wait between two answers is the gap.
			stop := make(chan struct{})
			gaps := make(chan time.Duration, 1)
			go func() {
				var worst time.Duration
				defer func() { gaps <- worst }()
				buf := make([]byte, 64)
				last := time.Now()
				for i := 0; i < 1000; i++ {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
					if _, err := conn.Write(buf); err != nil {
						worst = time.Hour
						return
					}
					if _, err := io.ReadFull(conn, buf); err != nil {
						worst = time.Hour
						return
					}
					worst = max(worst, time.Since(last))
					last = time.Now()
				}
			}()
			time.Sleep(300 * time.Millisecond)
			second := startProc(t, append(append([]string(nil), first...), c.extra...)...)
			var exitErr error
			select {
			case exitErr = <-second.exited:
			case <-time.After(30 * time.Second):
				t.Fatal("the second run did not exit within 30 s")
			}
			var ee interface{ ExitCode() int }
			if !errors.As(exitErr, &ee) || ee.ExitCode() == 0 {
				t.Errorf("the second run exited with %v, want a non-zero status", exitErr)
			}
			if !strings.Contains(second.output(), c.want) {
				t.Errorf("the second run's output does not name the cause (%q):\n%s", c.want, second.output())
			}
			time.Sleep(time.Second)
			close(stop)
			gap := <-gaps
			t.Logf("longest wait between two echoes through the first run: %v", gap)
			if gap == time.Hour {
				t.Fatal("the first run's flow broke while the second run started")
			}
			if gap >= 190*time.Millisecond {
				t.Errorf("an echo through the first run waited %v while the second run started", gap)
			}
		})
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("the first run: %v", err)
	}
}

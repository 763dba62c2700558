//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// manifestRestartFlags returns the flags of the shipped DaemonSet's proxy
// that govern restarts (--take-over, --after-handover, --handover-on-term),
// as the manifest gives them.
func manifestRestartFlags(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "examples", "kubernetes", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var flags []string
	for _, doc := range strings.Split(string(data), "\n---") {
		var ds appsv1.DaemonSet
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil || ds.Kind != "DaemonSet" {
			continue
		}
		for _, c := range ds.Spec.Template.Spec.Containers {
			for _, a := range c.Args {
				name, _, _ := strings.Cut(a, "=")
				switch name {
				case "--take-over", "--after-handover", "--handover-on-term":
					flags = append(flags, a)
				}
			}
		}
	}
	if len(flags) != 3 {
		t.Fatalf("daemonset.yaml's restart flags: %v, want --take-over, --after-handover and --handover-on-term", flags)
	}
	return flags
}

// TestBinaryRollingUpdate: the shipped DaemonSet's restart flags, run as
// its rolling update runs them (maxSurge: the new pod starts beside the
// old one; the old one gets SIGTERM once the new one is ready, which its
// readiness probe on the shared host port may say at once).
//
//  1. B starts beside A, and A gets SIGTERM at the same moment, before B
//     has taken over: A waits for B (--handover-on-term) instead of
//     draining, hands over, and exits 0.
//  2. C starts beside B, and B gets no signal: B hands over and stays
//     (--after-handover=wait: its kubelet would restart an exit, and the
//     restarted proxy would take over back); SIGTERM then ends it at once
//     with status 0.
//
// Echo streams through a ClusterIP run throughout; none sees a reset or a
// wrong byte, and each moves bytes after the second handover.
func TestBinaryRollingUpdate(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	restart := manifestRestartFlags(t)
	b := newBinNS(t)
	ep := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(c, c) })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho()))
	args := append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxroll0",
		"--tcp-translate=true", "--tun-portable=false", "--min-sync-period", "0",
		"--handover-socket", filepath.Join(dir, "run", "upxroll0.handover"),
		"--control-socket", filepath.Join(dir, "run", "upxroll0.sock")}, restart...)
	a := startProc(t, args...)
	b.waitHealthy(a)

	const streams = 10
	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		failures = make(chan error, streams)
		moved    [streams]atomic.Int64
	)
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range streams {
		conn, err := b.c.dial("tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			out, in := make([]byte, 2048), make([]byte, 2048)
			for n := 0; n < 100000 && !stop.Load(); n++ {
				size := 1 + rng.IntN(len(out))
				for j := range out[:size] {
					out[j] = byte(rng.Uint32())
				}
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := conn.Write(out[:size]); err != nil {
					failures <- fmt.Errorf("stream %d: write: %w", i, err)
					return
				}
				if _, err := io.ReadFull(conn, in[:size]); err != nil {
					failures <- fmt.Errorf("stream %d: read: %w", i, err)
					return
				}
				if !bytes.Equal(in[:size], out[:size]) {
					failures <- fmt.Errorf("stream %d: the echo differs", i)
					return
				}
				moved[i].Add(int64(size))
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)

	// 1. B beside A, and SIGTERM to A at once.
	bp := startProc(t, args...)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.exited:
		if err != nil {
			t.Fatalf("A exited with %v, want status 0 after handing over", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("A did not exit within 60 s of SIGTERM")
	}
	if !strings.Contains(a.output(), "waiting for a new process to take over before draining") || !strings.Contains(a.output(), `"msg":"handed over"`) {
		t.Errorf("A did not wait for B and hand over:\n%s", a.output())
	}
	if strings.Contains(a.output(), "draining flows") {
		t.Errorf("A drained its flows:\n%s", a.output())
	}
	b.waitHealthy(bp)
	time.Sleep(500 * time.Millisecond)

	// 2. C beside B, no signal: B hands over and waits.
	before := make([]int64, streams)
	for i := range before {
		before[i] = moved[i].Load()
	}
	cp := startProc(t, args...)
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(bp.output(), `"msg":"handed over"`); {
		if time.Now().After(deadline) {
			t.Fatalf("B did not hand over to C within 60 s:\n%s", bp.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case err := <-bp.exited:
		t.Fatalf("B exited (%v) after handing over; with --after-handover=wait it waits for a signal", err)
	case <-time.After(time.Second):
	}
	b.waitHealthy(cp)
	start := time.Now()
	if err := bp.stop(t); err != nil {
		t.Fatalf("B, stopped after handing over: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("B took %v to exit on SIGTERM after handing over, want at once", took)
	}

	time.Sleep(time.Second)
	stop.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		if errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("a reset: %v", err)
		} else {
			t.Error(err)
		}
	}
	for i := range before {
		if moved[i].Load() == before[i] {
			t.Errorf("stream %d moved no bytes after the second handover", i)
		}
	}
	// C is the last: on SIGTERM it waits --handover-on-term for a taker
	// that does not come, then drains and exits 0.
	if err := cp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cp.exited:
		if err != nil {
			t.Fatalf("C: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("C did not exit within 60 s of SIGTERM")
	}
	if !strings.Contains(cp.output(), "no new process took over") || !strings.Contains(cp.output(), "draining flows") {
		t.Errorf("C, stopped with no taker, did not wait and then drain:\n%s", cp.output())
	}
}

//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echoStreams are long-lived TCP connections to an echo endpoint through a
// ClusterIP, each writing random bytes and reading them back, both ways at
// once: every byte is checked as it returns, and each side's bytes are
// hashed, for a check at the end that nothing was lost, doubled or
// reordered across any number of handovers.
type echoStreams struct {
	stop     atomic.Bool
	wg       sync.WaitGroup
	failures chan error
	moved    []atomic.Int64
	sent     []hash.Hash
	echoed   []hash.Hash
}

// startEchoStreams opens n streams to addr from b's namespace.
func startEchoStreams(t *testing.T, b *binNS, addr string, n int) *echoStreams {
	t.Helper()
	s := &echoStreams{failures: make(chan error, n), moved: make([]atomic.Int64, n)}
	for i := range n {
		conn, err := b.c.dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		s.sent, s.echoed = append(s.sent, sha256.New()), append(s.echoed, sha256.New())
		s.wg.Add(2)
		done := make(chan struct{})
		go func() { // the writer
			defer s.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 23))
			out := make([]byte, 4096)
			for k := 0; k < 1000000 && !s.stop.Load(); k++ {
				size := 1 + rng.IntN(len(out))
				for j := range out[:size] {
					out[j] = byte(rng.Uint32())
				}
				_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
				if _, err := conn.Write(out[:size]); err != nil {
					s.failures <- fmt.Errorf("stream %d: write: %w", i, err)
					return
				}
				s.sent[i].Write(out[:size])
				time.Sleep(10 * time.Millisecond) // 200 streams of about 200 KB/s each: a load, not a flood
			}
			_ = conn.(*net.TCPConn).CloseWrite()
			<-done
		}()
		go func() { // the reader: the echo, checked against the same sequence
			defer s.wg.Done()
			defer close(done)
			defer conn.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 23))
			in := make([]byte, 4096)
			for {
				size := 1 + rng.IntN(len(in))
				want := make([]byte, size)
				for j := range want {
					want[j] = byte(rng.Uint32())
				}
				_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
				if _, err := io.ReadFull(conn, in[:size]); err != nil {
					if errors.Is(err, io.EOF) && s.stop.Load() {
						return // the echo of the writer's close, after its last chunk
					}
					s.failures <- fmt.Errorf("stream %d, after %d bytes: read: %w", i, s.moved[i].Load(), err)
					return
				}
				if !bytes.Equal(in[:size], want) {
					s.failures <- fmt.Errorf("stream %d, after %d bytes: the echo differs", i, s.moved[i].Load())
					return
				}
				s.echoed[i].Write(in[:size])
				s.moved[i].Add(int64(size))
			}
		}()
	}
	return s
}

// snapshot returns each stream's bytes echoed so far.
func (s *echoStreams) snapshot() []int64 {
	out := make([]int64, len(s.moved))
	for i := range s.moved {
		out[i] = s.moved[i].Load()
	}
	return out
}

// finish stops the streams (each half-closes and reads its echo to the
// end) and fails t for every error, every stream whose hashes differ and
// every stream that moved no bytes since before.
func (s *echoStreams) finish(t *testing.T, before []int64) {
	t.Helper()
	s.stop.Store(true)
	s.wg.Wait()
	close(s.failures)
	for err := range s.failures {
		t.Error(err)
	}
	for i := range s.moved {
		if !bytes.Equal(s.sent[i].Sum(nil), s.echoed[i].Sum(nil)) {
			t.Errorf("stream %d: the hash of the bytes echoed differs from that of the bytes sent", i)
		}
		if before != nil && s.moved[i].Load() == before[i] {
			t.Errorf("stream %d moved no bytes after the handovers", i)
		}
	}
}

// TestBinaryHandovers: 20 handovers in a row, alternating two builds of
// the binary, with 200 long-lived TCP streams through a ClusterIP moving
// bytes both ways and a client opening short connections all the while.
// Every stream's bytes come back intact (checked as they come, and by
// hash at the end), no stream sees a reset or an early EOF, no short
// connection fails, and every old process exits 0. The pause each new
// process logs is reported (p50, p99): a figure for docs/handover.md, not
// an assertion.
func TestBinaryHandovers(t *testing.T) {
	requireRoot(t)
	const (
		handovers = 20
		streams   = 200
	)
	bins := []string{userproxyBinary(t), otherUserproxyBinary(t)}
	b := newBinNS(t)
	ep := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(c, c) })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho()))
	args := func(bin string, extra ...string) []string {
		return append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxmany0",
			"--tcp-translate=true", "--tun-portable=false", "--min-sync-period", "0",
			"--handover-socket", filepath.Join(dir, "run", "upxmany0.handover"),
			"--control-socket", filepath.Join(dir, "run", "upxmany0.sock")}, extra...)
	}
	cur := startProc(t, args(bins[0])...)
	b.waitHealthy(cur)

	s := startEchoStreams(t, b, "10.96.0.10:80", streams)
	defer func() { s.stop.Store(true); s.wg.Wait() }()
	var shortOK, shortFailed atomic.Int64
	shortErr := make(chan error, 1)
	stopShort := make(chan struct{})
	var shortWG sync.WaitGroup
	shortWG.Add(1)
	go func() { // short connections, one after another
		defer shortWG.Done()
		for n := 0; n < 1000000; n++ {
			select {
			case <-stopShort:
				return
			default:
			}
			if got, err := b.fetchEcho("10.96.0.10:80", "ping"); err != nil || got != "ping" {
				if shortFailed.Add(1) == 1 {
					shortErr <- fmt.Errorf("a short connection: %q, %v", got, err)
				}
			} else {
				shortOK.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() {
		select {
		case <-stopShort:
		default:
			close(stopShort)
		}
		shortWG.Wait()
	}()
	time.Sleep(time.Second)
	before := s.snapshot()

	pauseRE := regexp.MustCompile(`"msg":"took over".*?"flowsMoved":(\d+).*?"paused":([0-9.]+)`)
	var pauses []time.Duration
	for i := range handovers {
		next := startProc(t, args(bins[(i+1)%2], "--take-over")...)
		select {
		case err := <-cur.exited:
			if err != nil {
				t.Fatalf("handover %d: the old process exited with %v, want status 0", i+1, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("handover %d: the old process did not exit within 60 s", i+1)
		}
		b.waitHealthy(next)
		m := pauseRE.FindStringSubmatch(next.output())
		if m == nil {
			t.Fatalf("handover %d: the new process did not log its takeover:\n%s", i+1, next.output())
		}
		if n, _ := strconv.Atoi(m[1]); n < streams {
			t.Errorf("handover %d moved %d flows, fewer than the %d streams", i+1, n, streams)
		}
		sec, _ := strconv.ParseFloat(m[2], 64)
		pauses = append(pauses, time.Duration(sec*float64(time.Second)))
		cur = next
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(time.Second)
	close(stopShort)
	shortWG.Wait()
	s.finish(t, before)
	select {
	case err := <-shortErr:
		t.Errorf("%v (%d of %d failed)", err, shortFailed.Load(), shortFailed.Load()+shortOK.Load())
	default:
	}
	slices.Sort(pauses)
	t.Logf("%d handovers, %d streams, %d short connections (%d failed): pause p50 %v, p99 %v, max %v (all: %v)",
		handovers, streams, shortOK.Load(), shortFailed.Load(), pauses[len(pauses)/2].Round(time.Microsecond),
		pauses[(len(pauses)*99+99)/100-1].Round(time.Microsecond), pauses[len(pauses)-1].Round(time.Microsecond), pauses)
	if err := cur.stop(t); err != nil {
		t.Fatalf("the last process: %v", err)
	}
}

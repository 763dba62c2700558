//go:build linux

package integration

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// A second binary, built apart (-trimpath: other bytes, the same snapshot
// format), for the handover test: versions of the same format hand over.
var (
	otherBuildOnce sync.Once
	otherBinPath   string
	otherBuildErr  error
)

func otherUserproxyBinary(t *testing.T) string {
	t.Helper()
	userproxyBinary(t) // the directory
	otherBuildOnce.Do(func() {
		otherBinPath = filepath.Join(binDir, "userproxy-other")
		out, err := exec.Command("go", "build", "-trimpath", "-o", otherBinPath, "github.com/userproxy/userproxy/cmd/userproxy").CombinedOutput()
		if err != nil {
			otherBuildErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if otherBuildErr != nil {
		t.Fatal(otherBuildErr)
	}
	return otherBinPath
}

// TestBinaryHandover: a running proxy hands its TUN and its translated TCP
// flows to a second binary started with --take-over, and exits 0 once the
// new one confirms; before that, a taker that fails after the state was
// sent leaves it serving, its flows taken back. Long-lived streams through a ClusterIP move bytes
// both ways throughout, each byte checked as it comes back from an echo
// endpoint; none sees a reset, an early EOF or a wrong byte, and each moves
// bytes after the handover; a client opening short connections all the
// while sees none fail. The pause the new process logs is reported.
func TestBinaryHandover(t *testing.T) {
	requireRoot(t)
	binA, binB := userproxyBinary(t), otherUserproxyBinary(t)
	b := newBinNS(t)
	ep := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(c, c) })
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	pinned := newPinnedService(t, b)
	writeFile(t, cfg, quickConfig(ep, b.udpEcho())+pinned.config)
	sock := filepath.Join(dir, "run", "upxho0.handover")
	control := filepath.Join(dir, "run", "upxho0.sock")
	// Translated flows on Linux's own TUN path, whatever the pass of
	// `make unit` (USERPROXY_TCP_TRANSLATE=0, USERPROXY_TUN=portable):
	// those are what moves (docs/handover.md).
	args := func(bin string, extra ...string) []string {
		return append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxho0",
			"--tcp-translate=true", "--tun-portable=false",
			"--handover-socket", sock, "--control-socket", control, "--min-sync-period", "0", "--log-level", "debug"}, extra...)
	}
	old := startProc(t, args(binA)...)
	b.waitHealthy(old)

	const streams = 50
	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		failures = make(chan error, streams+1)
		moved    [streams]atomic.Int64 // bytes echoed, per stream
	)
	defer func() { stop.Store(true); wg.Wait() }() // a failure below still stops them
	for i := range streams {
		conn, err := b.c.dial("tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { // a stream: writes, reads its echo, checks every byte
			defer wg.Done()
			defer conn.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			out, in := make([]byte, 4096), make([]byte, 4096)
			for n := 0; n < 100000 && !stop.Load(); n++ {
				size := 1 + rng.IntN(len(out))
				for j := range out[:size] {
					out[j] = byte(rng.Uint32())
				}
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				if _, err := conn.Write(out[:size]); err != nil {
					failures <- fmt.Errorf("stream %d, after %d bytes: write: %w", i, moved[i].Load(), err)
					return
				}
				if _, err := io.ReadFull(conn, in[:size]); err != nil {
					failures <- fmt.Errorf("stream %d, after %d bytes: read: %w", i, moved[i].Load(), err)
					return
				}
				if !bytes.Equal(in[:size], out[:size]) {
					failures <- fmt.Errorf("stream %d, after %d bytes: the echo differs", i, moved[i].Load())
					return
				}
				moved[i].Add(int64(size))
				time.Sleep(time.Millisecond)
			}
		}()
	}
	var shortOK, shortFailed atomic.Int64
	wg.Add(1)
	go func() { // short connections, one after another
		defer wg.Done()
		for n := 0; n < 100000 && !stop.Load(); n++ {
			err := func() error {
				c, err := b.c.dial("tcp", "10.96.0.10:80")
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))

				if _, err := c.Write([]byte("ping")); err != nil {
					return err
				}
				got := make([]byte, 4)
				if _, err := io.ReadFull(c, got); err != nil {
					return err
				}
				if string(got) != "ping" {
					return errors.New("a wrong answer")
				}
				return nil
			}()
			if err != nil {
				shortFailed.Add(1)
				if shortFailed.Load() == 1 {
					failures <- fmt.Errorf("a short connection failed: %w", err)
				}
			} else {
				shortOK.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	time.Sleep(time.Second)

	// A taker that fails after the state was sent (another --tun-name):
	// the old process takes its flows back and serves on.
	failed := startProc(t, args(binB, "--take-over", "--tun-name", "upxother0")...)
	select {
	case err := <-failed.exited:
		var ee interface{ ExitCode() int }
		if !errors.As(err, &ee) || ee.ExitCode() == 0 {
			t.Fatalf("a taker of another device exited with %v, want a non-zero status", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a failing taker did not exit within 30 s")
	}
	if !regexp.MustCompile(`reads TUN device "upxho0", --tun-name is "upxother0"`).MatchString(failed.output()) {
		t.Errorf("the failing taker does not say why:\n%s", failed.output())
	}
	servesOn := regexp.MustCompile(`"msg":"handover failed: serving on"`)
	for deadline := time.Now().Add(15 * time.Second); !servesOn.MatchString(old.output()); {
		if time.Now().After(deadline) {
			t.Fatalf("the old process does not say it serves on:\n%s", old.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second)

	before := make([]int64, streams)
	for i := range before {
		before[i] = moved[i].Load()
	}
	shortBefore := shortOK.Load()
	pins := pinned.pins(t)
	taker := startProc(t, args(binB, "--take-over")...)
	select {
	case err := <-old.exited:
		if err != nil {
			t.Fatalf("the old process exited with %v after handing over, want status 0", err)
		}
	case <-time.After(30 * time.Second):
		_ = old.cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, in its output
		<-old.exited
		t.Fatal("the old process did not exit within 30 s of the taker's start")
	}
	b.waitHealthy(taker)
	// The control socket is the taker's (the old process removed only its
	// own file), and it answers.
	for deadline := time.Now().Add(15 * time.Second); ; {
		c, err := net.Dial("unix", control)
		if err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the taker's control socket: %v\n%s", err, taker.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if regexp.MustCompile(`no control socket`).MatchString(taker.output()) {
		t.Errorf("the taker serves no control socket:\n%s", taker.output())
	}
	if _, body, err := b.get("/metrics"); err != nil {
		t.Error(err)
	} else if m := regexp.MustCompile(`(?m)^userproxy_handover_taken_flows\{result="moved"\} (\d+)$`).FindStringSubmatch(body); m == nil {
		t.Error("the taker's metrics have no userproxy_handover_taken_flows")
	} else if n, _ := strconv.Atoi(m[1]); n < streams {
		t.Errorf("the taker's metrics count %d flows moved, fewer than the %d streams", n, streams)
	}
	// ClientIP affinity held: every client goes to the endpoint it was
	// pinned to before (8 clients over 3 endpoints: a match by chance is
	// 1 in 6,561).
	if after := pinned.pins(t); !maps.Equal(after, pins) {
		t.Errorf("affinity pins before the handover %v, after %v", pins, after)
	}
	time.Sleep(2 * time.Second)
	stop.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	for i := range before {
		if moved[i].Load() == before[i] {
			t.Errorf("stream %d moved no bytes after the handover", i)
		}
	}
	if shortOK.Load() == shortBefore {
		t.Error("no short connection succeeded after the handover")
	}
	pause := regexp.MustCompile(`"msg":"took over".*?"paused":"?([0-9.a-zµ]+)`).FindStringSubmatch(taker.output())
	if pause == nil {
		t.Fatalf("the taker did not log its takeover:\n%s", taker.output())
	}
	t.Logf("handover: %d streams moved, %d short connections (%d failed), pause %s", streams, shortOK.Load(), shortFailed.Load(), pause[1])
	if !regexp.MustCompile(`"msg":"handed over".*"flowsMoved":[1-9]`).MatchString(old.output()) {
		t.Errorf("the old process did not log what moved:\n%s", old.output())
	}
	if err := taker.stop(t); err != nil {
		t.Fatalf("the new process: %v", err)
	}
}

// pinnedService is a Service with ClientIP affinity over three endpoints
// that name themselves, and clients of eight addresses of their own.
type pinnedService struct {
	b       *binNS
	config  string // its Service and EndpointSlice, to append to a config
	clients []netip.Addr
}

// newPinnedService starts the endpoints (127.0.0.1-3, one port) and adds
// the clients' addresses.
func newPinnedService(t *testing.T, b *binNS) *pinnedService {
	t.Helper()
	var port int
	for i, name := range []string{"one", "two", "three"} {
		var ln net.Listener
		err := b.c.run(func() (err error) {
			ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.%d:%d", i+1, port))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		port = int(serveTCP(t, ln, nameServer(name)).addr.Port())
	}
	p := &pinnedService{b: b}
	for i := range 8 {
		p.clients = append(p.clients, netip.AddrFrom4([4]byte{192, 0, 2, byte(11 + i)}))
	}
	err := inNS(b.ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, c := range p.clients {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(c, 32))}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	p.config = fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: pinned, namespace: default}
spec:
  clusterIP: 10.96.0.20
  clusterIPs: [10.96.0.20]
  sessionAffinity: ClientIP
  ports: [{name: http, protocol: TCP, port: 80, targetPort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: pinned-1, namespace: default, labels: {kubernetes.io/service-name: pinned}}
addressType: IPv4
endpoints: [{addresses: [127.0.0.1]}, {addresses: [127.0.0.2]}, {addresses: [127.0.0.3]}]
ports: [{name: http, protocol: TCP, port: %d}]
`, port, port)
	return p
}

// pins asks each client's endpoint three times; each must answer the same.
func (p *pinnedService) pins(t *testing.T) map[netip.Addr]string {
	t.Helper()
	pins := map[netip.Addr]string{}
	for _, c := range p.clients {
		for range 3 {
			var got []byte
			err := p.b.c.run(func() error {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: c.AsSlice()}, Timeout: 5 * time.Second}
				conn, err := d.Dial("tcp", "10.96.0.20:80")
				if err != nil {
					return err
				}
				defer conn.Close()
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				got, err = io.ReadAll(conn)
				return err
			})
			if err != nil {
				t.Fatalf("client %s: %v", c, err)
			}
			if prev, ok := pins[c]; ok && prev != string(got) {
				t.Fatalf("client %s went to %s, then to %s: no affinity", c, prev, got)
			}
			pins[c] = string(got)
		}
	}
	return pins
}

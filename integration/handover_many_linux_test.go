//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// echoStreams are long-lived TCP connections to an echo endpoint (through
// a ClusterIP, or a NodePort), each writing random bytes and reading them
// back, both ways at once. Each side's bytes are hashed, for a check at the
// end that nothing was lost, doubled, changed or reordered across any
// number of handovers. Cheap on purpose: CI runs it under the race
// detector, with 200 streams beside UDP flows that must not starve.
type echoStreams struct {
	name     string // what the errors call a stream
	stop     atomic.Bool
	wg       sync.WaitGroup
	failures chan error
	moved    []atomic.Int64
	sent     []hash.Hash // the writer's alone until stop
	echoed   []hash.Hash // the reader's alone until stop
}

// startEchoStreams opens n streams, each with a call of dial; the errors
// call them name 0 to n-1.
func startEchoStreams(t *testing.T, name string, dial func() (net.Conn, error), n int) *echoStreams {
	t.Helper()
	// Two errors a stream at most: its writer's and its reader's.
	s := &echoStreams{name: name, failures: make(chan error, 2*n), moved: make([]atomic.Int64, n),
		sent: make([]hash.Hash, n), echoed: make([]hash.Hash, n)}
	for i := range n {
		s.sent[i], s.echoed[i] = sha256.New(), sha256.New()
	}
	for i := range n {
		conn, err := dial()
		if err != nil {
			s.halt()
			t.Fatalf("%s %d: %v", name, i, err)
		}
		s.wg.Add(2)
		done := make(chan struct{})
		go func() { // the writer
			defer s.wg.Done()
			var seed [32]byte
			seed[0], seed[1] = byte(i), byte(i>>8)
			rng := rand.NewChaCha8(seed)
			out := make([]byte, 4096)
			for k := 0; k < 1000000 && !s.stop.Load(); k++ {
				size := 1 + int(rng.Uint64()%uint64(len(out)))
				_, _ = rng.Read(out[:size])
				_ = conn.SetWriteDeadline(time.Now().Add(20 * time.Second))
				if _, err := conn.Write(out[:size]); err != nil {
					s.failures <- fmt.Errorf("%s %d, after %d bytes: write: %w", s.name, i, s.moved[i].Load(), err)
					return
				}
				s.sent[i].Write(out[:size])
				time.Sleep(20 * time.Millisecond) // 200 streams of about 100 KB/s each: a load, not a flood
			}
			_ = conn.(*net.TCPConn).CloseWrite()
			<-done
		}()
		go func() { // the reader: the echo, hashed as it comes
			defer s.wg.Done()
			defer close(done)
			defer conn.Close()
			in := make([]byte, 16<<10)
			for {
				_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
				m, err := conn.Read(in)
				s.echoed[i].Write(in[:m])
				s.moved[i].Add(int64(m))
				if err != nil {
					if errors.Is(err, io.EOF) && s.stop.Load() {
						return // the echo of the writer's close, after its last chunk
					}
					s.failures <- fmt.Errorf("%s %d, after %d bytes: read: %w", s.name, i, s.moved[i].Load(), err)
					return
				}
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

// total returns the bytes echoed so far, over all streams.
func (s *echoStreams) total() int64 {
	var n int64
	for i := range s.moved {
		n += s.moved[i].Load()
	}
	return n
}

// halt stops the streams (each half-closes and reads its echo to the end)
// and waits for them.
func (s *echoStreams) halt() {
	s.stop.Store(true)
	s.wg.Wait()
}

// finish halts the streams and fails t for every error, every stream whose
// hashes differ and every stream that moved no bytes after mark (a
// snapshot taken after the last handover; nil: no such check).
func (s *echoStreams) finish(t *testing.T, mark []int64) {
	t.Helper()
	s.halt()
	reportAll(t, s.failures)
	for i := range s.moved {
		if !bytes.Equal(s.sent[i].Sum(nil), s.echoed[i].Sum(nil)) {
			t.Errorf("%s %d: the hash of the bytes echoed differs from that of the bytes sent", s.name, i)
		}
		if mark != nil && s.moved[i].Load() == mark[i] {
			t.Errorf("%s %d moved no bytes after the last handover", s.name, i)
		}
	}
}

// reportAll closes failures, whose senders are done, and fails t for each
// error in it.
func reportAll(t *testing.T, failures chan error) {
	t.Helper()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
}

// TestBinaryHandovers (issue 49's done-when): 20 handovers in a row,
// alternating two builds of the binary, while
//   - 200 long-lived TCP streams through a ClusterIP move bytes both ways;
//   - 50 UDP flows (50 client sockets) exchange datagrams with a Service of
//     three endpoints that answer with their names;
//   - a long-lived TCP stream from another namespace, through a veth, moves
//     bytes both ways through a NodePort;
//   - a client opens short connections one after another.
//
// Every stream's bytes come back intact (checked as they come, and by hash
// at the end), no stream sees a reset or an early EOF, and each moves bytes
// after the last handover; no short connection fails; every UDP flow is
// answered by the endpoint that answered it first, and again after the
// last handover; eight clients pinned by ClientIP affinity over three
// endpoints are pinned to the same ones after the last handover as before
// the first; every old process exits 0, and every new one moves the streams
// and the UDP flows. The pause each new process logs is reported (p50,
// p99): a figure for docs/handover.md, not an assertion.
//
// Addresses: the proxy's namespace has 198.18.0.1/30 on a veth whose peer,
// 198.18.0.2/30, is in the NodePort client's namespace (RFC 2544's
// benchmarking range); neither namespace has a default route.
func TestBinaryHandovers(t *testing.T) {
	requireRoot(t)
	const (
		handovers = 20
		streams   = 200
		udpFlows  = 50
		nodePort  = 30090
	)
	bins := []string{userproxyBinary(t), otherUserproxyBinary(t)}
	b := newBinNS(t)
	npNS, npName := newNetNS(t)
	npLink := vethSpec{local: "upxnpc0", peer: "upxnpp0",
		localAddr: netip.MustParsePrefix("198.18.0.2/30"), peerAddr: netip.MustParsePrefix("198.18.0.1/30")}
	if err := npLink.create(npNS, b.ns); err != nil {
		t.Fatalf("the veth from %s to %s: %v", npName, b.name, err)
	}
	ep := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(c, c) })
	pinned := newPinnedService(t, b)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho())+pinned.config+udpNamesService(t, b)+fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: npecho, namespace: default}
spec:
  type: NodePort
  clusterIP: 10.96.0.50
  clusterIPs: [10.96.0.50]
  ports: [{name: http, protocol: TCP, port: 80, nodePort: %d}]
`, nodePort)+sliceYAML("npecho-1", "npecho", ep, ""))
	args := func(bin string, extra ...string) []string {
		return append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxmany0",
			"--tcp-translate=true", "--tun-portable=false", "--min-sync-period", "0",
			"--nodeport-addresses", "127.0.0.0/8,198.18.0.0/30",
			"--handover-socket", filepath.Join(dir, "run", "upxmany0.handover"),
			"--control-socket", filepath.Join(dir, "run", "upxmany0.sock")}, extra...)
	}
	cur := startProc(t, args(bins[0])...)
	b.waitHealthy(cur)

	s := startEchoStreams(t, "stream", func() (net.Conn, error) { return b.c.dial("tcp", "10.96.0.10:80") }, streams)
	defer s.halt()
	np := startEchoStreams(t, "NodePort stream", func() (net.Conn, error) { // from the other namespace
		var c net.Conn
		err := inNS(npNS, func() (err error) {
			c, err = net.DialTimeout("tcp", netip.AddrPortFrom(npLink.peerAddr.Addr(), nodePort).String(), 10*time.Second)
			return err
		})
		return c, err
	}, 1)
	defer np.halt()
	u := startUDPFlows(t, b, udpNamesAddr, udpFlows)
	defer u.halt()
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
			// One to the ClusterIP, one to the NodePort from the other
			// namespace: the NodePort's listener is lent to each new
			// process, so no connection to it is refused in a handover.
			for _, fetch := range []struct {
				what  string
				fetch func() (string, error)
			}{
				{"to the ClusterIP", func() (string, error) { return b.fetchEcho("10.96.0.10:80", "ping") }},
				{"to the NodePort", func() (string, error) {
					return fetchEchoIn(npNS, netip.AddrPortFrom(npLink.peerAddr.Addr(), nodePort), "ping")
				}},
			} {
				if got, err := fetch.fetch(); err != nil || got != "ping" {
					if shortFailed.Add(1) == 1 {
						shortErr <- fmt.Errorf("a short connection %s: %q, %v", fetch.what, got, err)
					}
				} else {
					shortOK.Add(1)
				}
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
	u.waitAll(t, "answered", func(i int) bool { return u.replies[i].Load() >= 5 })
	time.Sleep(time.Second)
	udpBefore, pins := u.endpoints(), pinned.pins(t)

	tookOver := regexp.MustCompile(`"msg":"took over".*?"flowsMoved":(\d+).*?"udpFlowsMoved":(\d+),"udpFlowsDropped":(\d+).*?"paused":([0-9.]+)`)
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
		m := tookOver.FindStringSubmatch(next.output())
		if m == nil {
			t.Fatalf("handover %d: the new process did not log its takeover:\n%s", i+1, next.output())
		}
		if n, _ := strconv.Atoi(m[1]); n < streams {
			t.Errorf("handover %d moved %d flows, fewer than the %d streams", i+1, n, streams)
		}
		if n, _ := strconv.Atoi(m[2]); n < udpFlows || m[3] != "0" {
			t.Errorf("handover %d moved %s UDP flows and dropped %s, want at least %d moved and none dropped", i+1, m[2], m[3], udpFlows)
		}
		sec, _ := strconv.ParseFloat(m[4], 64)
		pauses = append(pauses, time.Duration(sec*float64(time.Second)))
		cur = next
		time.Sleep(300 * time.Millisecond)
	}
	u.answerAgain(t, "answered after the last handover")
	if got := pinned.pins(t); !maps.Equal(got, pins) {
		t.Errorf("affinity pins before the first handover %v, after the last %v", pins, got)
	}
	after, npAfter := s.snapshot(), np.snapshot()
	time.Sleep(time.Second)
	close(stopShort)
	shortWG.Wait()
	s.finish(t, after)
	np.finish(t, npAfter)
	u.finish(t, udpBefore)
	select {
	case err := <-shortErr:
		t.Errorf("%v (%d of %d failed)", err, shortFailed.Load(), shortFailed.Load()+shortOK.Load())
	default:
	}
	slices.Sort(pauses)
	t.Logf("%d handovers; %d TCP streams, %d UDP flows (%d datagrams lost), NodePort stream %d bytes, %d short connections (%d failed): pause p50 %v, p99 %v, max %v (all: %v)",
		handovers, streams, udpFlows, u.lost.Load(), np.total(), shortOK.Load(), shortFailed.Load(), pauses[len(pauses)/2].Round(time.Microsecond),
		pauses[(len(pauses)*99+99)/100-1].Round(time.Microsecond), pauses[len(pauses)-1].Round(time.Microsecond), pauses)
	if err := cur.stop(t); err != nil {
		t.Fatalf("the last process: %v", err)
	}
}

// fetchEchoIn sends msg to addr from namespace ns and reads its echo.
func fetchEchoIn(ns netns.NsHandle, addr netip.AddrPort, msg string) (string, error) {
	var c net.Conn
	if err := inNS(ns, func() (err error) { c, err = net.DialTimeout("tcp", addr.String(), 5*time.Second); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		return "", err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return "", err
	}
	return string(got), nil
}

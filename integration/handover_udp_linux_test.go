//go:build linux

package integration

import (
	"errors"
	"fmt"
	"net"
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

// TestBinaryHandoverUDP: a running proxy hands its UDP flows to a second
// binary started with --take-over. 50 client sockets (50 source ports)
// exchange datagrams with a UDP Service of three endpoints that each answer
// with their own name, all the while. After the handover every flow still
// reaches the endpoint it had before, and datagrams flow both ways; the
// taker says the UDP flows moved.
func TestBinaryHandoverUDP(t *testing.T) {
	requireRoot(t)
	binA, binB := userproxyBinary(t), otherUserproxyBinary(t)
	b := newBinNS(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(b.tcpEndpoint("web"), b.udpEcho())+udpNamesService(t, b))
	sock := filepath.Join(dir, "run", "upxhu0.handover")
	args := func(bin string, extra ...string) []string {
		return append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxhu0",
			"--tun-portable=false", "--handover-socket", sock, "--control-socket", "none",
			"--min-sync-period", "0", "--log-level", "info"}, extra...)
	}
	old := startProc(t, args(binA)...)
	b.waitHealthy(old)

	const flows = 50
	f := startUDPFlows(t, b, udpNamesAddr, flows)
	defer f.halt() // a failure below still stops them
	f.waitAll(t, "answered", func(i int) bool { return f.replies[i].Load() >= 5 })
	before := f.endpoints()
	seen := map[string]int{}
	for _, name := range before {
		seen[name]++
	}
	t.Logf("flows per endpoint before the handover: %v", seen)

	taker := startProc(t, args(binB, "--take-over")...)
	select {
	case err := <-old.exited:
		if err != nil {
			t.Fatalf("the old process exited with %v after handing over, want status 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the old process did not exit within 30 s of the taker's start")
	}
	b.waitHealthy(taker)
	f.answerAgain(t, "answered after the handover")
	f.finish(t, before)
	t.Logf("datagrams lost (a read timed out): %d", f.lost.Load())

	// The old process handed the UDP flows over, the taker took them.
	if m := regexp.MustCompile(`"msg":"handed over".*"udpFlowsMoved":(\d+)`).FindStringSubmatch(old.output()); m == nil {
		t.Errorf("the old process does not log the UDP flows it handed over:\n%s", old.output())
	} else if n, _ := strconv.Atoi(m[1]); n < flows {
		t.Errorf("the old process handed over %d UDP flows, want at least %d", n, flows)
	}
	m := regexp.MustCompile(`"msg":"took over".*"udpFlowsMoved":(\d+),"udpFlowsDropped":(\d+)`).FindStringSubmatch(taker.output())
	if m == nil {
		t.Fatalf("the taker does not log the UDP flows it took:\n%s", taker.output())
	}
	if n, _ := strconv.Atoi(m[1]); n < flows {
		t.Errorf("the taker took %d UDP flows, want at least %d", n, flows)
	}
	if m[2] != "0" {
		t.Errorf("the taker dropped %s UDP flows", m[2])
	}
	if _, body, err := b.get("/metrics"); err != nil {
		t.Error(err)
	} else if m := regexp.MustCompile(`(?m)^userproxy_handover_taken_flows\{result="moved"\} (\d+)$`).FindStringSubmatch(body); m == nil {
		t.Error("the taker's metrics have no userproxy_handover_taken_flows")
	} else if n, _ := strconv.Atoi(m[1]); n < flows {
		t.Errorf("the taker's metrics count %d flows moved, fewer than the %d UDP flows", n, flows)
	}
	if err := taker.stop(t); err != nil {
		t.Errorf("the taker's stop: %v", err)
	}
}

// udpNamesAddr is the ClusterIP and port of udpNamesService.
const udpNamesAddr = "10.96.0.30:53"

// udpNamesService starts three UDP endpoints in b's namespace (127.0.0.1-3,
// one port), each answering a datagram with its own name, a space and the
// datagram, and returns their Service (names, UDP udpNamesAddr) and
// EndpointSlice, to append to a config.
func udpNamesService(t *testing.T, b *binNS) string {
	t.Helper()
	var port int
	for i, name := range []string{"one", "two", "three"} {
		var pc net.PacketConn
		err := b.c.run(func() (err error) {
			pc, err = net.ListenPacket("udp", fmt.Sprintf("127.0.0.%d:%d", i+1, port))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		port = int(serveUDP(t, pc, func(q []byte) []byte { return append([]byte(name+" "), q...) }).Port())
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Service
metadata: {name: names, namespace: default}
spec:
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30]
  ports: [{name: names, protocol: UDP, port: 53, targetPort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: names-1, namespace: default, labels: {kubernetes.io/service-name: names}}
addressType: IPv4
endpoints: [{addresses: [127.0.0.1]}, {addresses: [127.0.0.2]}, {addresses: [127.0.0.3]}]
ports: [{name: names, protocol: UDP, port: %d}]
`, port, port)
}

// udpFlows are client sockets of b's namespace (a source port each), each
// sending a numbered datagram every 10 ms to a Service of endpoints that
// answer with their names (udpNamesService) and waiting up to a second for
// its answer. A flow keeps the name that answered it first, and fails when
// another endpoint answers it later.
type udpFlows struct {
	stop     atomic.Bool
	wg       sync.WaitGroup
	failures chan error
	replies  []atomic.Int64
	lost     atomic.Int64   // reads that timed out: UDP, the next datagram goes on
	endpoint []atomic.Value // string: the name that answered first
}

// startUDPFlows starts n flows to addr.
func startUDPFlows(t *testing.T, b *binNS, addr string, n int) *udpFlows {
	t.Helper()
	f := &udpFlows{failures: make(chan error, n), replies: make([]atomic.Int64, n), endpoint: make([]atomic.Value, n)}
	for i := range n {
		conn, err := b.c.dial("udp", addr)
		if err != nil {
			f.halt()
			t.Fatal(err)
		}
		f.wg.Add(1)
		go func() { // a flow: sends a numbered datagram, waits for its answer
			defer f.wg.Done()
			defer conn.Close()
			buf := make([]byte, 256)
			for n := 0; !f.stop.Load(); n++ {
				q := fmt.Sprintf("flow %d datagram %d", i, n)
				_ = conn.SetDeadline(time.Now().Add(time.Second))
				if _, err := conn.Write([]byte(q)); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
					f.failures <- fmt.Errorf("flow %d: write: %w", i, err)
					return
				}
				for { // earlier answers, late, are skipped
					m, err := conn.Read(buf)
					if err != nil {
						f.lost.Add(1)
						break
					}
					name, got, _ := strings.Cut(string(buf[:m]), " ")
					if got != q {
						continue
					}
					if first, _ := f.endpoint[i].Load().(string); first == "" {
						f.endpoint[i].Store(name)
					} else if first != name {
						f.failures <- fmt.Errorf("flow %d: datagram %d answered by %q, the flow had %q", i, n, name, first)
						return
					}
					f.replies[i].Add(1)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	return f
}

// waitAll waits up to 15 s until ok(i) holds for every flow i; a flow's
// failure fails t at once.
func (f *udpFlows) waitAll(t *testing.T, what string, ok func(i int) bool) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := 0
		for i := range f.replies {
			if ok(i) {
				n++
			}
		}
		if n == len(f.replies) {
			return
		}
		select {
		case err := <-f.failures:
			t.Fatal(err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d flows %s after 15 s", n, len(f.replies), what)
		}
	}
}

// answerAgain waits until every flow has 10 answers more than it has now.
func (f *udpFlows) answerAgain(t *testing.T, what string) {
	t.Helper()
	counts := make([]int64, len(f.replies))
	for i := range counts {
		counts[i] = f.replies[i].Load()
	}
	f.waitAll(t, what, func(i int) bool { return f.replies[i].Load() >= counts[i]+10 })
}

// endpoints returns the name that answered each flow first ("" if none yet).
func (f *udpFlows) endpoints() []string {
	out := make([]string, len(f.replies))
	for i := range out {
		out[i], _ = f.endpoint[i].Load().(string)
	}
	return out
}

// halt stops the flows and waits for them.
func (f *udpFlows) halt() {
	f.stop.Store(true)
	f.wg.Wait()
}

// finish halts the flows and fails t for every flow's failure and every
// flow whose first endpoint is not the one in before.
func (f *udpFlows) finish(t *testing.T, before []string) {
	t.Helper()
	f.halt()
	reportAll(t, f.failures)
	for i, got := range f.endpoints() {
		if got != before[i] {
			t.Errorf("flow %d: endpoint %q after the handover, %q before", i, got, before[i])
		}
	}
}

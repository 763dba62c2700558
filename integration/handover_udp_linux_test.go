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
	names := []string{"one", "two", "three"}
	var port int
	for i, name := range names {
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
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(b.tcpEndpoint("web"), b.udpEcho())+fmt.Sprintf(`---
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
`, port, port))
	sock := filepath.Join(dir, "run", "upxhu0.handover")
	args := func(bin string, extra ...string) []string {
		return append([]string{"ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxhu0",
			"--tun-portable=false", "--handover-socket", sock, "--control-socket", "none",
			"--min-sync-period", "0", "--log-level", "info"}, extra...)
	}
	old := startProc(t, args(binA)...)
	b.waitHealthy(old)

	const flows = 50
	var (
		wg       sync.WaitGroup
		stop     atomic.Bool
		failures = make(chan error, flows)
		replies  [flows]atomic.Int64
		lost     atomic.Int64
		endpoint [flows]atomic.Value // string: the name that answered first
	)
	defer func() { stop.Store(true); wg.Wait() }() // a failure below still stops them
	for i := range flows {
		conn, err := b.c.dial("udp", "10.96.0.30:53")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { // a flow: sends a numbered datagram, waits for its answer
			defer wg.Done()
			defer conn.Close()
			buf := make([]byte, 256)
			for n := 0; !stop.Load(); n++ {
				q := fmt.Sprintf("flow %d datagram %d", i, n)
				_ = conn.SetDeadline(time.Now().Add(time.Second))
				if _, err := conn.Write([]byte(q)); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
					failures <- fmt.Errorf("flow %d: write: %w", i, err)
					return
				}
				for { // earlier answers, late, are skipped
					m, err := conn.Read(buf)
					if err != nil {
						lost.Add(1) // UDP: the next datagram goes on
						break
					}
					name, got, _ := strings.Cut(string(buf[:m]), " ")
					if got != q {
						continue
					}
					if first, _ := endpoint[i].Load().(string); first == "" {
						endpoint[i].Store(name)
					} else if first != name {
						failures <- fmt.Errorf("flow %d: datagram %d answered by %q, the flow had %q", i, n, name, first)
						return
					}
					replies[i].Add(1)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	waitAll := func(what string, ok func(i int) bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			n := 0
			for i := range flows {
				if ok(i) {
					n++
				}
			}
			if n == flows {
				return
			}
			select {
			case err := <-failures:
				t.Fatal(err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d flows %s after 15 s", n, flows, what)
			}
		}
	}
	waitAll("answered", func(i int) bool { return replies[i].Load() >= 5 })
	before := make([]string, flows)
	seen := map[string]int{}
	for i := range flows {
		before[i] = endpoint[i].Load().(string)
		seen[before[i]]++
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
	counts := make([]int64, flows)
	for i := range counts {
		counts[i] = replies[i].Load()
	}
	waitAll("answered after the handover", func(i int) bool { return replies[i].Load() >= counts[i]+10 })
	stop.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		t.Error(err)
	}
	for i := range flows {
		if got := endpoint[i].Load().(string); got != before[i] {
			t.Errorf("flow %d: endpoint %q after the handover, %q before", i, got, before[i])
		}
	}
	t.Logf("datagrams lost (a read timed out): %d", lost.Load())

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

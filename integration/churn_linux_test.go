//go:build linux

package integration

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
)

// Endpoint churn: every 100 ms an endpoint of a TCP and a UDP service leaves
// or comes back, for a minute (10 s with -short; USERPROXY_CHURN_DURATION
// sets it: `make soak` runs 10 minutes), while 50 clients keep long TCP
// streams, 10 UDP flows run and one client opens short connections
// back to back. No TCP flow may be cut (kube-proxy keeps established flows
// to removed endpoints, and ours keep running); no short connection may
// fail; a UDP flow whose endpoint left must reach a live endpoint with its
// next datagram; no goroutines or file descriptors may be left over. RSS,
// goroutines and flows handled are logged ten times along the way.
func TestEndpointChurn(t *testing.T) {
	requireRoot(t)
	duration := time.Minute
	if testing.Short() {
		duration = 10 * time.Second
	}
	if v := os.Getenv("USERPROXY_CHURN_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("USERPROXY_CHURN_DURATION=%q: %v", v, err)
		}
		duration = d
	}
	h, cl := tunEnv{}.start(t, testSeed(t, 21))

	// Six TCP echo endpoints and six UDP echo endpoints; the first two of
	// each never leave.
	const n = 6
	tcpEPs := make([]netip.AddrPort, n)
	udpEPs := make([]netip.AddrPort, n)
	for i := range n {
		name := fmt.Sprintf("ep%d", i)
		tcpEPs[i] = startTCPBackend(t, "127.0.0.1", lineEcho(name)).addr
		udpEPs[i] = startUDPEcho(t, name)
	}
	active := make([]bool, n)
	for i := range active {
		active[i] = true
	}
	// One slice per endpoint (their ports differ): an endpoint leaves or
	// returns with its slices.
	set := func(i int, on bool) {
		tcp := epSlice(fmt.Sprintf("churn-tcp-%d", i), "churn", v1.ProtocolTCP, tcpEPs[i])
		udp := epSlice(fmt.Sprintf("churn-udp-%d", i), "churn", v1.ProtocolUDP, udpEPs[i])
		if on {
			h.tracker.OnEndpointSliceAdd(tcp)
			h.tracker.OnEndpointSliceAdd(udp)
		} else {
			h.tracker.OnEndpointSliceDelete(tcp)
			h.tracker.OnEndpointSliceDelete(udp)
		}
	}
	h.tracker.OnServiceAdd(&v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "churn"},
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: "10.96.0.20", ClusterIPs: []string{"10.96.0.20"},
			Ports: []v1.ServicePort{{Name: "tcp", Protocol: v1.ProtocolTCP, Port: 80}, {Name: "udp", Protocol: v1.ProtocolUDP, Port: 53}}},
	})
	for i := range n {
		set(i, true)
	}
	// The baseline: the rig and the endpoints, before any client.
	goroutinesBefore, fdsBefore := runtime.NumGoroutine(), openFDs(t)

	// 50 long TCP streams.
	var cut atomic.Int64
	var firstCut atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 50 {
		conn, err := cl.dial("tcp", "10.96.0.20:80")
		if err != nil {
			t.Fatalf("stream %d: %v", c, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			rd := bufio.NewReader(conn)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
				msg := fmt.Sprintf("c%d-%d\n", c, i)
				if _, err := conn.Write([]byte(msg)); err != nil {
					cut.Add(1)
					firstCut.CompareAndSwap(nil, err.Error())
					return
				}
				if _, err := rd.ReadString('\n'); err != nil {
					cut.Add(1)
					firstCut.CompareAndSwap(nil, err.Error())
					return
				}
			}
		}()
	}

	// 10 UDP flows.
	var udpConns []net.PacketConn
	for range 10 {
		pc, err := cl.listenPacket("udp4")
		if err != nil {
			t.Fatal(err)
		}
		udpConns = append(udpConns, pc)
	}
	svc := &net.UDPAddr{IP: net.IPv4(10, 96, 0, 20), Port: 53}
	ask := func(pc net.PacketConn) (string, error) {
		buf := make([]byte, 64)
		for try := 0; try < 3; try++ {
			if _, err := pc.WriteTo([]byte("?"), svc); err != nil {
				return "", err
			}
			_ = pc.SetReadDeadline(time.Now().Add(time.Second))
			n, _, err := pc.ReadFrom(buf)
			if err == nil {
				return string(buf[:n]), nil
			}
		}
		return "", fmt.Errorf("no answer")
	}

	// Short connections back to back, all the while.
	var shortOK, shortFailed atomic.Int64
	var firstShortErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			conn, err := cl.dial("tcp", "10.96.0.20:80")
			if err == nil {
				rd := bufio.NewReader(conn)
				_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err = conn.Write([]byte("short\n")); err == nil {
					_, err = rd.ReadString('\n')
				}
				conn.Close()
			}
			if err != nil {
				shortFailed.Add(1)
				firstShortErr.CompareAndSwap(nil, err.Error())
				continue
			}
			shortOK.Add(1)
		}
	}()

	// Churn: every 100 ms one of the churning endpoints flips; after a
	// removal every UDP flow's next datagram must reach a live endpoint.
	start := time.Now()
	end := start.Add(duration)
	nextSample := start.Add(duration / 10)
	flips, moves := 0, 0
	for time.Now().Before(end) {
		if time.Now().After(nextSample) {
			nextSample = nextSample.Add(duration / 10)
			ps := h.px.Stats()
			t.Logf("at %v: RSS %s, goroutines %d, live flows %d, TCP proxied %d, UDP proxied %d, short ok %d failed %d",
				time.Since(start).Round(time.Second), currentRSS(), runtime.NumGoroutine(), ps.LiveFlows,
				ps.Flows[0][proxy.ResultProxied], ps.Flows[1][proxy.ResultProxied], shortOK.Load(), shortFailed.Load())
		}
		i := 2 + flips%(n-2)
		active[i] = !active[i]
		set(i, active[i])
		flips++
		if !active[i] {
			gone := fmt.Sprintf("ep%d", i)
			for _, pc := range udpConns {
				got, err := ask(pc)
				if err != nil {
					t.Fatalf("UDP flow after removing %s: %v", gone, err)
				}
				if got == gone {
					t.Fatalf("a UDP flow still reached %s after it left", gone)
				}
				moves++
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	for _, pc := range udpConns {
		pc.Close()
	}
	t.Logf("%d endpoint flips over %v; %d UDP checks after removals; TCP streams cut: %d; short connections: %d ok, %d failed; peak RSS %s",
		flips, duration, moves, cut.Load(), shortOK.Load(), shortFailed.Load(), peakRSS())
	if cut.Load() != 0 {
		t.Fatalf("%d TCP streams were cut (first: %v)", cut.Load(), firstCut.Load())
	}
	if shortFailed.Load() != 0 {
		t.Fatalf("%d short connections failed (first: %v)", shortFailed.Load(), firstShortErr.Load())
	}

	// No leftovers once the clients are gone (the rig itself still runs).
	// UDP flows live until their conntrack entries expire (30 s / 120 s):
	// flush them, as their expiry would.
	h.ct.Delete(conntrack.Filter{Protocol: conntrack.UDP})
	waitFor(t, "the proxied flows to end", func() bool { return h.px.Flows() == 0 })
	g, f := runtime.NumGoroutine(), openFDs(t)
	t.Logf("before the clients and after the churn: goroutines %d -> %d, fds %d -> %d", goroutinesBefore, g, fdsBefore, f)
	if g > goroutinesBefore+5 || f > fdsBefore+5 {
		t.Fatalf("goroutines %d -> %d, fds %d -> %d: something leaks", goroutinesBefore, g, fdsBefore, f)
	}
}

// lineEcho answers each line with name and the line.
func lineEcho(name string) func(net.Conn) {
	return func(c net.Conn) {
		rd := bufio.NewReader(c)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := c.Write([]byte(name + " " + l)); err != nil {
				return
			}
		}
	}
}

// startUDPEcho answers every datagram with name, until the test ends.
func startUDPEcho(t *testing.T, name string) netip.AddrPort {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveUDP(t, pc, func([]byte) []byte { return []byte(name) })
}

// epSlice is an EndpointSlice of svc holding one endpoint, for the service
// port named after proto ("tcp" or "udp").
func epSlice(name, svc string, proto v1.Protocol, ep netip.AddrPort) *discoveryv1.EndpointSlice {
	portName := "tcp"
	if proto == v1.ProtocolUDP {
		portName = "udp"
	}
	port := int32(ep.Port())
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ep.Addr().String()}}},
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
}

func openFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// currentRSS reads VmRSS of this process.
func currentRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err.Error()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

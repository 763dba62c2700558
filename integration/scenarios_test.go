package integration

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/internal/stats"
	"github.com/userproxy/userproxy/proxy"
)

// Three endpoints, 3000 connections: every endpoint gets its third
// (chi-square at p > 0.001, seeded lottery).
func scenarioTCPSplitAcrossEndpoints(t *testing.T, e env) {
	h, cl := e.start(t, testSeed(t, 3))
	names := []string{"a", "b", "c"}
	var eps []netip.AddrPort
	for _, n := range names {
		eps = append(eps, startTCPBackend(t, "127.0.0.1", nameServer(n)).addr)
	}
	h.addService("web", "10.96.0.10", v1.ProtocolTCP, 80, false, eps...)

	counts := map[string]int{}
	for range 3000 {
		c, err := cl.dial("tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		counts[string(b)]++
	}
	obs := []int{counts["a"], counts["b"], counts["c"]}
	r, err := stats.GoodnessOfFit(obs, stats.Uniform(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("split %v: %v", obs, r)
	if r.P <= 0.001 || obs[0]+obs[1]+obs[2] != 3000 {
		t.Fatalf("split %v fails the chi-square test: %v", obs, r)
	}
	if s := h.px.Stats(); s.Flows[0][proxy.ResultProxied] != 3000 {
		t.Errorf("proxied flows counted %d, want 3000", s.Flows[0][proxy.ResultProxied])
	}
}

// ClientIP affinity pins the in-process client to one endpoint.
func scenarioTCPAffinityPinsClient(t *testing.T, e env) {
	h, cl := e.start(t, testSeed(t, 4))
	var eps []netip.AddrPort
	for _, n := range []string{"a", "b", "c"} {
		eps = append(eps, startTCPBackend(t, "127.0.0.1", nameServer(n)).addr)
	}
	h.addService("sticky", "10.96.0.11", v1.ProtocolTCP, 80, true, eps...)
	seen := map[string]int{}
	for range 60 {
		c, err := cl.dial("tcp", "10.96.0.11:80")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(c)
		c.Close()
		seen[string(b)]++
	}
	if len(seen) != 1 {
		t.Fatalf("affinity did not pin the client: %v", seen)
	}
	if hits := h.px.Stats().AffinityHits; hits != 59 {
		t.Errorf("affinity hits %d, want 59", hits)
	}
}

// A closed endpoint port: the client is refused with a RST (dial first, then
// complete the handshake), not accepted and then closed.
func scenarioTCPClosedEndpointIsRefused(t *testing.T, e env) {
	h, cl := e.start(t, 5)
	h.addService("down", "10.96.0.12", v1.ProtocolTCP, 80, false, closedPort(t))
	_, err := cl.dial("tcp", "10.96.0.12:80")
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dial: %v, want connection refused", err)
	}
	if s := h.px.Stats(); s.Flows[0][proxy.ResultDialFailed] != 1 {
		t.Errorf("dial_failed %d, want 1", s.Flows[0][proxy.ResultDialFailed])
	}
}

// No service at the address, and a service without endpoints: refused by an
// ICMP port unreachable from the gate.
func scenarioTCPRejectNoServiceAndNoEndpoints(t *testing.T, e env) {
	h, cl := e.start(t, 6)
	h.addService("empty", "10.96.0.13", v1.ProtocolTCP, 80, false)
	for _, addr := range []string{"10.96.0.99:80", "10.96.0.13:80", "10.96.0.13:81"} {
		_, err := cl.dial("tcp", addr)
		if err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("dial %s: %v, want connection refused", addr, err)
		}
	}
	if s := h.st.Stats(); s.Rejected != 3 {
		t.Errorf("gate rejected %d flows, want 3", s.Rejected)
	}
}

// 10,000 refused dials leave no in-flight slot behind: once the endpoint
// is up, the next connection succeeds.
func scenarioNoInFlightLeakAfterRefusedDials(t *testing.T, e env) {
	if testing.Short() {
		t.Skip("10,000 connections")
	}
	h, cl := e.start(t, 7)
	down := closedPort(t)
	h.addService("flaky", "10.96.0.14", v1.ProtocolTCP, 80, false, down)
	for i := range 10000 {
		if _, err := cl.dial("tcp", "10.96.0.14:80"); err == nil {
			t.Fatalf("dial %d succeeded with the endpoint down", i)
		}
	}
	// The last refusals may still be releasing their slots when the client
	// already saw the RST.
	waitFor(t, "every in-flight slot to be released", func() bool { return h.st.Stats().TCPInFlight == 0 })
	ln, err := net.Listen("tcp", down.String())
	if err != nil {
		t.Fatalf("re-listening on %s: %v", down, err)
	}
	b := &tcpBackend{ln: ln, addr: down}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.WriteString(c, "up")
			c.Close()
		}
	}()
	defer b.stop()
	conn, err := cl.dial("tcp", "10.96.0.14:80")
	if err != nil {
		t.Fatalf("the 10,001st connection failed: %v", err)
	}
	got, _ := io.ReadAll(conn)
	conn.Close()
	if string(got) != "up" {
		t.Fatalf("read %q", got)
	}
}

// 64 MiB each way at once, checked with SHA-256 on both ends.
func scenarioTCPBulkBothWays(t *testing.T, e env) {
	const size = 64 << 20
	h, cl := e.start(t, 8)
	var mu sync.Mutex
	var backendGot [32]byte
	backendSent := make([]byte, 32)
	be := startTCPBackend(t, "127.0.0.1", func(c net.Conn) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			hs := sha256.New()
			_, _ = io.Copy(hs, c)
			mu.Lock()
			copy(backendGot[:], hs.Sum(nil))
			mu.Unlock()
		}()
		hs := sha256.New()
		_, _ = io.Copy(io.MultiWriter(c, hs), io.LimitReader(rand.Reader, size))
		mu.Lock()
		copy(backendSent, hs.Sum(nil))
		mu.Unlock()
		c.(*net.TCPConn).CloseWrite()
		wg.Wait()
	})
	h.addService("bulk", "10.96.0.15", v1.ProtocolTCP, 80, false, be.addr)
	c, err := cl.dial("tcp", "10.96.0.15:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sentHash := make(chan []byte, 1)
	go func() {
		hs := sha256.New()
		_, _ = io.Copy(io.MultiWriter(c, hs), io.LimitReader(rand.Reader, size))
		c.(interface{ CloseWrite() error }).CloseWrite()
		sentHash <- hs.Sum(nil)
	}()
	hs := sha256.New()
	n, err := io.Copy(hs, c)
	if err != nil || n != size {
		t.Fatalf("client read %d bytes, err %v; want %d", n, err, size)
	}
	clientSent := <-sentHash
	be.stop()
	mu.Lock()
	defer mu.Unlock()
	if !bytes.Equal(hs.Sum(nil), backendSent) {
		t.Error("endpoint -> client: SHA-256 mismatch")
	}
	if !bytes.Equal(backendGot[:], clientSent) {
		t.Error("client -> endpoint: SHA-256 mismatch")
	}
}

// The client half-closes and still reads the whole response.
func scenarioTCPHalfClose(t *testing.T, e env) {
	h, cl := e.start(t, 9)
	be := startTCPBackend(t, "127.0.0.1", func(c net.Conn) {
		req, _ := io.ReadAll(c) // until the client's FIN
		time.Sleep(10 * time.Millisecond)
		_, _ = c.Write(bytes.Repeat(req, 1000))
	})
	h.addService("half", "10.96.0.16", v1.ProtocolTCP, 80, false, be.addr)
	c, err := cl.dial("tcp", "10.96.0.16:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "ping")
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || len(got) != 4000 || !bytes.HasPrefix(got, []byte("pingping")) {
		t.Fatalf("after half-close read %d bytes (err %v), want 4000", len(got), err)
	}
}

// An endpoint's RST reaches the client as a reset.
func scenarioTCPResetPropagates(t *testing.T, e env) {
	h, cl := e.start(t, 10)
	be := startTCPBackend(t, "127.0.0.1", func(c net.Conn) {
		buf := make([]byte, 1)
		_, _ = c.Read(buf)
		_ = c.(*net.TCPConn).SetLinger(0)
	})
	h.addService("rst", "10.96.0.17", v1.ProtocolTCP, 80, false, be.addr)
	c, err := cl.dial("tcp", "10.96.0.17:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("x"))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	if err == nil || !strings.Contains(err.Error(), "reset") {
		t.Fatalf("read after the endpoint's RST: %v, want a connection reset", err)
	}
}

// UDP echo through the ClusterIP; the replies come from the ClusterIP:port.
func scenarioUDPEcho(t *testing.T, e env) {
	for _, fam := range []struct{ name, host, clusterIP, network string }{
		{"IPv4", "127.0.0.1", "10.96.0.53", "udp4"},
		{"IPv6", "::1", "fd00:96::53", "udp6"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			h, cl := e.start(t, 11)
			pc, err := net.ListenPacket("udp", net.JoinHostPort(fam.host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			h.addService("dns", fam.clusterIP, v1.ProtocolUDP, 53, false, serveUDP(t, pc, echoPrefixed))

			c, err := cl.listenPacket(fam.network)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			svc := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(fam.clusterIP), 53))
			buf := make([]byte, 2048)
			for i := range 5 {
				msg := []byte{'m', byte('0' + i)}
				if _, err := c.WriteTo(msg, svc); err != nil {
					t.Fatal(err)
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					t.Fatalf("datagram %d: %v\nstack %+v\nconntrack %+v\nproxy %+v", i, err, h.st.Stats(), h.ct.Stats(), h.px.Stats())
				}
				if got := string(buf[:n]); got != "echo:"+string(msg) {
					t.Fatalf("datagram %d: got %q", i, got)
				}
				if fromAP := from.(*net.UDPAddr).AddrPort(); fromAP.Addr().Unmap() != svc.AddrPort().Addr() || fromAP.Port() != 53 {
					t.Fatalf("reply from %v, want %v", from, svc)
				}
			}
		})
	}
}

// IPv6: a TCP service on an IPv6 ClusterIP with endpoints on ::1.
func scenarioTCPIPv6(t *testing.T, e env) {
	h, cl := e.start(t, 12)
	be := startTCPBackend(t, "::1", nameServer("six"))
	h.addService("v6", "fd00:96::10", v1.ProtocolTCP, 80, false, be.addr)
	c, err := cl.dial("tcp", "[fd00:96::10]:80")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(c)
	c.Close()
	if string(got) != "six" {
		t.Fatalf("got %q", got)
	}
	if _, err := cl.dial("tcp", "[fd00:96::11]:80"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("IPv6 address without a service: %v, want refused", err)
	}
}

// A UDP endpoint that leaves: its conntrack entries go at once, so the next
// datagram picks a live endpoint.
func scenarioUDPEndpointRemovalMovesFlow(t *testing.T, e env) {
	h, cl := e.start(t, 13)
	var eps []netip.AddrPort
	for _, name := range []string{"a", "b"} {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, serveUDP(t, pc, func([]byte) []byte { return []byte(name) }))
	}
	a, b := eps[0], eps[1]
	h.addService("u", "10.96.0.54", v1.ProtocolUDP, 53, false, a, b)
	c, err := cl.listenPacket("udp4")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	svc := &net.UDPAddr{IP: net.ParseIP("10.96.0.54"), Port: 53}
	ask := func() string {
		t.Helper()
		if _, err := c.WriteTo([]byte("?"), svc); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 16)
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		return string(buf[:n])
	}
	first := ask()
	if ask() != first {
		t.Fatal("one UDP flow reached two endpoints")
	}
	// Remove the endpoint the flow is on (slice 0 holds "a", slice 1 "b").
	idx := 0
	if first == "b" {
		idx = 1
	}
	h.removeSlice("u", idx)
	if got := ask(); got == first {
		t.Fatalf("after endpoint %q left, the next datagram still reached it", first)
	}
	if n := h.ct.Stats().Deleted; n != 1 {
		t.Errorf("conntrack entries deleted %d, want 1", n)
	}
}

// A stray ACK (no connection) from the client side is INVALID: dropped and
// counted, and the stack writes nothing back (no RST).
func scenarioStrayACKIsDropped(t *testing.T, e env) {
	h, cl := e.start(t, 14)
	be := startTCPBackend(t, "127.0.0.1", nameServer("a"))
	h.addService("web", "10.96.0.18", v1.ProtocolTCP, 80, false, be.addr)
	before := h.st.Stats()
	pkt := tcpSegment(cl.addr4(), 40000, netip.MustParseAddr("10.96.0.18"), 80, flagACK, 1000, 2000)
	if err := cl.inject(pkt); err != nil {
		t.Fatal(err)
	}
	stray := func() uint64 { return h.ct.Stats().Invalid[conntrack.ReasonNoEntryNotSYN] }
	waitFor(t, "the stray ACK to reach the gate", func() bool { return stray() > 0 })
	time.Sleep(50 * time.Millisecond) // a RST, if any, would be written by now
	after := h.st.Stats()
	if n := stray(); n != 1 || after.InvalidIn <= before.InvalidIn {
		t.Errorf("stray ACKs counted %d (InvalidIn %d -> %d), want 1", n, before.InvalidIn, after.InvalidIn)
	}
	if after.PacketsOut != before.PacketsOut {
		t.Errorf("the stack wrote %d packets after the stray ACK (a RST?)", after.PacketsOut-before.PacketsOut)
	}
}

// scenarios run against every env: in-process always, on a real TUN as root.
var scenarios = []struct {
	name string
	run  func(*testing.T, env)
}{
	{"TCPSplitAcrossEndpoints", scenarioTCPSplitAcrossEndpoints},
	{"TCPAffinityPinsClient", scenarioTCPAffinityPinsClient},
	{"TCPClosedEndpointIsRefused", scenarioTCPClosedEndpointIsRefused},
	{"TCPRejectNoServiceAndNoEndpoints", scenarioTCPRejectNoServiceAndNoEndpoints},
	{"NoInFlightLeakAfterRefusedDials", scenarioNoInFlightLeakAfterRefusedDials},
	{"TCPBulkBothWays", scenarioTCPBulkBothWays},
	{"TCPHalfClose", scenarioTCPHalfClose},
	{"TCPResetPropagates", scenarioTCPResetPropagates},
	{"UDPEcho", scenarioUDPEcho},
	{"TCPIPv6", scenarioTCPIPv6},
	{"UDPEndpointRemovalMovesFlow", scenarioUDPEndpointRemovalMovesFlow},
	{"StrayACKIsDropped", scenarioStrayACKIsDropped},
}

func runScenarios(t *testing.T, e env) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, e) })
	}
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

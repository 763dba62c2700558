package proxy

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
)

// freePort returns a loopback port nothing listens on (TCP and UDP).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// loopbackNodePorts serves p's NodePorts on 127.0.0.1 until the test ends
// and starts an echo endpoint on loopback, whose port it returns.
func loopbackNodePorts(t *testing.T, p *Proxy) (*NodePorts, int) {
	t.Helper()
	np := p.NewNodePorts([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	t.Cleanup(np.Close)
	ep, err := echoOn(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return np, ep.Addr().(*net.TCPAddr).Port
}

// TestNodePortsOnLoopback: a NodePort Service is served on 127.0.0.1:
// TCP reaches the endpoint with a conntrack entry listing the address the
// client used, which goes when the connection ends; UDP is relayed both
// ways; a port taken on the host is reported, not fatal; a NodePort that
// leaves the table is closed.
func TestNodePortsOnLoopback(t *testing.T) {
	p, tr, ct := newTestProxyWith(t, Config{}, true)
	np, epPort := loopbackNodePorts(t, p)
	uep := udpEcho(t, "127.0.0.1:0")
	tcpNP, udpNP := freePort(t), freePort(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	takenPort := taken.Addr().(*net.TCPAddr).Port

	nodePort := func(n int) func(*v1.Service) {
		return func(s *v1.Service) { s.Spec.Type = v1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = int32(n) }
	}
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, nodePort(tcpNP)))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, int32(epPort), "", "127.0.0.1"))
	tr.OnServiceAdd(svc("dns", "10.96.0.2", v1.ProtocolUDP, 53, nodePort(udpNP)))
	tr.OnEndpointSliceAdd(slice("dns", "dns-1", v1.ProtocolUDP, int32(uep.LocalAddr().(*net.UDPAddr).Port), "", "127.0.0.1"))
	tr.OnServiceAdd(svc("clash", "10.96.0.3", v1.ProtocolTCP, 80, nodePort(takenPort)))
	tr.OnEndpointSliceAdd(slice("clash", "clash-1", v1.ProtocolTCP, int32(epPort), "", "127.0.0.1"))
	tr.OnSynced()
	np.Sync(p.Table())

	if f := np.Failed(); len(f) != 1 || !strings.Contains(f[0], "TCP 127.0.0.1:"+itoa(takenPort)) {
		t.Fatalf("Failed: %q", f)
	}
	if np.Listening() != 2 {
		t.Fatalf("listening on %d sockets, want 2", np.Listening())
	}

	c, err := net.DialTimeout("tcp", "127.0.0.1:"+itoa(tcpNP), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	expectExchange(t, c, c, "hello")
	list := ct.List(conntrack.Filter{Protocol: conntrack.TCP})
	if len(list) != 1 || list[0].Original.Dst() != netip.MustParseAddrPort("127.0.0.1:"+itoa(tcpNP)) ||
		list[0].State != conntrack.TCPEstablished || list[0].Endpoint.Port() != uint16(epPort) {
		t.Fatalf("conntrack: %v", list)
	}
	c.Close()
	for deadline := time.Now().Add(5 * time.Second); len(ct.List(conntrack.Filter{Protocol: conntrack.TCP})) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the entry outlived the connection")
		}
	}

	uc, err := net.Dial("udp", "127.0.0.1:"+itoa(udpNP))
	if err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	_ = uc.SetDeadline(time.Now().Add(5 * time.Second))
	for _, msg := range []string{"one", "two"} {
		if _, err := io.WriteString(uc, msg); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		n, err := uc.Read(buf)
		if err != nil || string(buf[:n]) != uep.LocalAddr().String() { // the endpoint answers its address
			t.Fatalf("UDP NodePort: %q %v", buf[:n], err)
		}
	}
	if l := ct.List(conntrack.Filter{Protocol: conntrack.UDP}); len(l) != 1 {
		t.Fatalf("UDP entries: %v", l)
	}

	// The web Service goes: its NodePort closes.
	tr.OnServiceDelete(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, nodePort(tcpNP)))
	np.Sync(p.Table())
	if _, err := net.DialTimeout("tcp", "127.0.0.1:"+itoa(tcpNP), time.Second); err == nil {
		t.Fatal("the NodePort of a deleted Service still accepts")
	}
}

// TestNodePortReopensAClosedFlowsTuple: the kernel accepts a connection on
// the 4-tuple of one whose socket is in TIME_WAIT (tcp_timewait_state_process,
// TCP_TW_SYN) while that old flow's handler has not yet deleted its entry.
// The test holds such an entry, bound to an old flow, and connects from the
// same client port: the new connection is proxied, not reset, as the
// kernel's conntrack reopens a TIME_WAIT entry on a SYN. The old flow is
// handed to the reaper only after the TIME_WAIT timeout (its last copies
// are its own until then), and is then reset.
func TestNodePortReopensAClosedFlowsTuple(t *testing.T) {
	const timeWait = 7 * time.Second
	clk := conntrack.NewManualClock(0)
	p, tr, ct := newTestProxyWith(t, Config{Conntrack: conntrack.Config{Clock: clk, Timeouts: conntrack.Timeouts{TCPTimeWait: timeWait}}}, true)
	np, epPort := loopbackNodePorts(t, p)
	nodePort, clientPort := freePort(t), freePort(t)
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(nodePort)
	}))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, int32(epPort), "", "127.0.0.1"))
	tr.OnSynced()
	np.Sync(p.Table())

	client := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(clientPort))
	tuple := conntrack.MakeTuple(conntrack.TCP, client, netip.AddrPortFrom(client.Addr(), uint16(nodePort)))
	if err := ct.Track(tuple); err != nil {
		t.Fatal(err)
	}
	var oldEnded atomic.Bool
	old := newFlow(tuple, true, conntrack.Binding{}, func(bool) { oldEnded.Store(true) })
	if !p.track(old) {
		t.Fatal("track the old flow")
	}

	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(client), Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", "127.0.0.1:"+itoa(nodePort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	expectExchange(t, c, c, "hello")
	if s := p.Stats(); s.Flows[0][ResultRejectedNoService] != 0 || s.Flows[0][ResultProxied] != 1 {
		t.Fatalf("flow counters %+v, want one proxied and none refused", s.Flows[0])
	}
	i, ok := ct.Get(tuple)
	if newer, _ := i.Owner.(*flow); !ok || newer == nil || newer == old {
		t.Fatalf("entry %+v present %v: want it bound to the new flow", i, ok)
	}
	p.flows.mu.Lock()
	queued := p.flows.queued
	p.flows.mu.Unlock()
	if queued != 0 || oldEnded.Load() {
		t.Fatalf("the reopened flow was queued (%d) or ended (%v) at once: its handler owns its end", queued, oldEnded.Load())
	}
	if ct.DeleteFlow(tuple, old) {
		t.Fatal("the old flow deleted the new flow's entry")
	}
	// It lingers for the TIME_WAIT timeout; after that, still up, it is
	// queued, and the proxy's reaper resets it.
	clk.Advance(timeWait - 1)
	p.queueLingering()
	p.flows.mu.Lock()
	queued, lingering := p.flows.queued, len(p.flows.lingering)
	p.flows.mu.Unlock()
	if queued != 0 || lingering != 1 || oldEnded.Load() {
		t.Fatalf("before its grace is up: %d queued, %d lingering, ended %v; want 0, 1, false", queued, lingering, oldEnded.Load())
	}
	clk.Advance(1)
	p.queueLingering()
	for deadline := time.Now().Add(5 * time.Second); !oldEnded.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the reopened flow outlived its grace")
		}
	}
	p.untrack(old)
	expectExchange(t, c, c, "still up")
	p.flows.mu.Lock()
	lingering = len(p.flows.lingering)
	p.flows.mu.Unlock()
	if lingering != 0 {
		t.Fatalf("%d flows still lingering", lingering)
	}
}

// TestEndedFlowDoesNotLinger: a flow that ended on its own before a SYN
// reopened its entry (the usual case on the TUN path, where the TIME_WAIT
// entry outlives the flow) is not held for the grace; one that ends during
// it is forgotten at the next sweep.
func TestEndedFlowDoesNotLinger(t *testing.T) {
	p, _, _ := newTestProxyWith(t, Config{}, false)
	tuple := conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.1:80"))
	gone := newFlow(tuple, true, conntrack.Binding{}, func(bool) { t.Error("an ended flow was ended again") })
	p.untrack(gone)
	live := newFlow(tuple, true, conntrack.Binding{}, func(bool) { t.Error("a flow that ended on its own was reset") })
	for _, f := range []*flow{gone, live} {
		p.OnConntrackRemove(conntrack.EntryInfo{Owner: f}, conntrack.RemoveReopened)
	}
	p.flows.mu.Lock()
	lingering := len(p.flows.lingering)
	p.flows.mu.Unlock()
	if lingering != 1 {
		t.Fatalf("%d lingering, want only the live flow", lingering)
	}
	p.untrack(live)
	p.queueLingering()
	p.flows.mu.Lock()
	lingering, queued := len(p.flows.lingering), p.flows.queued
	p.flows.mu.Unlock()
	if lingering != 0 || queued != 0 {
		t.Fatalf("after it ended: %d lingering, %d queued; want none", lingering, queued)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

package proxy

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
)

// udpMoveSide is one process of an in-process handover: a proxy, running,
// over a memory link that the test reads and writes as the TUN.
type udpMoveSide struct {
	p    *Proxy
	st   *netstack.Stack
	link *netstack.MemoryLink
}

// newUDPMoveSide serves 10.96.0.53:53 over UDP from endpoints (one slice
// each, so that each may have its own port).
func newUDPMoveSide(t *testing.T, endpoints []net.PacketConn) *udpMoveSide {
	t.Helper()
	p, tr, ct := newTestProxyWith(t, Config{}, true)
	link := netstack.NewMemoryLink(0, 256)
	st, err := netstack.New(netstack.Options{Link: &link.Link, Conntrack: ct, Admit: p.Admit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.SetFlowHandler(p)
	tr.OnServiceAdd(svc("dns", "10.96.0.53", v1.ProtocolUDP, 53))
	for i, e := range endpoints {
		a := e.LocalAddr().(*net.UDPAddr)
		tr.OnEndpointSliceAdd(slice("dns", "dns-"+strconv.Itoa(i), v1.ProtocolUDP, int32(a.Port), "", a.IP.String()))
	}
	tr.OnSynced()
	// Run starts the reply poller on its goroutine: a flow set up before
	// it relays its replies on a goroutine of its own, and does not move.
	for deadline := time.Now().Add(5 * time.Second); p.poller.Load() == nil; {
		if time.Now().After(deadline) {
			t.Fatal("no reply poller after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	return &udpMoveSide{p: p, st: st, link: link}
}

var udpMoveService = netip.MustParseAddrPort("10.96.0.53:53")

// ask sends msg from client to the service through the side's link and
// returns the reply's payload ("" for none within wait).
func (s *udpMoveSide) ask(t *testing.T, client netip.AddrPort, msg string, wait time.Duration) string {
	t.Helper()
	s.link.Inject(ipv4UDP(client, udpMoveService, []byte(msg)))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		p := s.link.Read(ctx)
		if p == nil {
			return ""
		}
		if from, to, payload, ok := parseIPv4UDP(p); ok && from == udpMoveService && to == client {
			return string(payload)
		}
	}
}

// ipv4UDP builds an IPv4 UDP datagram with valid checksums.
func ipv4UDP(src, dst netip.AddrPort, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0], b[8], b[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[10:], ^onesSum(0, b[:20]))
	u := b[20:]
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	pseudo := append(append(append([]byte{}, s[:]...), d[:]...), 0, 17, byte(len(u)>>8), byte(len(u)))
	sum := ^onesSum(uint32(onesSum(0, pseudo)), u)
	if sum == 0 {
		sum = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	return b
}

func onesSum(sum uint32, b []byte) uint16 {
	for ; len(b) >= 2; b = b[2:] {
		sum += uint32(binary.BigEndian.Uint16(b))
	}
	if len(b) == 1 {
		sum += uint32(b[0]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return uint16(sum)
}

// parseIPv4UDP returns an IPv4 UDP datagram's addresses and payload.
func parseIPv4UDP(p []byte) (from, to netip.AddrPort, payload []byte, ok bool) {
	if len(p) < 28 || p[0]>>4 != 4 || p[9] != 17 {
		return from, to, nil, false
	}
	ihl := int(p[0]&0x0f) * 4
	if len(p) < ihl+8 {
		return from, to, nil, false
	}
	u := p[ihl:]
	from = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[12:16])), binary.BigEndian.Uint16(u[0:]))
	to = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[16:20])), binary.BigEndian.Uint16(u[2:]))
	return from, to, u[8:], true
}

// asFiles duplicates fds as SCM_RIGHTS would, for the next process.
func asFiles(t *testing.T, fds []int) []*os.File {
	t.Helper()
	var files []*os.File
	for _, fd := range fds {
		nfd, err := syscall.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		syscall.CloseOnExec(nfd)
		files = append(files, os.NewFile(uintptr(nfd), "moved"))
	}
	return files
}

// udpMoveClients starts a flow from each of n clients through s and
// returns each client's endpoint.
func udpMoveClients(t *testing.T, s *udpMoveSide, n int) map[netip.AddrPort]string {
	t.Helper()
	got := make(map[netip.AddrPort]string)
	for i := range n {
		c := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.7"), uint16(40000+i))
		if got[c] = s.ask(t, c, "hello", 3*time.Second); got[c] == "" {
			t.Fatalf("client %v: no answer", c)
		}
	}
	waitFlows(t, s.p, n)
	return got
}

// A UDP flow handed to another proxy keeps its endpoint, and carries
// datagrams both ways there; detached, it does nothing in the old proxy;
// forgotten, it leaves the old proxy's live set but not its entry there.
func TestUDPFlowsMove(t *testing.T) {
	eps := []net.PacketConn{udpEcho(t, "127.0.0.1:0"), udpEcho(t, "127.0.0.2:0"), udpEcho(t, "127.0.0.3:0")}
	old := newUDPMoveSide(t, eps)
	const clients = 12
	before := udpMoveClients(t, old, clients)

	moved, fds := old.p.DetachFlows()
	if len(moved.UDP) != clients || len(moved.TCP) != 0 || len(fds) != clients {
		t.Fatalf("detached %d UDP and %d TCP flows with %d sockets, want %d UDP flows", len(moved.UDP), len(moved.TCP), len(fds), clients)
	}
	for c := range before {
		if got := old.ask(t, c, "detached?", 100*time.Millisecond); got != "" {
			t.Fatalf("client %v: a detached flow answered %q", c, got)
		}
		break
	}

	next := newUDPMoveSide(t, eps)
	tcp, udp, err := next.p.AdoptFlows(next.st, moved, asFiles(t, fds))
	if err != nil || tcp != 0 || udp != clients {
		t.Fatalf("adopted %d TCP and %d UDP flows: %v", tcp, udp, err)
	}
	old.p.ForgetDetached()
	next.p.StartAdopted(next.st)
	for c, ep := range before {
		for i := range 3 {
			if got := next.ask(t, c, "moved", 3*time.Second); got != ep {
				t.Fatalf("client %v, datagram %d after the move: answer from %q, want %q", c, i, got, ep)
			}
		}
	}
	if n := old.p.Flows(); n != 0 {
		t.Errorf("%d flows live in the old proxy after it forgot them", n)
	}
	if n := old.p.Conntrack().Stats().EntriesUDP; n != clients {
		t.Errorf("%d UDP entries in the old proxy's table, want the %d it handed over", n, clients)
	}
	if n := next.p.Flows(); n != clients {
		t.Errorf("%d flows live in the new proxy, want %d", n, clients)
	}
	for _, e := range next.p.Conntrack().List(conntrack.Filter{}) {
		if ep, err := netip.ParseAddrPort(before[e.Original.Src()]); err != nil || e.Endpoint != ep {
			t.Errorf("entry %v bound to %v, want %v", e.Original, e.Endpoint, before[e.Original.Src()])
		}
	}
}

// A handover that fails puts the UDP flows back: they carry on in the old
// proxy, to the same endpoints.
func TestUDPFlowsReattach(t *testing.T) {
	eps := []net.PacketConn{udpEcho(t, "127.0.0.1:0"), udpEcho(t, "127.0.0.2:0")}
	old := newUDPMoveSide(t, eps)
	before := udpMoveClients(t, old, 6)
	moved, _ := old.p.DetachFlows()
	if len(moved.UDP) != 6 {
		t.Fatalf("detached %d UDP flows, want 6", len(moved.UDP))
	}
	old.p.ReattachFlows()
	for c, ep := range before {
		if got := old.ask(t, c, "back", 3*time.Second); got != ep {
			t.Fatalf("client %v after the failed handover: answer from %q, want %q", c, got, ep)
		}
	}
	if n := old.p.Flows(); n != 6 {
		t.Errorf("%d flows live, want 6", n)
	}
}

// A UDP flow that cannot be adopted (its socket is not connected to the
// endpoint it claims) is dropped: no entry, no flow, its socket closed.
func TestUDPFlowNotAdopted(t *testing.T) {
	eps := []net.PacketConn{udpEcho(t, "127.0.0.1:0")}
	old := newUDPMoveSide(t, eps)
	udpMoveClients(t, old, 2)
	moved, fds := old.p.DetachFlows()
	moved.UDP[0].Endpoint = netip.MustParseAddrPort("127.0.0.9:9")
	next := newUDPMoveSide(t, eps)
	_, udp, err := next.p.AdoptFlows(next.st, moved, asFiles(t, fds))
	if err == nil || udp != 1 {
		t.Fatalf("adopted %d of 2 UDP flows (%v), want 1 and an error", udp, err)
	}
	next.p.StartAdopted(next.st)
	old.p.ForgetDetached()
	if n := next.p.Conntrack().Stats().EntriesUDP; n != 1 {
		t.Errorf("%d UDP entries, want the adopted flow's only", n)
	}
	if n := next.p.Flows(); n != 1 {
		t.Errorf("%d flows, want 1", n)
	}
}

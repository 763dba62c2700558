package integration

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// IPVS's schedulers through the real binary on a real TUN (issue 18): four
// Services over the same three endpoints, one per scheduler, and
// `userproxy ipvs` read back as ipvsadm -Ln's layout.

// holdServer writes name, then holds the connection until the client
// closes it: a long-lived connection, as a database client keeps.
func holdServer(name string) func(net.Conn) {
	return func(c net.Conn) {
		_, _ = io.WriteString(c, name)
		_, _ = io.Copy(io.Discard, c)
	}
}

// schedConfig is the Services rr, lc, random and sh, at 10.96.0.20-23:80,
// each with the endpoints eps (one slice per endpoint: their ports differ).
func schedConfig(eps []netip.AddrPort) string {
	var b strings.Builder
	for i, sched := range []string{"rr", "lc", "", "sh"} {
		name := sched
		ann := ""
		if sched == "" {
			name = "random"
		} else {
			ann = fmt.Sprintf(", annotations: {userproxy.io/scheduler: %s}", sched)
		}
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default%s}
spec:
  clusterIP: 10.96.0.%d
  clusterIPs: [10.96.0.%d]
  ports: [{name: http, protocol: TCP, port: 80}]
`, name, ann, 20+i, 20+i)
		for j, ep := range eps {
			b.WriteString(sliceYAML(fmt.Sprintf("%s-%d", name, j), name, ep, ""))
		}
	}
	return b.String()
}

// ipvsDest is one `  -> addr  Forward Weight ActiveConn InActConn` line.
type ipvsDest struct {
	addr             string
	active, inactive int
}

// ipvsList runs `userproxy ipvs` in the namespace and returns the
// destinations per virtual service line ("TCP  10.96.0.20:80 rr").
func ipvsList(t *testing.T, b *binNS, bin string) (map[string][]ipvsDest, string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", b.name, bin, "ipvs").CombinedOutput()
	if err != nil {
		t.Fatalf("userproxy ipvs: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "IP Virtual Server version") ||
		!strings.HasPrefix(lines[1], "Prot LocalAddress:Port Scheduler Flags") ||
		!strings.HasPrefix(strings.TrimSpace(lines[2]), "-> RemoteAddress:Port") {
		t.Fatalf("userproxy ipvs: not ipvsadm -Ln's header:\n%s", out)
	}
	svcs := map[string][]ipvsDest{}
	var cur string
	for _, l := range lines[3:] {
		f := strings.Fields(l)
		switch {
		case len(f) == 6 && f[0] == "->":
			a, err1 := strconv.Atoi(f[4])
			i, err2 := strconv.Atoi(f[5])
			if cur == "" || err1 != nil || err2 != nil || f[2] != "Masq" || f[3] != "1" {
				t.Fatalf("bad destination line %q in:\n%s", l, out)
			}
			svcs[cur] = append(svcs[cur], ipvsDest{f[1], a, i})
		case len(f) >= 3 && (f[0] == "TCP" || f[0] == "UDP"):
			cur = strings.Join(f, " ")
		default:
			t.Fatalf("unexpected line %q in:\n%s", l, out)
		}
	}
	return svcs, string(out)
}

func TestBinarySchedulers(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	// Clients 192.0.2.1-5 (192.0.2.1 is newBinNS's).
	clients := []netip.Addr{tunClient4.Addr()}
	if err := b.c.run(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for i := 2; i <= 5; i++ {
			a := netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})
			clients = append(clients, a)
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, 32))}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	names := map[string]string{} // endpoint "ip:port" -> its name
	var eps []netip.AddrPort
	for _, n := range []string{"a", "b", "c"} {
		var ln net.Listener
		if err := b.c.run(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
			t.Fatal(err)
		}
		be := serveTCP(t, ln, holdServer(n))
		eps = append(eps, be.addr)
		names[be.addr.String()] = n
	}
	// kube-proxy's order, which rr follows: sorted by "ip:port".
	order := slices.Sorted(func(yield func(string) bool) {
		for k := range names {
			if !yield(k) {
				return
			}
		}
	})
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, schedConfig(eps))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxsch0",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "info")
	b.waitHealthy(p)

	// open connects from client to svc, reads the endpoint's name and
	// keeps the connection open.
	open := func(client netip.Addr, svc string) (net.Conn, string) {
		t.Helper()
		var c net.Conn
		err := b.c.run(func() (err error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: client.AsSlice()}, Timeout: 5 * time.Second}
			c, err = d.Dial("tcp", svc)
			return err
		})
		if err != nil {
			t.Fatalf("dial %s from %s: %v", svc, client, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatalf("%s from %s: %v", svc, client, err)
		}
		t.Cleanup(func() { c.Close() })
		return c, string(buf)
	}
	closeAll := func(cs []net.Conn) {
		for _, c := range cs {
			c.Close()
		}
	}

	// rr: 30 connections, one after another, go round the sorted list:
	// 10 each, in order (ip_vs_rr.c).
	var got []string
	var conns []net.Conn
	for range 30 {
		c, n := open(clients[0], "10.96.0.20:80")
		conns = append(conns, c)
		got = append(got, n)
	}
	closeAll(conns)
	for i, n := range got {
		if want := names[order[i%3]]; n != want {
			t.Fatalf("rr: connection %d went to %s, want %s (all: %v)", i, n, want, got)
		}
	}
	// ipvsadm --stats: 30 scheduled (Conns), 10 per endpoint, with packets
	// both ways.
	stats, err := exec.Command("ip", "netns", "exec", b.name, bin, "ipvs", "--stats").CombinedOutput()
	if err != nil {
		t.Fatalf("userproxy ipvs --stats: %v\n%s", err, stats)
	}
	inRR, rrDests := false, 0
	for _, l := range strings.Split(string(stats), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) == 7 && f[0] == "TCP":
			inRR = f[1] == "10.96.0.20:80"
			if inRR && (f[2] != "30" || f[3] == "0" || f[4] == "0") {
				t.Fatalf("--stats: rr service line %q", l)
			}
		case inRR && len(f) == 7 && f[0] == "->":
			if f[2] != "10" || f[3] == "0" || f[5] == "0" {
				t.Fatalf("--stats: rr destination line %q in:\n%s", l, stats)
			}
			rrDests++
		}
	}
	if rrDests != 3 {
		t.Fatalf("--stats: %d rr destinations in:\n%s", rrDests, stats)
	}

	// lc: 30 long-lived connections opened one after another end 10/10/10
	// active (ip_vs_lc.c), as `userproxy ipvs` shows.
	conns = nil
	for range 30 {
		c, _ := open(clients[0], "10.96.0.21:80")
		conns = append(conns, c)
	}
	ipvs, out := ipvsList(t, b, bin)
	t.Logf("userproxy ipvs with 30 lc connections open:\n%s", out)
	lc := ipvs["TCP 10.96.0.21:80 lc"]
	if len(lc) != 3 {
		t.Fatalf("lc service: %v", lc)
	}
	for _, d := range lc {
		if d.active != 10 || d.inactive != 0 {
			t.Fatalf("lc: destinations %v, want ActiveConn 10 InActConn 0 each", lc)
		}
	}
	closeAll(conns)

	// random: the same 30 do not balance. A 10/10/10 split has probability
	// 1.5%; three such rounds in a row, 3.6e-6.
	balancedRounds := 0
	for round := 0; round < 3; round++ {
		conns = nil
		for range 30 {
			c, _ := open(clients[0], "10.96.0.22:80")
			conns = append(conns, c)
		}
		ipvs, out := ipvsList(t, b, bin)
		rnd := ipvs["TCP 10.96.0.22:80 random"]
		closeAll(conns)
		sum, balanced := 0, true
		for _, d := range rnd {
			sum += d.active
			balanced = balanced && d.active == 10
		}
		if len(rnd) != 3 || sum != 30 {
			t.Fatalf("random: destinations %v in:\n%s", rnd, out)
		}
		t.Logf("random, round %d: ActiveConn %v", round, rnd)
		if !balanced {
			break
		}
		balancedRounds++
	}
	if balancedRounds == 3 {
		t.Fatal("random split 30 connections 10/10/10 three times in a row")
	}

	// sh: each client address keeps its endpoint (ip_vs_sh.c).
	for _, c := range clients {
		var first string
		for i := range 6 {
			conn, n := open(c, "10.96.0.23:80")
			conn.Close()
			if i == 0 {
				first = n
			} else if n != first {
				t.Fatalf("sh: client %s went to %s, then to %s", c, first, n)
			}
		}
		t.Logf("sh: client %s -> %s", c, first)
	}

	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

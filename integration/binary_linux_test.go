//go:build linux

package integration

// The real binary, end to end (root; everything in namespaces the tests
// create): userproxy run from --config, traffic to a TCP and a UDP service, a
// config change, a corrupt config, the conntrack CLI, /metrics after a stray
// ACK, SIGTERM; and userproxy setup followed by run as an unprivileged user.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/userproxy/userproxy/conntrack"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	binDir    string
)

// userproxyBinary builds cmd/userproxy once per test process into a
// directory any user may read.
func userproxyBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "userproxy-bin-")
		if buildErr != nil {
			return
		}
		if buildErr = os.Chmod(binDir, 0o755); buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "userproxy")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/userproxy/userproxy/cmd/userproxy").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// removeBuiltBinaries removes what userproxyBinary built.
func removeBuiltBinaries() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
}

// binNS is a namespace prepared for the binary: loopback up, a client
// address, and endpoints on loopback.
type binNS struct {
	t    *testing.T
	ns   netns.NsHandle
	name string
	c    *nsClient
}

func newBinNS(t *testing.T) *binNS {
	ns, name := newNetNS(t)
	err := inNS(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(tunClient4)})
	})
	if err != nil {
		t.Fatalf("preparing namespace %s: %v", name, err)
	}
	c := &nsClient{ns: ns, work: make(chan func())}
	startWorkers(t, c)
	return &binNS{t: t, ns: ns, name: name, c: c}
}

// tcpEndpoint listens on 127.0.0.1 inside the namespace and answers name.
func (b *binNS) tcpEndpoint(name string) netip.AddrPort { return b.serveTCP(nameServer(name)) }

// serveTCP serves connections with serve on 127.0.0.1 inside the namespace.
func (b *binNS) serveTCP(serve func(net.Conn)) netip.AddrPort {
	var ln net.Listener
	if err := b.c.run(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
		b.t.Fatal(err)
	}
	return serveTCP(b.t, ln, serve).addr
}

// udpEcho answers datagrams on 127.0.0.1 inside the namespace.
func (b *binNS) udpEcho() netip.AddrPort {
	var pc net.PacketConn
	if err := b.c.run(func() (err error) { pc, err = net.ListenPacket("udp", "127.0.0.1:0"); return err }); err != nil {
		b.t.Fatal(err)
	}
	return serveUDP(b.t, pc, echoPrefixed)
}

// get fetches an admin URL from inside the namespace.
func (b *binNS) get(path string) (int, string, error) { return b.getAt("127.0.0.1:10249", path) }

// getAt is get from another server of the namespace, at hostport.
func (b *binNS) getAt(hostport, path string) (int, string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return b.c.dial(network, addr)
		},
	}}
	resp, err := client.Get("http://" + hostport + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// fetchName connects to addr and returns what the endpoint says.
func (b *binNS) fetchName(addr string) (string, error) {
	c, err := b.c.dial("tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	return string(got), err
}

// proc is a running userproxy.
type proc struct {
	cmd    *exec.Cmd
	exited chan error
	out    *strings.Builder
	w      *lockedWriter
}

// output is what the process wrote so far, stdout and stderr.
func (p *proc) output() string { return p.w.String() }

func startProc(t *testing.T, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(args[0], args[1:]...), exited: make(chan error, 1), out: &strings.Builder{}}
	w := &lockedWriter{b: p.out}
	p.w = w
	p.cmd.Stdout, p.cmd.Stderr = w, w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("userproxy output:\n%s", w.String())
		}
	})
	return p
}

// stop sends SIGTERM and returns the exit error (nil for status 0).
func (p *proc) stop(t *testing.T) error {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		return err
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("userproxy did not exit within 15 s of SIGTERM")
	}
}

type lockedWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// waitHealthy waits until the proxy serves: /readyz (the first table is
// live and /healthz passes; /healthz itself is healthy while starting, as
// kube-proxy's).
func (b *binNS) waitHealthy(p *proc) {
	b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err := b.get("/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		select {
		case err := <-p.exited:
			b.t.Fatalf("userproxy exited before it was healthy: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("not healthy after 30 s: %d %q %v", code, body, err)
		}
	}
}

// quickConfig writes a config: web (TCP 10.96.0.10:80) with the given
// endpoint, dns (UDP 10.96.0.53:53) with the UDP endpoint.
func quickConfig(web, dns netip.AddrPort) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports: [{name: http, protocol: TCP, port: 80, targetPort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: [{addresses: [%s]}]
ports: [{name: http, protocol: TCP, port: %d}]
---
apiVersion: v1
kind: Service
metadata: {name: dns, namespace: default}
spec:
  clusterIP: 10.96.0.53
  clusterIPs: [10.96.0.53]
  ports: [{name: dns, protocol: UDP, port: 53, targetPort: %d}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: dns-1, namespace: default, labels: {kubernetes.io/service-name: dns}}
addressType: IPv4
endpoints: [{addresses: [%s]}]
ports: [{name: dns, protocol: UDP, port: %d}]
`, web.Port(), web.Addr(), web.Port(), dns.Port(), dns.Addr(), dns.Port())
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write then rename, as editors and config managers do.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestBinaryRun(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	epA, epB, dns := b.tcpEndpoint("a"), b.tcpEndpoint("b"), b.udpEcho()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(epA, dns))

	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxbin0",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "info")
	b.waitHealthy(p)

	// TCP and UDP services.
	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "a" {
		t.Fatalf("TCP service: %q, %v", got, err)
	}
	var uc net.Conn
	if err := b.c.run(func() (err error) { uc, err = net.Dial("udp", "10.96.0.53:53"); return err }); err != nil {
		t.Fatal(err)
	}
	defer uc.Close()
	_, _ = uc.Write([]byte("hi"))
	_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	if n, err := uc.Read(buf); err != nil || string(buf[:n]) != "echo:hi" {
		t.Fatalf("UDP service: %q, %v", buf[:n], err)
	}

	// A change to the file takes effect within 2 s.
	writeFile(t, cfg, quickConfig(epB, dns))
	changed := time.Now()
	for {
		if got, _ := b.fetchName("10.96.0.10:80"); got == "b" {
			break
		}
		if time.Since(changed) > 2*time.Second {
			t.Fatal("the changed endpoint was not used within 2 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("config change live after %v", time.Since(changed))

	// A corrupt file: the last good table keeps serving, /healthz says why.
	writeFile(t, cfg, "apiVersion: v1\nkind: Service\nmetadata: {name: web\n")
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body, _ := b.get("/healthz")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "services.yaml") {
			t.Logf("/healthz: %s", strings.TrimSpace(body))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz did not report the corrupt file: %d %q", code, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "b" {
		t.Fatalf("after a corrupt reload the last good table should serve: %q, %v", got, err)
	}

	// The conntrack CLI lists the flows.
	out, err := exec.Command("ip", "netns", "exec", b.name, bin, "conntrack", "list", "--protocol", "tcp").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "dst=10.96.0.10") || !strings.Contains(string(out), "dport=80") {
		t.Fatalf("conntrack list: %v\n%s", err, out)
	}

	// A stray ACK is counted as INVALID in /metrics.
	if err := b.c.inject(tcpSegment(tunClient4.Addr(), 40001, netip.MustParseAddr("10.96.0.10"), 80, flagACK, 1, 1)); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`userproxy_conntrack_invalid_packets_total{reason="%s"} 1`, conntrack.ReasonNoEntryNotSYN)
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, body, _ := b.get("/metrics")
		if strings.Contains(body, want) && metricValue(body, "kubeproxy_iptables_ct_state_invalid_dropped_packets_total") >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q", want)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// SIGTERM: exit 0, no TUN and no route left behind.
	if err := p.stop(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if err := inNS(b.ns, func() error {
		if _, err := netlink.LinkByName("upxbin0"); err == nil {
			return errors.New("the TUN device is still there")
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == "10.96.0.0/12" {
				return fmt.Errorf("route %v is still there", r.Dst)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// metricValue returns the value of an unlabelled metric in a scrape, or -1.
func metricValue(body, name string) float64 {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// After `userproxy setup --user U`, U runs the proxy without privileges.
func TestBinarySetupUnprivileged(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"useradd", "userdel", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s", tool)
		}
	}
	bin := userproxyBinary(t)
	// setup may open up /dev/net/tun (mode 0666); put it back afterwards.
	if fi, err := os.Stat("/dev/net/tun"); err == nil {
		t.Cleanup(func() { _ = os.Chmod("/dev/net/tun", fi.Mode().Perm()) })
	}
	name := fmt.Sprintf("upxt%d", os.Getpid()%100000)
	if out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("userdel", name).Run() })
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}

	b := newBinNS(t)
	ep, dns := b.tcpEndpoint("a"), b.udpEcho()
	// A directory the unprivileged user can read (t.TempDir's parent is
	// private to root).
	dir, err := os.MkdirTemp("", "userproxy-setup-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(ep, dns))

	if out, err := exec.Command("ip", "netns", "exec", b.name, bin, "setup", "--user", name, "--tun-name", "upxu0").CombinedOutput(); err != nil {
		t.Fatalf("setup: %v: %s", err, out)
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "exec", b.name, bin, "setup", "--remove", "--tun-name", "upxu0").Run()
	})
	// setup makes a multi-queue device, so that run opens a queue per CPU.
	if out, err := exec.Command("ip", "-n", b.name, "-d", "link", "show", "upxu0").CombinedOutput(); err != nil || !strings.Contains(string(out), "multi_queue") {
		t.Fatalf("the device setup made is not multi-queue (%v):\n%s", err, out)
	}

	p := startProc(t, "nsenter", "--net=/var/run/netns/"+b.name, "--setuid", u.Uid, "--setgid", u.Gid,
		bin, "run", "--config", cfg, "--tun-name", "upxu0", "--min-sync-period", "0")
	b.waitHealthy(p)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nUid:\t"+u.Uid+"\t") {
		t.Fatalf("userproxy is not running as %s:\n%s", name, status)
	}
	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "a" {
		t.Fatalf("TCP service as %s: %q, %v", name, got, err)
	}
	queues := runtime.NumCPU()
	if portableTUN {
		queues = 1 // water opens one, of the multi-queue device too
	}
	if want := fmt.Sprintf(`"queues":%d`, queues); !strings.Contains(p.output(), want) {
		t.Errorf("run did not open a queue per CPU of setup's device (%s):\n%s", want, p.output())
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	// The persistent device survives run; setup --remove takes it away.
	if out, err := exec.Command("ip", "netns", "exec", b.name, bin, "setup", "--remove", "--tun-name", "upxu0").CombinedOutput(); err != nil {
		t.Fatalf("setup --remove: %v: %s", err, out)
	}
}

// startIdleFlow runs the binary in a fresh namespace with web pointing at an
// endpoint that waits for the client's FIN, and opens one proxied flow that
// stays idle.
func startIdleFlow(t *testing.T, tunName string) (*binNS, *proc, net.Conn) {
	t.Helper()
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	idle := b.serveTCP(func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, quickConfig(idle, b.udpEcho()))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", tunName, "--min-sync-period", "0")
	b.waitHealthy(p)
	c, err := b.c.dial("tcp", "10.96.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the flow to be proxied", func() bool {
		_, body, _ := b.get("/metrics")
		return strings.Contains(body, `userproxy_flows_total{protocol="tcp",result="proxied"} 1`)
	})
	return b, p, c
}

// Requests and answers on five connections at once through the real TUN,
// taken in turn: the ACK of each request, and of each client's FIN, is held
// until the answer (or the FIN back) carries it (netstack/ackhold.go), which
// /metrics counts as superseded: for most of them (at one P gVisor's ACK is
// always written before the answer); and every answer arrives.
func TestBinaryAnswerCarriesTheACK(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	ep := b.serveTCP(lineEcho("a"))
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, quickConfig(ep, b.udpEcho()))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxack0", "--min-sync-period", "0")
	b.waitHealthy(p)
	// Five connections at once, their requests taken in turn: each flow
	// holds its own ACKs, the first request's and the FIN's included.
	conns := make([]net.Conn, 5)
	rds := make([]*bufio.Reader, len(conns))
	for k := range conns {
		c, err := b.c.dial("tcp", "10.96.0.10:80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		conns[k], rds[k] = c, bufio.NewReader(c)
	}
	for i := range 10 {
		for k, c := range conns {
			req := fmt.Sprintf("request %d on %d\n", i, k)
			if _, err := io.WriteString(c, req); err != nil {
				t.Fatal(err)
			}
			if got, err := rds[k].ReadString('\n'); err != nil || got != "a "+req {
				t.Fatalf("answer %d on %d: %q, %v", i, k, got, err)
			}
		}
	}
	// The client's FIN, then the endpoint's, which carries the ACK of the
	// client's.
	for k, c := range conns {
		if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if n, err := rds[k].Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("connection %d after its FIN: %d bytes, %v; want EOF", k, n, err)
		}
	}
	_, body, _ := b.get("/metrics")
	held := metric(body, `userproxy_gate_acks_held_total{end="superseded"}`)
	t.Logf("of 50 requests and 5 FINs, %v ACKs held and superseded:\n%s", held, grepLines(body, "gate_acks_held"))
	if held < 40 {
		t.Fatalf("%v of 50 requests' ACKs held for the answer to carry, want most:\n%s", held, grepLines(body, "gate_acks_held"))
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// SIGTERM lets flows finish for the grace period (3 s), then resets the
// ones still open, so that a client whose response was cut short sees a
// reset rather than a clean EOF (issue 15, item 8); the proxy then exits 0.
func TestBinaryGracefulShutdown(t *testing.T) {
	_, p, c := startIdleFlow(t, "upxgr0")
	defer c.Close()
	signalled := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("idle client after SIGTERM: read %d bytes, %v; want a reset once the grace period is over", n, err)
	}
	if waited := time.Since(signalled); waited < 2500*time.Millisecond {
		t.Errorf("reset %v after SIGTERM, before the 3 s grace period", waited)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("exit: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("userproxy did not exit after SIGTERM")
	}
	if !strings.Contains(p.out.String(), "reset the flows still open") {
		t.Errorf("the log does not say that flows were reset:\n%s", p.out.String())
	}
}

// `userproxy conntrack flush` with a live TCP flow: the proxy ends the flow
// with a RST that reaches the client, although the flow's entry is gone by
// the time the RST is written (issue 15, item 2: the client hung).
func TestBinaryFlushResetsClient(t *testing.T) {
	b, p, c := startIdleFlow(t, "upxfl0")
	defer c.Close()
	bin := userproxyBinary(t)
	out, err := exec.Command("ip", "netns", "exec", b.name, bin, "conntrack", "flush", "--tun-name", "upxfl0").CombinedOutput()
	if err != nil {
		t.Fatalf("conntrack flush: %v\n%s", err, out)
	}
	t.Logf("conntrack flush: %s", strings.TrimSpace(string(out)))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client after the flush: read %d bytes, %v; want ECONNRESET", n, err)
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// `userproxy run` whose admin address is taken (127.0.0.1:10249 is also
// kube-proxy's metrics port) exits non-zero at once, with the error, and
// leaves neither its TUN device nor its routes behind (issue 15, item 1: it
// printed the error and hung, holding the TUN).
func TestBinaryAdminAddressTaken(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	var ln net.Listener
	if err := b.c.run(func() (err error) { ln, err = net.Listen("tcp", "127.0.0.1:10249"); return err }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, quickConfig(b.tcpEndpoint("a"), b.udpEcho()))
	start := time.Now()
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxadm0")
	select {
	case err := <-p.exited:
		took := time.Since(start)
		t.Logf("exited after %v: %v", took, err)
		if err == nil {
			t.Fatal("run exited 0 with its admin address taken")
		}
		if took > time.Second {
			t.Errorf("run took %v to exit, want under a second", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not exit with its admin address taken")
	}
	if !strings.Contains(p.out.String(), "10249") {
		t.Errorf("the error does not name the admin address:\n%s", p.out.String())
	}
	err := inNS(b.ns, func() error {
		if _, err := netlink.LinkByName("upxadm0"); err == nil {
			return errors.New("the TUN device upxadm0 is still there")
		}
		routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Dst != nil && r.Dst.String() == "10.96.0.0/12" {
				return fmt.Errorf("the service CIDR route is still there: %v", r)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Outages: an endpoint that never answers (dial timeout -> the client gets a
// RST, counted as dial_failed), and the config file gone for a while (the
// last table keeps serving, /healthz says why, the file's return heals it).
func TestBinaryOutages(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	// 203.0.113.0/24 is on-link behind a veth whose peer answers nothing
	// (not even ARP): SYNs never leave, dials time out.
	if err := inNS(b.ns, func() error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "upxhole0"}, PeerName: "upxhole1"}
		if err := netlink.LinkAdd(v); err != nil {
			return err
		}
		for _, name := range []string{"upxhole0", "upxhole1"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: v.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("203.0.113.0/24"))})
	}); err != nil {
		t.Fatal(err)
	}
	dead := netip.MustParseAddrPort("203.0.113.5:8080")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "services.yaml")
	writeFile(t, cfg, quickConfig(dead, b.udpEcho()))
	p := startProc(t, "ip", "netns", "exec", b.name, bin, "run", "--config", cfg, "--tun-name", "upxout0",
		"--min-sync-period", "0", "--dial-timeout", "500ms")
	b.waitHealthy(p)

	start := time.Now()
	_, err := b.c.dial("tcp", "10.96.0.10:80")
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial to a service whose endpoint never answers: %v, want connection refused (RST)", err)
	}
	t.Logf("refused after %v (dial timeout 500ms)", time.Since(start))
	_, body, _ := b.get("/metrics")
	if !strings.Contains(body, `userproxy_flows_total{protocol="tcp",result="dial_failed"} 1`) {
		t.Error("the failed dial is not counted")
	}

	// The file goes away: the last table stays, /healthz reports it.
	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/healthz to report the missing file", func() bool {
		code, body, _ := b.get("/healthz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "services.yaml")
	})
	if _, body, _ := b.get("/debug/services"); !strings.Contains(body, "default/web") {
		t.Fatalf("the last good table is gone while the file is missing:\n%s", body)
	}
	// It comes back (with a live endpoint): healthy again, traffic flows.
	writeFile(t, cfg, quickConfig(b.tcpEndpoint("back"), b.udpEcho()))
	waitFor(t, "/healthz to recover", func() bool { code, _, _ := b.get("/healthz"); return code == http.StatusOK })
	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "back" {
		t.Fatalf("after the file returned: %q, %v", got, err)
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

// A second SIGTERM forces the exit while the first one waits for a flow to
// finish.
func TestBinarySecondSignalForcesExit(t *testing.T) {
	b, p, c := startIdleFlow(t, "upxsig0")
	defer c.Close() // never closed before the signals: the drain would wait 3 s and reset it
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	waitFor(t, "the first signal to be handled", func() bool {
		_, _, err := b.get("/healthz")
		return err != nil // the admin server stops with the first signal
	})
	start := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		if d := time.Since(start); d > time.Second {
			t.Fatalf("exit took %v after the second SIGTERM", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("userproxy did not exit after a second SIGTERM")
	}
}

// TestBinaryReadOnlyProcSys: in a container /proc/sys is read-only; run
// cannot tune IPv6 on the device it creates, says so, and serves (it used to
// exit at start: found by the image's test in a container-like namespace).
func TestBinaryReadOnlyProcSys(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	b := newBinNS(t)
	ep, dns := b.tcpEndpoint("a"), b.udpEcho()
	cfg := filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, cfg, quickConfig(ep, dns))
	script := "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec " + bin +
		" run --config " + cfg + " --tun-name upxro0 --min-sync-period 0 --log-format json"
	p := startProc(t, "ip", "netns", "exec", b.name, "unshare", "-m", "sh", "-c", script)
	b.waitHealthy(p)
	if got, err := b.fetchName("10.96.0.10:80"); err != nil || got != "a" {
		t.Fatalf("TCP service with a read-only /proc/sys: %q, %v", got, err)
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(p.out.String(), "read-only /proc/sys") {
		t.Errorf("no warning about the read-only /proc/sys in:\n%s", p.out.String())
	}
}

// sliceYAML is a config document: the EndpointSlice name of Service svc in
// namespace default, one endpoint at ep (on node, when not empty), port
// "http" TCP; its address type follows ep's family.
func sliceYAML(name, svc string, ep netip.AddrPort, node string) string {
	at, nodeField := "IPv4", ""
	if ep.Addr().Is6() {
		at = "IPv6"
	}
	if node != "" {
		nodeField = ", nodeName: " + node
	}
	return fmt.Sprintf(`---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s, namespace: default, labels: {kubernetes.io/service-name: %s}}
addressType: %s
endpoints: [{addresses: [%q]%s}]
ports: [{name: http, protocol: TCP, port: %d}]
`, name, svc, at, ep.Addr().String(), nodeField, ep.Port())
}

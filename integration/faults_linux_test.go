//go:build linux

package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
)

// TestFaults runs transfers through an impairing wire (faultwire_linux_test.go)
// between a pod-like client and a service, for three service paths on the
// same topology, profile by profile: netem's loss, reordering, duplication,
// corruption, delay with jitter, a rate limit with a short queue, a blackhole
// window and a link-down of the client's veth (issue 45; DESIGN.md section 7,
// "Under faults").
//
//	P (client, eth0 MTU 1500) -- veth -- M (the wire) -- veth -- U
//
// The wire is a process of its own in M (wireproc_linux_test.go), as netem
// would be the kernel's: inside the test's process its frames would wait
// for the same Ps as the rig under test.
// The paths differ only in U: "kernel" is an iptables nat PREROUTING DNAT
// rule to an endpoint listening in U (no TUN); "translated" and "gvisor" are
// the in-process rig on a TUN in U, which forwards P's traffic into it (as
// podTUNEnv), with the translated TCP path and with gVisor's TCP.
//
// For each profile and path: an upload and a download of the form's size,
// each checked by SHA-256, and a burst of short request/response
// connections. The test asserts integrity, completion before a deadline
// (a stall is a failure that says how far the transfer got, never a hang),
// no frame above the MTU on the wire, and that each proxy path completes at
// least as many short connections as the kernel path did under the same
// profile. Goodput is logged in a table, with each proxy path's ratio to the
// kernel path's, and never asserted: the project keeps timed performance
// figures out of pass/fail.
//
// The short form (the default, run by `make test` under -race, about
// 2.5 minutes on the 2-core VM) moves 1 MiB each way on all profiles but
// loss 0.1% and 5%, with a 1 s blackhole and a 2 s link-down, and allows
// 60 s per step; USERPROXY_FAULTS=full (`make faults`) runs every profile
// with 16 MiB, a 3 s blackhole and a 60 s link-down, and allows 180 s per
// step. USERPROXY_FAULTS_PATHS (e.g. "kernel" or
// "kernel,translated") picks the paths; USERPROXY_SEED the wire's seed;
// USERPROXY_FAULTS_CC=NAME sets the kernel's congestion control on the
// client's and the endpoints' sockets (faultSetCC; otherwise the host's
// default: on this VM BBR, where Linux's is CUBIC, the translator's);
// USERPROXY_FAULTS_TRACE=PREFIX writes every frame each wire reads, with
// what the rules did to it, to PREFIX.<path> (faultTrace). Profiles are
// subtests: -run 'TestFaults/loss' runs those alone.
//
// The rig reads translateTCP once, when it is built: the test sets the
// package variable around building each of its two rigs and restores it.
// It is skipped in the USERPROXY_TCP_TRANSLATE=0 pass of `make unit`, since
// it runs gVisor's TCP path itself.
func TestFaults(t *testing.T) {
	requireRoot(t)
	if os.Getenv("USERPROXY_TCP_TRANSLATE") == "0" {
		t.Skip("USERPROXY_TCP_TRANSLATE=0: TestFaults runs gVisor's TCP path beside the translated one itself")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Fatal("the kernel path needs iptables (apt-get install iptables)")
	}
	form := faultFormFromEnv()
	t.Logf("form: %s", form)
	seed := testSeed(t, 45)
	var paths []*faultPath
	for i, name := range form.paths {
		if name == "translated" {
			if err := proxy.TranslateSupported(); err != nil {
				t.Logf("the translated path is not run: %v", err)
				continue
			}
		}
		paths = append(paths, newFaultPath(t, name, seed+uint64(i)))
	}
	results := map[string]map[string]faultResult{} // profile -> path -> result
	var profiles []faultProfile
	for _, prof := range faultProfiles(form) {
		if !form.full && !prof.short {
			continue
		}
		profiles = append(profiles, prof)
		results[prof.name] = map[string]faultResult{}
		t.Run(prof.name, func(t *testing.T) {
			for _, fp := range paths {
				t.Run(fp.name, func(t *testing.T) {
					res := fp.run(t, prof, form)
					results[prof.name][fp.name] = res
					if k, ok := results[prof.name]["kernel"]; ok && fp.name != "kernel" && res.burstOK < k.burstOK {
						t.Errorf("burst: %d of %d short connections completed via %s, %d via the kernel", res.burstOK, form.burst, fp.name, k.burstOK)
					}
				})
			}
		})
	}
	t.Logf("goodput in Mbit/s (x the kernel path's); burst: connections completed and the time the burst took\n%s", faultTable(profiles, paths, results, form))
}

// faultForm is the size of a TestFaults run.
type faultForm struct {
	full      bool
	size      int64         // bytes each way
	burst     int           // short connections
	blackhole time.Duration // the blackhole window
	linkDown  time.Duration // how long the link stays down
	deadline  time.Duration // for each transfer and the burst, beyond a transient fault's duration
	paths     []string
}

func faultFormFromEnv() faultForm {
	f := faultForm{size: 1 << 20, burst: 50, blackhole: time.Second, linkDown: 2 * time.Second, deadline: 60 * time.Second,
		paths: []string{"kernel", "translated", "gvisor"}}
	if os.Getenv("USERPROXY_FAULTS") == "full" {
		f.full, f.size, f.blackhole, f.linkDown, f.deadline = true, 16<<20, 3*time.Second, 60*time.Second, 180*time.Second
	}
	if s := os.Getenv("USERPROXY_FAULTS_PATHS"); s != "" {
		f.paths = nil
		for p := range strings.SplitSeq(s, ",") {
			f.paths = append(f.paths, strings.TrimSpace(p))
		}
	}
	return f
}

func (f faultForm) String() string {
	name := "short (USERPROXY_FAULTS=full for the whole matrix)"
	if f.full {
		name = "full"
	}
	return fmt.Sprintf("%s: %d MiB each way, %d short connections, blackhole %v, link down %v, deadline %v beyond a transient fault, paths %v",
		name, f.size>>20, f.burst, f.blackhole, f.linkDown, f.deadline, f.paths)
}

// faultProfile is one row of the matrix: rules for both directions of the
// wire and at most one transient event, fired once in each transfer and in
// the burst after a quarter of the transfer (a few connections of the
// burst) has crossed the wire.
type faultProfile struct {
	name     string
	rules    faultRules
	event    faultEvent
	eventFor time.Duration
	short    bool // in the short form
}

func faultProfiles(f faultForm) []faultProfile {
	const ms = time.Millisecond
	return []faultProfile{
		{name: "none", short: true},
		{name: "loss 0.1%", rules: faultRules{loss: 0.001}},
		{name: "loss 1%", rules: faultRules{loss: 0.01}, short: true},
		{name: "loss 5%", rules: faultRules{loss: 0.05}},
		{name: "reorder 25% 5ms", rules: faultRules{reorder: 0.25, reorderDelay: 5 * ms}, short: true},
		{name: "duplicate 1%", rules: faultRules{duplicate: 0.01}, short: true},
		{name: "corrupt 1%", rules: faultRules{corrupt: 0.01}, short: true},
		{name: "delay 50ms jitter 20ms", rules: faultRules{delay: 50 * ms, jitter: 20 * ms}, short: true},
		{name: "rate 20Mbit queue 30", rules: faultRules{rateBits: 20_000_000, rateQueue: 30}, short: true},
		{name: fmt.Sprintf("blackhole %v", f.blackhole), event: faultBlackhole, eventFor: f.blackhole, short: true},
		{name: fmt.Sprintf("link down %v", f.linkDown), event: faultLinkDown, eventFor: f.linkDown, short: true},
	}
}

// The services of every path (each path has its own namespaces).
const (
	faultSvcUp    = "10.96.0.41"
	faultSvcDown  = "10.96.0.42"
	faultSvcBurst = "10.96.0.43"
)

// The burst's request and response sizes.
const (
	faultRequest  = 64
	faultResponse = 4096
)

// faultPath is one service path behind its own wire.
type faultPath struct {
	name string // kernel, translated or gvisor
	cl   *nsClient
	wire *wireProc
	h    *rig // nil on the kernel path
	// backendDeadline bounds each endpoint connection, so that a stalled
	// client cannot hold an endpoint handler past the test.
	backendDeadline time.Duration
}

// newFaultPath builds P -- M -- U for the path name ("kernel", "translated"
// or "gvisor"). Everything lives in namespaces the test creates; nothing
// routes out of them.
func newFaultPath(t *testing.T, name string, seed uint64) *faultPath {
	t.Helper()
	if name != "kernel" && name != "translated" && name != "gvisor" {
		t.Fatalf("USERPROXY_FAULTS_PATHS: unknown path %q (kernel, translated, gvisor)", name)
	}
	u, uName := newNetNS(t)
	m, mName := newNetNS(t)
	pod, podName := newNetNS(t)
	t.Logf("%s: client %s, wire %s, service side %s", name, podName, mName, uName)
	var link *netstack.Link
	err := inNS(u, func() error {
		if name == "kernel" {
			_, err := linkUp("lo")
			return err
		}
		var err error
		if link, err = setUpTUN(netstack.TUNOptions{Name: "upx0", MTU: tunMTU}); err != nil {
			return err
		}
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644)
	})
	if err != nil {
		t.Fatalf("setting up namespace %s: %v", uName, err)
	}
	// M: no IPv6 (no router solicitations, no DAD), no addresses; the
	// veth ends promiscuous, without offloads.
	err = inNS(m, func() error {
		for _, f := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+f+"/disable_ipv6", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		for _, v := range []*netlink.Veth{
			{LinkAttrs: netlink.LinkAttrs{Name: "wp0", MTU: podVethMTU}, PeerName: "eth0", PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(pod)},
			{LinkAttrs: netlink.LinkAttrs{Name: "wu0", MTU: podVethMTU}, PeerName: "pod0", PeerHardwareAddr: podNodeMAC, PeerNamespace: netlink.NsFd(u)},
		} {
			if err := netlink.LinkAdd(v); err != nil {
				return fmt.Errorf("veth %s: %w", v.Name, err)
			}
			if err := setFeaturesOff(v.Name); err != nil {
				return err
			}
			l, err := netlink.LinkByName(v.Name)
			if err != nil {
				return err
			}
			if err := netlink.SetPromiscOn(l); err != nil {
				return fmt.Errorf("promiscuous %s: %w", v.Name, err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("%s up: %w", v.Name, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("setting up namespace %s: %v", mName, err)
	}
	// The two ends: IPv4 only, no offloads, static neighbours (podTUNEnv's
	// workaround); P routes everything to U.
	end := func(dev, addr string, peerMAC net.HardwareAddr, peer string) error {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+dev+"/disable_ipv6", []byte("1"), 0o644); err != nil {
			return err
		}
		if err := setFeaturesOff(dev); err != nil {
			return err
		}
		if err := addrsUp(dev, addr); err != nil {
			return err
		}
		return staticNeighbours(dev, peerMAC, peer)
	}
	if err := inNS(u, func() error { return end("pod0", "198.18.9.1/24", podMAC, "198.18.9.2") }); err != nil {
		t.Fatalf("setting up namespace %s: %v", uName, err)
	}
	err = inNS(pod, func() error {
		if err := end("eth0", "198.18.9.2/24", podNodeMAC, "198.18.9.1"); err != nil {
			return err
		}
		if _, err := linkUp("lo"); err != nil {
			return err
		}
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP("198.18.9.1")})
	})
	if err != nil {
		t.Fatalf("setting up namespace %s: %v", podName, err)
	}
	fp := &faultPath{name: name, backendDeadline: 10 * time.Minute}
	var trace string
	if prefix := os.Getenv("USERPROXY_FAULTS_TRACE"); prefix != "" {
		trace = prefix + "." + name
	}
	fp.wire = newFaultWire(t, mName, "wp0", "wu0", seed, trace)
	fp.cl = &nsClient{ns: pod, work: make(chan func())}
	startWorkers(t, fp.cl)
	serve := []struct {
		svc   string
		serve func(net.Conn)
	}{{faultSvcUp, fp.serveUpload}, {faultSvcDown, fp.serveDownload}, {faultSvcBurst, fp.serveBurst}}
	if name == "kernel" {
		for _, s := range serve {
			var ln net.Listener
			if err := inNS(u, func() (err error) { ln, err = net.Listen("tcp", "198.18.9.1:0"); return err }); err != nil {
				t.Fatalf("listening in %s: %v", uName, err)
			}
			be := serveTCP(t, ln, s.serve)
			rule := []string{"netns", "exec", uName, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", s.svc + "/32", "-p", "tcp", "--dport", "80",
				"-j", "DNAT", "--to-destination", be.addr.String()}
			if out, err := exec.Command("ip", rule...).CombinedOutput(); err != nil {
				t.Fatalf("ip %v: %v: %s", rule, err, out)
			}
		}
		return fp
	}
	saved := translateTCP
	translateTCP = name == "translated"
	h := newRig(t, link, seed)
	translateTCP = saved
	fp.h = h
	for i, s := range serve {
		be := startTCPBackend(t, "127.0.0.1", s.serve)
		h.addService(fmt.Sprintf("fault-%d", i), s.svc, v1.ProtocolTCP, 80, false, be.addr)
	}
	return fp
}

// faultCC is USERPROXY_FAULTS_CC: the congestion control of the test's own
// sockets, empty for the host's default.
var faultCC = os.Getenv("USERPROXY_FAULTS_CC")

// faultSetCC sets faultCC on c's socket (TCP_CONGESTION; root may pick any
// the kernel has, where a namespace's default is limited to
// tcp_allowed_congestion_control).
func faultSetCC(c syscall.RawConn) error {
	if faultCC == "" {
		return nil
	}
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, faultCC)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("USERPROXY_FAULTS_CC=%s: %w", faultCC, serr)
	}
	return nil
}

// faultConnCC sets faultCC on an endpoint's connection, before it sends.
// On an error the handler returns and the connection closes: the client's
// transfer fails its hash, never measured with the wrong sender (and the
// client's own dial, with the same setting, has failed first).
func faultConnCC(c net.Conn) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	return faultSetCC(rc)
}

// serveUpload answers the SHA-256 of everything the client sent.
func (fp *faultPath) serveUpload(c net.Conn) {
	if faultConnCC(c) != nil {
		return
	}
	_ = c.SetDeadline(time.Now().Add(fp.backendDeadline))
	hs := sha256.New()
	if _, err := io.Copy(hs, c); err != nil {
		return
	}
	_, _ = c.Write(hs.Sum(nil))
}

// serveDownload reads a seed and a length and sends that many bytes of the
// seeded pattern.
func (fp *faultPath) serveDownload(c net.Conn) {
	if faultConnCC(c) != nil {
		return
	}
	_ = c.SetDeadline(time.Now().Add(fp.backendDeadline))
	var req [16]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return
	}
	n := int64(binary.BigEndian.Uint64(req[8:]))
	_, _ = io.Copy(c, io.LimitReader(patternReader(binary.BigEndian.Uint64(req[:8])), n))
}

// serveBurst reads a request and answers faultResponse bytes of the pattern
// seeded by its first 8 bytes.
func (fp *faultPath) serveBurst(c net.Conn) {
	if faultConnCC(c) != nil {
		return
	}
	_ = c.SetDeadline(time.Now().Add(fp.backendDeadline))
	var req [faultRequest]byte
	if _, err := io.ReadFull(c, req[:]); err != nil {
		return
	}
	_, _ = io.Copy(c, io.LimitReader(patternReader(binary.BigEndian.Uint64(req[:8])), faultResponse))
}

// faultResult is one path's outcome under one profile; a zero duration is
// a failed transfer.
type faultResult struct {
	up, down  time.Duration
	burstOK   int
	burstTime time.Duration
}

// run sets the profile on the wire and runs the upload, the download and the
// burst, each under the profile's transient event if it has one.
func (fp *faultPath) run(t *testing.T, prof faultProfile, form faultForm) faultResult {
	w := fp.wire
	w.waitEvents()
	w.setRules(prof.rules)
	defer w.setRules(faultRules{})
	before := w.stats()
	retrans := tcpRetransSegs(t, fp.cl)
	var gate0 netstack.Stats
	var ct0 conntrack.Stats
	if fp.h != nil {
		gate0, ct0 = fp.h.st.Stats(), fp.h.ct.Stats()
	}
	limit := form.deadline + prof.eventFor
	var res faultResult
	// step arms the profile's event after `after` bytes, runs fn and says
	// whether the event fired during it.
	step := func(what string, after int64, fn func(deadline time.Time) error) error {
		fired := w.fired()
		if prof.event != faultNoEvent {
			w.arm(prof.event, prof.eventFor, after)
		}
		err := fn(time.Now().Add(limit))
		if prof.event != faultNoEvent && w.fired() == fired {
			t.Errorf("%s via %s: the %v was never fired", what, fp.name, prof.event)
		}
		w.waitEvents()
		return err
	}
	if err := step("upload", form.size/4, func(deadline time.Time) (err error) {
		res.up, err = faultUpload(fp.cl, faultSvcUp, form.size, deadline)
		return err
	}); err != nil {
		t.Errorf("upload of %d MiB via %s under %q (deadline %v): %v", form.size>>20, fp.name, prof.name, limit, err)
	}
	if err := step("download", form.size/4, func(deadline time.Time) (err error) {
		res.down, err = faultDownload(fp.cl, faultSvcDown, form.size, deadline)
		return err
	}); err != nil {
		t.Errorf("download of %d MiB via %s under %q (deadline %v): %v", form.size>>20, fp.name, prof.name, limit, err)
	}
	_ = step("burst", 16<<10, func(deadline time.Time) error {
		var errs []error
		res.burstOK, res.burstTime, errs = faultBurst(fp.cl, faultSvcBurst, form.burst, deadline)
		if len(errs) > 0 {
			t.Logf("burst via %s: %d of %d failed; first: %v", fp.name, len(errs), form.burst, errs[0])
		}
		return nil
	})
	after := w.stats()
	for i, name := range wireDirNames {
		s := after[i].sub(before[i])
		t.Logf("wire %s: %v", name, s)
		if s.oversize > 0 {
			t.Errorf("wire %s: %d frames above the MTU (GSO super-packets): the offloads are not off", name, s.oversize)
		}
	}
	t.Logf("%s: up %s, down %s, burst %d/%d in %v; the client retransmitted %d segments",
		fp.name, faultMbit(form.size, res.up), faultMbit(form.size, res.down), res.burstOK, form.burst,
		res.burstTime.Round(time.Millisecond), tcpRetransSegs(t, fp.cl)-retrans)
	if fp.h != nil {
		gate, ct := fp.h.st.Stats(), fp.h.ct.Stats()
		var why []string
		for r := range conntrack.NumReasons {
			if n := ct.Invalid[r] - ct0.Invalid[r]; n > 0 {
				why = append(why, fmt.Sprintf("%v %d", r, n))
			}
		}
		t.Logf("%s gate: %d packets in, %d out; INVALID dropped %d in, %d out %v; translated timers fired: %d rto, %d ack",
			fp.name, gate.PacketsIn-gate0.PacketsIn, gate.PacketsOut-gate0.PacketsOut,
			gate.InvalidIn-gate0.InvalidIn, gate.InvalidOut-gate0.InvalidOut, why,
			gate.TimerRTOFires-gate0.TimerRTOFires, gate.TimerAckFires-gate0.TimerAckFires)
	}
	return res
}

// faultDial connects to svc:80 from the client namespace, trying until
// deadline (the kernel's SYN retries decide when).
func faultDial(cl *nsClient, svc string, deadline time.Time) (net.Conn, error) {
	var conn net.Conn
	err := cl.run(func() error {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		defer cancel()
		var err error
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error { return faultSetCC(c) }}
		conn, err = d.DialContext(ctx, "tcp", net.JoinHostPort(svc, "80"))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", svc, err)
	}
	_ = conn.SetDeadline(deadline)
	return conn, nil
}

// countingWriter counts what was written through it.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// faultUpload sends size bytes of a pattern to svc:80, checks the
// endpoint's SHA-256 of them, and returns the time from the dial to the
// check.
func faultUpload(cl *nsClient, svc string, size int64, deadline time.Time) (time.Duration, error) {
	start := time.Now()
	c, err := faultDial(cl, svc, deadline)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	hs := sha256.New()
	cw := &countingWriter{w: c}
	if _, err := io.Copy(io.MultiWriter(cw, hs), io.LimitReader(patternReader(1), size)); err != nil {
		return 0, fmt.Errorf("after %v, %d of %d bytes written: %w", time.Since(start).Round(time.Millisecond), cw.n, size, err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return 0, fmt.Errorf("half-close: %w", err)
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, fmt.Errorf("all %d bytes written, no SHA-256 from the endpoint after %v: %w", size, time.Since(start).Round(time.Millisecond), err)
	}
	if !bytes.Equal(got, hs.Sum(nil)) {
		return 0, fmt.Errorf("integrity: the endpoint's SHA-256 %x, sent %x", got, hs.Sum(nil))
	}
	return time.Since(start), nil
}

// faultDownload has svc:80 send size bytes of a pattern, checks their
// SHA-256, and returns the time from the dial to the last byte.
func faultDownload(cl *nsClient, svc string, size int64, deadline time.Time) (time.Duration, error) {
	const seed = 7
	want := sha256.New()
	_, _ = io.Copy(want, io.LimitReader(patternReader(seed), size))
	start := time.Now()
	c, err := faultDial(cl, svc, deadline)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Write(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, seed), uint64(size))); err != nil {
		return 0, fmt.Errorf("request: %w", err)
	}
	got := sha256.New()
	n, err := io.Copy(got, c)
	if err != nil {
		return 0, fmt.Errorf("after %v, %d of %d bytes read: %w", time.Since(start).Round(time.Millisecond), n, size, err)
	}
	if n != size {
		return 0, fmt.Errorf("the endpoint closed after %d of %d bytes", n, size)
	}
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		return 0, fmt.Errorf("integrity: %d bytes read, SHA-256 %x; want %x", n, got.Sum(nil), want.Sum(nil))
	}
	return time.Since(start), nil
}

// faultBurst opens n connections to svc:80 at once, each sending a request
// and checking the response; it returns how many completed, the time the
// burst took, and the errors of the others.
func faultBurst(cl *nsClient, svc string, n int, deadline time.Time) (int, time.Duration, []error) {
	start := time.Now()
	errc := make(chan error, n)
	for i := range n {
		go func() { errc <- faultRoundTrip(cl, svc, uint64(1000+i), deadline) }()
	}
	var errs []error
	for range n {
		if err := <-errc; err != nil { // each ends by the deadline
			errs = append(errs, err)
		}
	}
	return n - len(errs), time.Since(start), errs
}

// faultRoundTrip is one short connection of a burst.
func faultRoundTrip(cl *nsClient, svc string, seed uint64, deadline time.Time) error {
	c, err := faultDial(cl, svc, deadline)
	if err != nil {
		return err
	}
	defer c.Close()
	req := make([]byte, faultRequest)
	binary.BigEndian.PutUint64(req, seed)
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("response after %d bytes: %w", len(got), err)
	}
	want := make([]byte, faultResponse)
	_, _ = io.ReadFull(patternReader(seed), want)
	if !bytes.Equal(got, want) {
		return fmt.Errorf("response: %d bytes, not the %d expected", len(got), faultResponse)
	}
	return nil
}

// faultMbit is size bytes in d as Mbit/s ("fail" for a failed transfer).
func faultMbit(size int64, d time.Duration) string {
	if d <= 0 {
		return "fail"
	}
	return fmt.Sprintf("%.1f", float64(size)*8/d.Seconds()/1e6)
}

// faultTable prints the goodput of each path, per profile and direction,
// with the ratio to the kernel path's.
func faultTable(profiles []faultProfile, paths []*faultPath, results map[string]map[string]faultResult, form faultForm) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "profile\tdirection")
	for _, fp := range paths {
		fmt.Fprintf(tw, "\t%s", fp.name)
	}
	fmt.Fprintln(tw)
	hasKernel := slices.ContainsFunc(paths, func(fp *faultPath) bool { return fp.name == "kernel" })
	for _, prof := range profiles {
		for _, dir := range []string{"upload", "download", "burst"} {
			fmt.Fprintf(tw, "%s\t%s", prof.name, dir)
			k, kok := results[prof.name]["kernel"]
			for _, fp := range paths {
				r, ok := results[prof.name][fp.name]
				if !ok {
					fmt.Fprint(tw, "\t-")
					continue
				}
				if dir == "burst" {
					fmt.Fprintf(tw, "\t%d/%d %.2fs", r.burstOK, form.burst, r.burstTime.Seconds())
					continue
				}
				d, kd := r.up, k.up
				if dir == "download" {
					d, kd = r.down, k.down
				}
				cell := faultMbit(form.size, d)
				if fp.name != "kernel" && hasKernel && kok && d > 0 && kd > 0 {
					cell += fmt.Sprintf(" (%.2fx)", kd.Seconds()/d.Seconds())
				}
				fmt.Fprintf(tw, "\t%s", cell)
			}
			fmt.Fprintln(tw)
		}
	}
	tw.Flush()
	return b.String()
}

//go:build linux

package integration

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/netstack"
)

// requireRoot skips a test that needs root, except under CI (CI=1), where
// it fails: CI runs as root and must run these tests.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("this test needs root, and CI must run it as root")
	}
	t.Skip("needs root (real TUN devices and network namespaces)")
}

var nsSeq atomic.Int64

// newNetNS creates a named network namespace that is deleted when the test
// ends. Nothing in it routes out: it holds only what the test adds.
func newNetNS(t testing.TB) (netns.NsHandle, string) {
	t.Helper()
	name := fmt.Sprintf("upxtest-%d-%d", os.Getpid(), nsSeq.Add(1))
	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// NewNamed moves this thread into the new namespace; the thread is
		// never unlocked, so it dies with the goroutine.
		runtime.LockOSThread()
		h, err := netns.NewNamed(name)
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("creating network namespace %s: %v", name, r.err)
	}
	t.Cleanup(func() {
		_ = r.h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("deleting network namespace %s: %v", name, err)
		}
	})
	return r.h, name
}

// inNS runs fn on a thread inside ns. Sockets and devices fn creates belong
// to ns and can be used from any goroutine afterwards.
func inNS(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("entering the namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// The client namespace's addresses and routes: the service CIDRs go into the
// TUN; the client's own addresses are documentation addresses on the TUN.
var (
	tunClient4 = netip.MustParsePrefix("192.0.2.1/32")
	tunClient6 = netip.MustParsePrefix("2001:db8::1/128")
	svcCIDRs   = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/64")}
)

// tunMTU is the MTU of the test TUN devices.
var tunMTU uint32 = 65520

// tunEnv runs the proxy on a real TUN device inside a namespace the test
// creates; the client is a host in that namespace.
type tunEnv struct{}

func (tunEnv) start(t testing.TB, seed uint64) (*rig, client) {
	requireRoot(t)
	ns, name := newNetNS(t)
	var link *netstack.Link
	err := inNS(ns, func() error {
		var err error
		link, err = setUpTUN(netstack.TUNOptions{Name: "upx0", MTU: tunMTU, Portable: portableTUN})
		return err
	})
	if err != nil {
		t.Fatalf("setting up the TUN in namespace %s: %v", name, err)
	}
	r := newRig(t, link, seed)
	c := &nsClient{ns: ns, work: make(chan func())}
	startWorkers(t, c)
	return r, c
}

// setUpTUN runs in a fresh namespace: it opens the TUN device, brings it and
// lo up, puts the client's addresses on it and routes the service CIDRs into
// it.
func setUpTUN(opts netstack.TUNOptions) (*netstack.Link, error) {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return nil, err
	}
	// No duplicate address detection and no link-local address on new
	// devices: otherwise the kernel holds IPv6 output on the TUN until its
	// link-local address passes DAD, and a test's first IPv6 packet can be
	// lost.
	for _, kv := range [][2]string{{"accept_dad", "0"}, {"addr_gen_mode", "1"}} {
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/default/"+kv[0], []byte(kv[1]), 0o644); err != nil {
			return nil, fmt.Errorf("sysctl %s: %w", kv[0], err)
		}
	}
	if opts.Queues == 0 && !opts.Portable {
		opts.Queues = runtime.NumCPU() // as run's default (--tun-queues 0)
	}
	link, err := netstack.OpenTUN(opts)
	if err != nil {
		return nil, err
	}
	// On an error the test fails and its namespace goes, with the device.
	fail := func(err error) (*netstack.Link, error) { return nil, err }
	tun, err := netlink.LinkByName(opts.Name)
	if err != nil {
		return fail(err)
	}
	if err := netlink.LinkSetMTU(tun, int(opts.MTU)); err != nil {
		return fail(err)
	}
	if err := netlink.LinkSetUp(tun); err != nil {
		return fail(err)
	}
	for _, p := range []netip.Prefix{tunClient4, tunClient6} {
		a := &netlink.Addr{IPNet: prefixNet(p), Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrAdd(tun, a); err != nil {
			return fail(fmt.Errorf("address %s: %w", p, err))
		}
	}
	for _, p := range svcCIDRs {
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: tun.Attrs().Index, Dst: prefixNet(p)}); err != nil {
			return fail(fmt.Errorf("route %s: %w", p, err))
		}
	}
	return link, nil
}

// nsWorkers is the number of client threads in a namespace: as many as the
// benchmarks' concurrent clients, since a dial holds its thread until the
// handshake completes.
const nsWorkers = 64

// startWorkers starts the client's namespace threads, stopped when the test
// ends.
func startWorkers(t testing.TB, c *nsClient) {
	t.Helper()
	ready := make(chan error, nsWorkers)
	for range nsWorkers {
		c.wg.Add(1)
		go c.worker(ready)
	}
	t.Cleanup(func() { close(c.work); c.wg.Wait() })
	for range nsWorkers {
		if err := <-ready; err != nil {
			t.Fatalf("namespace worker: %v", err)
		}
	}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// nsClient makes its sockets inside the client namespace, on a pool of
// threads that stay in it (creating a thread per socket would dominate the
// benchmarks).
type nsClient struct {
	ns   netns.NsHandle
	work chan func()
	wg   sync.WaitGroup
}

func (c *nsClient) worker(ready chan<- error) { // namespace worker: runs socket calls in the client namespace
	defer c.wg.Done()
	runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
	if err := netns.Set(c.ns); err != nil {
		ready <- err
		return // the test fails before any work is sent
	}
	ready <- nil
	for f := range c.work {
		f()
	}
}

// run runs fn in the namespace on a worker thread.
func (c *nsClient) run(fn func() error) error {
	done := make(chan error, 1)
	c.work <- func() { done <- fn() }
	return <-done
}

func (c *nsClient) dial(network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := c.run(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return conn, err
}

func (c *nsClient) listenPacket(network string) (net.PacketConn, error) {
	var pc net.PacketConn
	err := c.run(func() error {
		var err error
		pc, err = net.ListenPacket(network, ":0")
		return err
	})
	return pc, err
}

func (c *nsClient) inject(pkt []byte) error {
	return c.run(func() error {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer syscall.Close(fd)
		var dst syscall.SockaddrInet4
		copy(dst.Addr[:], pkt[16:20])
		return syscall.Sendto(fd, pkt, 0, &dst)
	})
}

func (c *nsClient) addr4() netip.Addr { return tunClient4.Addr() }

func TestTUN(t *testing.T) {
	requireRoot(t)
	runScenarios(t, tunEnv{})
}

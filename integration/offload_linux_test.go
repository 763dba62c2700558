//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
)

// A pod-like client: a namespace behind the TUN's namespace over a veth of
// MTU 1500, whose traffic the kernel forwards into the TUN, as pods reach
// ClusterIPs on a node. 32 MiB each way over IPv4 and IPv6 must arrive
// intact, and conntrack's counters say what size the packets crossing the
// TUN had:
//
//   - with offloads (the default), the kernel hands the pod's TSO sends to
//     the TUN whole, and gVisor's GSO segments go out whole: both directions
//     average well above the veth's 1500 bytes;
//   - with TUNOptions.NoOffload, every packet is cut to the MSS first: both
//     directions stay at or below 1500.
//
// The transfers also prove the virtio-net headers right: a wrong checksum
// offset or MSS would make the kernel drop or mangle the segments.
func TestTUNOffloadsPodClient(t *testing.T) {
	for _, tc := range []struct {
		name      string
		noOffload bool
	}{{"offload", false}, {"no offload", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h, cl, link := podTUNEnv(t, tc.noOffload)
			if link.Offload == tc.noOffload {
				t.Fatalf("Link.Offload = %v with NoOffload %v (refused: %v)", link.Offload, tc.noOffload, link.OffloadRefused)
			}
			for _, fam := range []struct{ name, host, up, down string }{
				{"v4", "127.0.0.1", "10.96.0.21", "10.96.0.22"},
				{"v6", "::1", "fd00:96::21", "fd00:96::22"},
			} {
				up := startTCPBackend(t, fam.host, func(c net.Conn) {
					hs := sha256.New()
					if _, err := io.Copy(hs, c); err != nil {
						return
					}
					_, _ = c.Write(hs.Sum(nil))
				})
				down := startTCPBackend(t, fam.host, func(c net.Conn) {
					var seed [8]byte
					if _, err := io.ReadFull(c, seed[:]); err != nil {
						return
					}
					_, _ = io.Copy(c, io.LimitReader(patternReader(binary.BigEndian.Uint64(seed[:])), offloadBytes))
				})
				h.addService("up-"+fam.name, fam.up, v1.ProtocolTCP, 80, false, up.addr)
				h.addService("down-"+fam.name, fam.down, v1.ProtocolTCP, 80, false, down.addr)
				origMean := offloadUpload(t, cl, h.ct, fam.up)
				replyMean := offloadDownload(t, cl, h.ct, fam.down)
				t.Logf("%s: mean packet into the TUN (client -> endpoint) %d bytes, out of it (endpoint -> client) %d bytes", fam.up, origMean, replyMean)
				if tc.noOffload {
					if origMean > podVethMTU || replyMean > podVethMTU {
						t.Errorf("%s without offloads: mean packets %d in, %d out; want both <= %d", fam.up, origMean, replyMean, podVethMTU)
					}
				} else if origMean <= 2*podVethMTU || replyMean <= 2*podVethMTU {
					t.Errorf("%s with offloads: mean packets %d in, %d out; want both > %d (super-packets)", fam.up, origMean, replyMean, 2*podVethMTU)
				}
			}
			if s := h.st.Stats(); s.InvalidIn != 0 || s.InvalidOut != 0 || s.LinkUnsupported != 0 {
				t.Errorf("gate: %d INVALID in, %d out, %d unsupported; want none", s.InvalidIn, s.InvalidOut, s.LinkUnsupported)
			}
		})
	}
}

// offloadBytes is what each transfer of TestTUNOffloadsPodClient moves.
const offloadBytes = 32 << 20

// podVethMTU is the MTU of the pod-like client's veth.
const podVethMTU = 1500

// offloadUpload sends offloadBytes to svc:80, checks the endpoint's SHA-256
// of them, and returns the mean size of the flow's Original-direction
// packets as conntrack counted them at the gate.
func offloadUpload(t *testing.T, cl *nsClient, ct *conntrack.Table, svc string) uint64 {
	t.Helper()
	c := dialBulk(t, cl, svc)
	defer c.Close()
	hs := sha256.New()
	if _, err := io.Copy(io.MultiWriter(c, hs), io.LimitReader(patternReader(1), offloadBytes)); err != nil {
		t.Fatalf("upload to %s: %v", svc, err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil || !bytes.Equal(got, hs.Sum(nil)) {
		t.Fatalf("upload to %s: the endpoint's SHA-256 %x (err %v), sent %x", svc, got, err, hs.Sum(nil))
	}
	e := flowEntry(t, ct, c)
	return e.Bytes[conntrack.Original] / max(e.Packets[conntrack.Original], 1)
}

// offloadDownload has svc:80 send offloadBytes of a seeded pattern, checks
// them, and returns the mean size of the flow's Reply-direction packets.
func offloadDownload(t *testing.T, cl *nsClient, ct *conntrack.Table, svc string) uint64 {
	t.Helper()
	c := dialBulk(t, cl, svc)
	defer c.Close()
	const seed = 7
	if _, err := c.Write(binary.BigEndian.AppendUint64(nil, seed)); err != nil {
		t.Fatal(err)
	}
	want := sha256.New()
	_, _ = io.Copy(want, io.LimitReader(patternReader(seed), offloadBytes))
	got := sha256.New()
	n, err := io.Copy(got, c)
	if err != nil || n != offloadBytes || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("download from %s: %d bytes (err %v), SHA-256 match %v; want %d", svc, n, err, bytes.Equal(got.Sum(nil), want.Sum(nil)), offloadBytes)
	}
	e := flowEntry(t, ct, c)
	return e.Bytes[conntrack.Reply] / max(e.Packets[conntrack.Reply], 1)
}

// dialBulk connects to svc:80 from the pod, with a deadline far beyond what
// a transfer takes, so that a broken path fails the test instead of hanging.
func dialBulk(t *testing.T, cl *nsClient, svc string) net.Conn {
	t.Helper()
	c, err := cl.dial("tcp", net.JoinHostPort(svc, "80"))
	if err != nil {
		t.Fatalf("dial %s: %v", svc, err)
	}
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	return c
}

// flowEntry returns the conntrack entry of the client connection c.
func flowEntry(t *testing.T, ct *conntrack.Table, c net.Conn) conntrack.EntryInfo {
	t.Helper()
	src := c.LocalAddr().(*net.TCPAddr).AddrPort()
	dst := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	e, ok := ct.Get(conntrack.MakeTuple(conntrack.TCP, netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())))
	if !ok {
		t.Fatalf("no conntrack entry for %s -> %s", src, dst)
	}
	return e
}

// patternReader is an endless stream of seeded pseudo-random bytes.
func patternReader(seed uint64) io.Reader {
	var key [32]byte
	binary.BigEndian.PutUint64(key[:], seed)
	return rand.NewChaCha8(key)
}

// podTUNEnv is tunEnv with the client one hop away: namespace U holds the
// TUN (with offloads unless noOffload) and forwards; namespace P, the pod,
// reaches it over a veth of MTU 1500 (198.18.9.2/24 and 2001:db8:9::2/64,
// default routes via U's end). Nothing in either routes anywhere else.
func podTUNEnv(t *testing.T, noOffload bool) (*rig, *nsClient, *netstack.Link) {
	requireRoot(t)
	u, uName := newNetNS(t)
	pod, podName := newNetNS(t)
	var link *netstack.Link
	err := inNS(u, func() error {
		var err error
		link, err = setUpTUN(netstack.TUNOptions{Name: "upx0", MTU: tunMTU, NoOffload: noOffload})
		if err != nil {
			return err
		}
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
				return fmt.Errorf("sysctl %s: %w", f, err)
			}
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0", MTU: podVethMTU, HardwareAddr: podNodeMAC},
			PeerName: "eth0", PeerHardwareAddr: podMAC, PeerNamespace: netlink.NsFd(pod)}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("veth: %w", err)
		}
		if err := addrsUp("pod0", "198.18.9.1/24", "2001:db8:9::1/64"); err != nil {
			return err
		}
		return staticNeighbours("pod0", podMAC, "198.18.9.2", "2001:db8:9::2")
	})
	if err != nil {
		t.Fatalf("setting up namespace %s: %v", uName, err)
	}
	err = inNS(pod, func() error {
		for _, kv := range [][2]string{{"accept_dad", "0"}, {"addr_gen_mode", "1"}} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/eth0/"+kv[0], []byte(kv[1]), 0o644); err != nil {
				return fmt.Errorf("sysctl %s: %w", kv[0], err)
			}
		}
		if err := addrsUp("eth0", "198.18.9.2/24", "2001:db8:9::2/64"); err != nil {
			return err
		}
		if err := staticNeighbours("eth0", podNodeMAC, "198.18.9.1", "2001:db8:9::1"); err != nil {
			return err
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		for _, gw := range []string{"198.18.9.1", "2001:db8:9::1"} {
			if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.ParseIP(gw)}); err != nil {
				return fmt.Errorf("default route via %s: %w", gw, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("setting up namespace %s: %v", podName, err)
	}
	h := newRig(t, link, testSeed(t, 20))
	c := &nsClient{ns: pod, work: make(chan func())}
	startWorkers(t, c)
	return h, c, link
}

// The pod veth's MACs: U's end and the pod's.
var (
	podNodeMAC = net.HardwareAddr{0x02, 0x75, 0x70, 0x78, 0x00, 0x01}
	podMAC     = net.HardwareAddr{0x02, 0x75, 0x70, 0x78, 0x00, 0x02}
)

// staticNeighbours makes the peer's addresses permanent neighbours at mac
// on link name: a workaround. Under the plain-mode flood of 1 MiB copy
// buffers, U's IPv6 entry for the pod was found INCOMPLETE at a stall, with
// no neighbour solicitation ever sent from U (nstat: 0) and 87 ICMPv6
// errors rate-limited, while the forwarded segments died waiting for it;
// the IPv6 download then stalled until its deadline, in 1 of every 2-4
// runs. Why the kernel never solicited was not found. With static entries:
// no stall in 28 runs. Neighbour discovery is not what these tests are
// about.
func staticNeighbours(name string, mac net.HardwareAddr, addrs ...string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	for _, a := range addrs {
		ip := net.ParseIP(a)
		family := netlink.FAMILY_V6
		if ip.To4() != nil {
			family = netlink.FAMILY_V4
		}
		n := &netlink.Neigh{LinkIndex: l.Attrs().Index, Family: family, State: netlink.NUD_PERMANENT, IP: ip, HardwareAddr: mac}
		if err := netlink.NeighAdd(n); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", a, name, err)
		}
	}
	return nil
}

// addrsUp puts the addresses on the device name (without DAD) and brings it
// up.
func addrsUp(name string, addrs ...string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		p := netip.MustParsePrefix(a)
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(p), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("%s on %s: %w", a, name, err)
		}
	}
	return netlink.LinkSetUp(l)
}

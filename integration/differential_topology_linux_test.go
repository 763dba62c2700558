//go:build linux

package integration

// The topology of the kernel differential suite (issue 7): the same Services
// and EndpointSlices served twice, to the same backends, once by the kernel
// with the iptables rules kube-proxy would write and once by userproxy on a
// TUN, so that every scenario can send the same traffic down both paths and
// compare what the clients see.
//
//	kernel client ns (K)                   backends ns (B)                    userproxy client ns (U)
//	 kc0 192.0.2.1/24 + clients/32 ══ veth ══ kb0 192.0.2.254/24
//	 nat+filter: `userproxy rules`            lo 198.51.100.1-5 (endpoints)
//	 10.96.0.0/12, 198.51.100.0/24            ub0 203.0.113.254/24 ══ veth ══ uc0 203.0.113.1/24 + clients/32
//	   via 192.0.2.254                                                          userproxy run, TUN upxd0 (10.96.0.0/12)
//	                                                                            198.51.100.0/24 via 203.0.113.254
//
// 1. B holds the endpoints: TCP servers on ENDPOINT:8080 and UDP servers on
//    ENDPOINT:5353 that answer with their own address, so a client learns
//    which endpoint it reached.
// 2. K is the kernel path: its nat and filter tables hold exactly what
//    `userproxy rules --format restore --jump-rules` prints for the config
//    (loaded with iptables-restore); clients there are DNATed and routed to B.
// 3. U is our path: the real binary runs there on a TUN with the same config
//    file and dials the endpoints from 203.0.113.1.
// 4. Both client namespaces hold the same client addresses (192.0.2.1 and a
//    pool from 192.0.2.10), so the two paths see the same client identities.
//
// Nothing routes out of any namespace: every route points at a veth peer the
// test created, and everything is deleted when the test ends.
//
// With external clients (newDiffTopoWith, diffOptions.external; issue 16),
// K and U are also nodes: each gets a second veth to a client namespace of
// its own, with the same addresses on both paths, so that NodePorts,
// externalIPs and LB IPs are reached from outside the node:
//
//	external client ns (XK)                     K (the kernel's node)
//	 xk0 198.51.100.130/26 + .131/32 ══ veth ══ kx0 198.51.100.129/26 (the node IP), ip_forward=1
//	 198.51.100.192/26 via .129                  `userproxy rules --nodeport-addresses 198.51.100.129/32`
//	external client ns (XU)                     U (our node)
//	 xu0 198.51.100.130/26 + .131/32 ══ veth ══ ux0 198.51.100.129/26, ip_forward=1 (into the TUN)
//	 198.51.100.192/26 via .129                  `userproxy run --nodeport-addresses 198.51.100.129/32`
//	                                            B: 198.51.100.128/26 via 192.0.2.1 (K)
//
// 5. The external IPs and LB IPs of the config are in 198.51.100.192/26: the
//    clients route them to their node. K DNATs them (and its NodePorts) in
//    PREROUTING and forwards to B, masquerading as KUBE-POSTROUTING says;
//    U routes them into the TUN (run adds a /32 each) and serves the
//    NodePorts on host sockets on 198.51.100.129.
// 6. Under externalTrafficPolicy Local the kernel keeps the client's address
//    (no masquerade), so B routes the external clients' network back
//    through K; userproxy dials from 203.0.113.1 whatever the policy.

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The topology's constants.
const (
	diffNode      = "node-a" // --node-name of both paths
	diffOtherNode = "node-b" // where the endpoints of a Local service live
	diffBackends  = 5        // endpoint addresses in B
	diffTCPPort   = 8080     // the endpoints' TCP port (targetPort)
	diffUDPPort   = 5353     // the endpoints' UDP port
	diffPoolSize  = 131      // client addresses besides the main one: 101+ for the affinity list test
	diffTUN       = "upxd0"
)

var (
	diffClient   = netip.MustParseAddr("192.0.2.1")   // the main client address on both paths
	diffPoolBase = netip.MustParseAddr("192.0.2.10")  // first of the pool of client addresses
	diffKernelGW = netip.MustParseAddr("192.0.2.254") // B's end of K's veth
	diffOursAddr = netip.MustParseAddr("203.0.113.1") // U's own address: userproxy dials from it
	diffOursGW   = netip.MustParseAddr("203.0.113.254")
	diffEPNet    = netip.MustParsePrefix("198.51.100.0/24")

	// The external clients' side (diffOptions.external).
	diffNodeIP    = netip.MustParseAddr("198.51.100.129")      // K's and U's address toward their external client
	diffExtClient = netip.MustParseAddr("198.51.100.130")      // the external client on both paths
	diffExtOther  = netip.MustParseAddr("198.51.100.131")      // a second external client address
	diffExtNet    = netip.MustParsePrefix("198.51.100.128/26") // the link between a node and its external client
	diffExtVIPs   = netip.MustParsePrefix("198.51.100.192/26") // externalIPs and LB IPs, routed by the clients to the node
)

// diffBackend returns the i-th endpoint address (0-based): 198.51.100.(i+1).
func diffBackend(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(i + 1)}) }

// diffPool returns the i-th pool client address: 192.0.2.(10+i).
func diffPool(i int) netip.Addr {
	a := diffPoolBase.As4()
	a[3] += byte(i)
	return netip.AddrFrom4(a)
}

// diffService is one Service with one port (TCP 80 -> 8080, or UDP 53 ->
// 5353) and one EndpointSlice, in the config both paths read.
type diffService struct {
	name      string
	clusterIP string
	udp       bool
	endpoints []netip.Addr // nil: a slice without endpoints
	affinity  int          // sessionAffinity ClientIP with this timeoutSeconds; 0: none
	local     bool         // internalTrafficPolicy Local, endpoints on another node

	// External destinations (issue 16). A nodePort makes the Service type
	// NodePort, LB IPs make it LoadBalancer.
	nodePort    int            // spec.ports[0].nodePort; 0: none
	externalIPs []netip.Addr   // spec.externalIPs
	lbIPs       []netip.Addr   // status.loadBalancer.ingress
	ranges      []netip.Prefix // spec.loadBalancerSourceRanges
	extLocal    bool           // externalTrafficPolicy Local
	otherNode   []netip.Addr   // more endpoints, on diffOtherNode
}

func (s diffService) port() int {
	if s.udp {
		return 53
	}
	return 80
}

// diffConfig is the YAML of the services, as kubectl would print them.
func diffConfig(svcs []diffService) string {
	var b strings.Builder
	for _, s := range svcs {
		proto, target := "TCP", diffTCPPort
		if s.udp {
			proto, target = "UDP", diffUDPPort
		}
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: default}\nspec:\n", s.name)
		fmt.Fprintf(&b, "  clusterIP: %s\n  clusterIPs: [%s]\n", s.clusterIP, s.clusterIP)
		nodePort := ""
		if s.nodePort != 0 {
			nodePort = fmt.Sprintf(", nodePort: %d", s.nodePort)
		}
		fmt.Fprintf(&b, "  ports: [{name: p, protocol: %s, port: %d, targetPort: %d%s}]\n", proto, s.port(), target, nodePort)
		s.writeExternal(&b)
		if s.affinity > 0 {
			fmt.Fprintf(&b, "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: %d}}\n", s.affinity)
		}
		node := diffNode
		if s.local {
			b.WriteString("  internalTrafficPolicy: Local\n")
			node = diffOtherNode
		}
		s.writeStatus(&b)
		var eps []string
		for _, a := range s.endpoints {
			eps = append(eps, fmt.Sprintf("{addresses: [%s], nodeName: %s}", a, node))
		}
		for _, a := range s.otherNode {
			eps = append(eps, fmt.Sprintf("{addresses: [%s], nodeName: %s}", a, diffOtherNode))
		}
		fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n")
		fmt.Fprintf(&b, "metadata: {name: %s-1, namespace: default, labels: {kubernetes.io/service-name: %s}}\n", s.name, s.name)
		fmt.Fprintf(&b, "addressType: IPv4\nendpoints: [%s]\nports: [{name: p, protocol: %s, port: %d}]\n",
			strings.Join(eps, ", "), proto, target)
	}
	return b.String()
}

// writeExternal writes the Service's type and external fields into its
// spec (nothing for a plain ClusterIP service).
func (s diffService) writeExternal(b *strings.Builder) {
	list := func(key string, vals []string) {
		if len(vals) > 0 {
			fmt.Fprintf(b, "  %s: [%s]\n", key, strings.Join(vals, ", "))
		}
	}
	switch {
	case len(s.lbIPs) > 0:
		b.WriteString("  type: LoadBalancer\n")
	case s.nodePort != 0:
		b.WriteString("  type: NodePort\n")
	}
	var ips, ranges []string
	for _, a := range s.externalIPs {
		ips = append(ips, a.String())
	}
	for _, r := range s.ranges {
		ranges = append(ranges, r.String())
	}
	list("externalIPs", ips)
	list("loadBalancerSourceRanges", ranges)
	if s.extLocal {
		b.WriteString("  externalTrafficPolicy: Local\n")
	}
}

// writeStatus writes the Service's status: its LB IPs (nothing without).
func (s diffService) writeStatus(b *strings.Builder) {
	if len(s.lbIPs) == 0 {
		return
	}
	ing := make([]string, len(s.lbIPs))
	for i, a := range s.lbIPs {
		ing[i] = "{ip: " + a.String() + "}"
	}
	fmt.Fprintf(b, "status:\n  loadBalancer:\n    ingress: [%s]\n", strings.Join(ing, ", "))
}

// diffTopo is the whole topology of one test.
type diffTopo struct {
	t       *testing.T
	bin     string
	cfg     string // the config file both paths read
	back    *nsClient
	kernel  *diffPath
	ours    *diffPath
	listTot int // xt_recent's ip_list_tot, also userproxy's --affinity-list-size

	// With diffOptions.external: the external client of each path (XK, XU).
	extKernel, extOurs *diffPath
}

// diffOptions are the optional parts of the topology.
type diffOptions struct {
	// external adds a client namespace behind each path's node and serves
	// NodePorts on the node IP on both paths (the diagram's second part).
	external bool
}

// diffPath is one client namespace: the kernel's or ours.
type diffPath struct {
	name   string // "kernel" or "userproxy"
	ns     netns.NsHandle
	nsName string
	c      *nsClient
	admin  *binNS // userproxy: its admin server (nil for the kernel)
	proc   *proc  // userproxy: the running binary
}

// newDiffTopo builds the namespaces, the endpoints, loads the kernel rules
// for svcs and starts userproxy on the same config; everything is removed
// when the test ends.
func newDiffTopo(t *testing.T, svcs []diffService) *diffTopo {
	t.Helper()
	return newDiffTopoWith(t, svcs, diffOptions{})
}

// newDiffTopoWith is newDiffTopo with the optional parts of opts.
func newDiffTopoWith(t *testing.T, svcs []diffService, opts diffOptions) *diffTopo {
	t.Helper()
	requireRoot(t)
	for _, tool := range []string{"ip", "iptables-restore", "iptables-save", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the kernel path needs %s (apt-get install iproute2 iptables): %v", tool, err)
		}
	}
	tp := &diffTopo{t: t, bin: userproxyBinary(t)}
	start := time.Now()
	bNS, bName := newNetNS(t)
	kNS, kName := newNetNS(t)
	uNS, uName := newNetNS(t)
	tp.kernel = &diffPath{name: "kernel", ns: kNS, nsName: kName}
	tp.ours = &diffPath{name: "userproxy", ns: uNS, nsName: uName}

	// B: endpoints on loopback.
	if err := inNS(bNS, func() error {
		lo, err := linkUp("lo")
		if err != nil {
			return err
		}
		for i := range diffBackends {
			if err := addAddr(lo, netip.PrefixFrom(diffBackend(i), 32)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("backends namespace %s: %v", bName, err)
	}
	// K and U: a veth pair each to B, the client addresses, the routes.
	clientPrefixes := []netip.Prefix{netip.PrefixFrom(diffClient, 32)}
	for i := range diffPoolSize {
		clientPrefixes = append(clientPrefixes, netip.PrefixFrom(diffPool(i), 32))
	}
	kernelSide := vethSpec{
		local: "kc0", peer: "kb0",
		localAddr: netip.PrefixFrom(diffClient, 24), peerAddr: netip.PrefixFrom(diffKernelGW, 24),
		extra:  clientPrefixes[1:], // 192.0.2.1 is the /24 itself
		routes: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), diffEPNet},
	}
	oursSide := vethSpec{
		local: "uc0", peer: "ub0",
		localAddr: netip.PrefixFrom(diffOursAddr, 24), peerAddr: netip.PrefixFrom(diffOursGW, 24),
		extra:  clientPrefixes,
		routes: []netip.Prefix{diffEPNet}, // userproxy adds the service CIDR route to its TUN
	}
	for _, s := range []struct {
		ns   netns.NsHandle
		name string
		spec vethSpec
	}{{kNS, kName, kernelSide}, {uNS, uName, oursSide}} {
		if err := s.spec.create(s.ns, bNS); err != nil {
			t.Fatalf("veth %s/%s between %s and %s: %v", s.spec.local, s.spec.peer, s.name, bName, err)
		}
	}

	if opts.external {
		tp.addExternalClients(bNS)
	}

	tp.back = &nsClient{ns: bNS, work: make(chan func())}
	startWorkers(t, tp.back)
	tp.kernel.c = &nsClient{ns: kNS, work: make(chan func())}
	startWorkers(t, tp.kernel.c)
	tp.ours.c = &nsClient{ns: uNS, work: make(chan func())}
	startWorkers(t, tp.ours.c)
	tp.startBackends()

	tp.cfg = filepath.Join(t.TempDir(), "services.yaml")
	writeFile(t, tp.cfg, diffConfig(svcs))
	tp.loadKernelRules()
	tp.listTot = xtRecentListTot(t)

	tp.ours.admin = &binNS{t: t, ns: uNS, name: uName, c: tp.ours.c}
	args := []string{"ip", "netns", "exec", uName, tp.bin, "run", "--config", tp.cfg,
		"--tun-name", diffTUN, "--min-sync-period", "0", "--admin-addr", "127.0.0.1:10249", "--mtu", "65520",
		"--node-name", diffNode, "--affinity-list-size", strconv.Itoa(tp.listTot),
		"--log-format", "json", "--log-level", "info"}
	if tp.extOurs != nil {
		args = append(args, "--nodeport-addresses", netip.PrefixFrom(diffNodeIP, 32).String())
	}
	tp.ours.proc = startProc(t, args...)
	t.Cleanup(func() {
		if tp.ours.proc.cmd.ProcessState == nil {
			if err := tp.ours.proc.stop(t); err != nil {
				t.Errorf("userproxy exit: %v", err)
			}
		}
	})
	tp.ours.admin.waitHealthy(tp.ours.proc)
	tp.waitOurTable(func(services string) bool {
		for _, s := range svcs {
			if !strings.Contains(services, "default/"+s.name+":p ") {
				return false
			}
		}
		return true
	})
	t.Logf("topology up in %v: kernel path in %s, userproxy in %s, endpoints in %s",
		time.Since(start).Round(time.Millisecond), kName, uName, bName)
	return tp
}

// vethSpec is one client namespace's link to B.
type vethSpec struct {
	local, peer         string
	localAddr, peerAddr netip.Prefix
	extra               []netip.Prefix // more addresses on the local end
	routes              []netip.Prefix // via the peer's address
}

// create makes the veth pair inside ns with its peer in back, addresses
// both ends and adds the routes in ns (with the namespace's own address as
// source, so that extra client addresses are used only when bound).
func (v vethSpec) create(ns, back netns.NsHandle) error {
	err := inNS(ns, func() error {
		if _, err := linkUp("lo"); err != nil {
			return err
		}
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: v.local}, PeerName: v.peer, PeerNamespace: netlink.NsFd(int(back))}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("adding the veth pair: %w", err)
		}
		l, err := linkUp(v.local)
		if err != nil {
			return err
		}
		for _, p := range append([]netip.Prefix{v.localAddr}, v.extra...) {
			if err := addAddr(l, p); err != nil {
				return err
			}
		}
		for _, dst := range v.routes {
			r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(dst), Gw: v.peerAddr.Addr().AsSlice(), Src: v.localAddr.Addr().AsSlice()}
			if err := netlink.RouteAdd(r); err != nil {
				return fmt.Errorf("route %s: %w", dst, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return inNS(back, func() error {
		l, err := linkUp(v.peer)
		if err != nil {
			return err
		}
		return addAddr(l, v.peerAddr)
	})
}

// addExternalClients builds the external client namespace of each path
// (the diagram's second part): its veth to the node, the node's forwarding,
// and B's route back through K for the kernel's unmasqueraded flows.
func (tp *diffTopo) addExternalClients(bNS netns.NsHandle) {
	t := tp.t
	t.Helper()
	for _, s := range []struct {
		node        *diffPath
		ext         **diffPath
		local, peer string
	}{{tp.kernel, &tp.extKernel, "xk0", "kx0"}, {tp.ours, &tp.extOurs, "xu0", "ux0"}} {
		xNS, xName := newNetNS(t)
		spec := vethSpec{
			local: s.local, peer: s.peer,
			localAddr: netip.PrefixFrom(diffExtClient, diffExtNet.Bits()),
			peerAddr:  netip.PrefixFrom(diffNodeIP, diffExtNet.Bits()),
			extra:     []netip.Prefix{netip.PrefixFrom(diffExtOther, 32)},
			routes:    []netip.Prefix{diffExtVIPs},
		}
		if err := spec.create(xNS, s.node.ns); err != nil {
			t.Fatalf("veth %s/%s between %s and %s: %v", spec.local, spec.peer, xName, s.node.nsName, err)
		}
		nsSysctl(t, s.node.nsName, "net.ipv4.ip_forward", "1")
		x := &diffPath{name: s.node.name, ns: xNS, nsName: xName, c: &nsClient{ns: xNS, work: make(chan func())}}
		startWorkers(t, x.c)
		*s.ext = x
	}
	if err := inNS(bNS, func() error {
		kb0, err := netlink.LinkByName("kb0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: kb0.Attrs().Index, Dst: prefixNet(diffExtNet), Gw: diffClient.AsSlice()})
	}); err != nil {
		t.Fatalf("route to the external clients through K: %v", err)
	}
}

func linkUp(name string) (netlink.Link, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("link %s up: %w", name, err)
	}
	return l, nil
}

func addAddr(l netlink.Link, p netip.Prefix) error {
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(p)}); err != nil {
		return fmt.Errorf("address %s on %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// startBackends serves TCP and UDP on every endpoint address in B; each
// answers with its own address.
func (tp *diffTopo) startBackends() {
	t := tp.t
	for i := range diffBackends {
		addr := diffBackend(i)
		var ln net.Listener
		var pc net.PacketConn
		err := tp.back.run(func() (err error) {
			if ln, err = net.Listen("tcp4", netip.AddrPortFrom(addr, diffTCPPort).String()); err != nil {
				return err
			}
			pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(addr, diffUDPPort).String())
			return err
		})
		if err != nil {
			if ln != nil {
				ln.Close()
			}
			t.Fatalf("endpoint %s: %v", addr, err)
		}
		serveTCP(t, ln, nameServer(addr.String()))
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // UDP endpoint: answers each datagram with its address
			defer wg.Done()
			buf := make([]byte, 1500)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo([]byte(addr.String()), from)
			}
		}()
		t.Cleanup(func() { pc.Close(); wg.Wait() })
	}
}

// loadKernelRules replaces K's iptables rules with what `userproxy rules`
// prints for the current config, as kube-proxy's sync would (the jump rules
// included, since nothing else creates them in a fresh namespace).
func (tp *diffTopo) loadKernelRules() {
	t := tp.t
	t.Helper()
	args := []string{tp.bin, "rules", "--config", tp.cfg, "--format", "restore", "--jump-rules", "--node-name", diffNode}
	if tp.extKernel != nil {
		// kube-proxy matches --nodeport-addresses against the node's own
		// addresses: run the command in K, whose address the node IP is.
		args = append([]string{"ip", "netns", "exec", tp.kernel.nsName}, args...)
		args = append(args, "--nodeport-addresses", netip.PrefixFrom(diffNodeIP, 32).String())
	}
	rules, err := exec.Command(args[0], args[1:]...).Output()
	if err != nil {
		t.Fatalf("userproxy rules: %v", exitDetail(err))
	}
	cmd := exec.Command("ip", "netns", "exec", tp.kernel.nsName, "iptables-restore")
	cmd.Stdin = strings.NewReader(string(rules))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("iptables-restore in %s: %v: %s\ninput:\n%s", tp.kernel.nsName, err, out, rules)
	}
}

func exitDetail(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return fmt.Errorf("%w: %s", err, ee.Stderr)
	}
	return err
}

// xtRecentListTot is the kernel's xt_recent list size (the ip_list_tot
// module parameter, default 100; loaded with the first recent rule).
func xtRecentListTot(t *testing.T) int {
	b, err := os.ReadFile("/sys/module/xt_recent/parameters/ip_list_tot")
	if err != nil {
		return 100 // not loaded: no recent rule yet, the default applies when it is
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n <= 0 {
		t.Fatalf("xt_recent ip_list_tot %q: %v", b, err)
	}
	return n
}

// reload writes a new config: the kernel path gets the new rules at once
// (the caller does the conntrack cleanup kube-proxy would); userproxy
// reloads the file by itself (the caller waits for it).
func (tp *diffTopo) reload(svcs []diffService) {
	tp.t.Helper()
	writeFile(tp.t, tp.cfg, diffConfig(svcs))
	tp.loadKernelRules()
}

// waitOurTable polls userproxy's /debug/services until ok accepts it.
func (tp *diffTopo) waitOurTable(ok func(services string) bool) {
	t := tp.t
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body, err := tp.ours.admin.get("/debug/services")
		if err == nil && code == http.StatusOK && ok(body) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("userproxy's table did not become what the test expects within 10 s: %d %v\n%s", code, err, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// paths returns both paths, the kernel first.
func (tp *diffTopo) paths() []*diffPath { return []*diffPath{tp.kernel, tp.ours} }

// dial connects from src (bound, any port) to addr within timeout.
func (p *diffPath) dial(src netip.Addr, addr string, timeout time.Duration) (net.Conn, error) {
	var conn net.Conn
	err := p.c.run(func() (err error) {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
		conn, err = d.Dial("tcp4", addr)
		return err
	})
	return conn, err
}

// fetch connects from src to addr and returns the endpoint that answered.
func (p *diffPath) fetch(src netip.Addr, addr string) (netip.Addr, error) {
	c, err := p.dial(src, addr, 5*time.Second)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s from %s: reading: %w", addr, src, err)
	}
	ep, err := netip.ParseAddr(string(b))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s from %s: the endpoint said %q", addr, src, b)
	}
	return ep, nil
}

// udpFlow opens a UDP socket bound to src (any port) and connected to addr:
// one flow.
func (p *diffPath) udpFlow(src netip.Addr, addr string) (net.Conn, error) {
	var conn net.Conn
	err := p.c.run(func() (err error) {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: src.AsSlice()}}
		conn, err = d.Dial("udp4", addr)
		return err
	})
	return conn, err
}

// udpAsk sends one datagram on a flow and returns the endpoint that answered.
func udpAsk(c net.Conn) (netip.Addr, error) {
	if _, err := c.Write([]byte("which endpoint?")); err != nil {
		return netip.Addr{}, err
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("flow %s: %w", c.LocalAddr(), err)
	}
	return netip.ParseAddr(string(buf[:n]))
}

// dialOutcome names how a dial ended: connected, ECONNREFUSED, timeout, or
// the error.
func dialOutcome(c net.Conn, err error) string {
	var ne net.Error
	switch {
	case err == nil:
		c.Close()
		return "connected"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "ECONNREFUSED"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return err.Error()
}

// The kernel path's counters.

// iptablesSave returns `iptables-save -c -t table` of K.
func (tp *diffTopo) iptablesSave(table string) string {
	tp.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", tp.kernel.nsName, "iptables-save", "-c", "-t", table).Output()
	if err != nil {
		tp.t.Fatalf("iptables-save -c -t %s: %v", table, exitDetail(err))
	}
	return string(out)
}

// ruleCounter sums the packet counters of the rules in chain (a chain name
// or a prefix such as "KUBE-SVC-") whose iptables-save text contains every
// one of parts.
func ruleCounter(save, chain string, parts ...string) int {
	total := 0
	for line := range strings.Lines(save) {
		// "[pkts:bytes] -A CHAIN rule..."
		ctr, rule, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(ctr, "[") || !strings.HasPrefix(rule, "-A "+chain) {
			continue
		}
		match := true
		for _, p := range parts {
			if !strings.Contains(rule, p) {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		pkts, _, _ := strings.Cut(strings.Trim(ctr, "[]"), ":")
		n, err := strconv.Atoi(pkts)
		if err == nil {
			total += n
		}
	}
	return total
}

// kernelAffinityHits is the kernel's count of new connections that ClientIP
// affinity decided for a service: the packet counters of the `-m recent
// --rcheck` rules of its KUBE-SVC chain (nat rules see only the first packet
// of a connection).
func (tp *diffTopo) kernelAffinityHits(svc string) int {
	return ruleCounter(tp.iptablesSave("nat"), "KUBE-SVC-", "--rcheck", `"default/`+svc+`:p -> `)
}

// conntrackInvalid is K's nf_conntrack "invalid" statistic summed over CPUs
// (/proc/net/stat/nf_conntrack, per network namespace, hexadecimal): the
// packets the conntrack hooks found to be no valid part of a connection.
func (tp *diffTopo) conntrackInvalid() int {
	tp.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", tp.kernel.nsName, "cat", "/proc/net/stat/nf_conntrack").Output()
	if err != nil {
		tp.t.Fatalf("reading /proc/net/stat/nf_conntrack: %v", exitDetail(err))
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	col := -1
	for i, f := range strings.Fields(lines[0]) {
		if f == "invalid" {
			col = i
		}
	}
	if col < 0 {
		tp.t.Fatalf("no invalid column in /proc/net/stat/nf_conntrack:\n%s", out)
	}
	total := 0
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if col < len(f) {
			v, err := strconv.ParseUint(f[col], 16, 64)
			if err != nil {
				tp.t.Fatalf("/proc/net/stat/nf_conntrack: %q: %v", l, err)
			}
			total += int(v)
		}
	}
	return total
}

// kernelSysctl sets a sysctl in K.
func (tp *diffTopo) kernelSysctl(key, value string) {
	tp.t.Helper()
	nsSysctl(tp.t, tp.kernel.nsName, key, value)
}

// nsSysctl sets a sysctl in the named namespace.
func nsSysctl(t *testing.T, nsName, key, value string) {
	t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", nsName, "sysctl", "-qw", key+"="+value).CombinedOutput(); err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v: %s", key, value, nsName, err, out)
	}
}

// kernelConntrack returns K's connection tracking handle (netlink, as
// kube-proxy's conntrack cleanup uses it).
func (tp *diffTopo) kernelConntrack() *netlink.Handle {
	tp.t.Helper()
	h, err := netlink.NewHandleAt(tp.kernel.ns, unix.NETLINK_NETFILTER)
	if err != nil {
		tp.t.Fatalf("netlink handle in %s: %v", tp.kernel.nsName, err)
	}
	tp.t.Cleanup(h.Close)
	return h
}

// Our path's counters.

// metrics scrapes userproxy's /metrics.
func (tp *diffTopo) metrics() string {
	tp.t.Helper()
	code, body, err := tp.ours.admin.get("/metrics")
	if err != nil || code != http.StatusOK {
		tp.t.Fatalf("/metrics: %d %v", code, err)
	}
	return body
}

// metric returns the value of one series, written as in the scrape
// (`name` or `name{label="v",...}`), or 0 when absent (a counter not yet
// touched).
func metric(body, series string) float64 {
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return 0
}

// tcpCapture is a raw IPPROTO_TCP socket in a namespace: it gets a copy of
// every TCP segment delivered locally there, which is how the scenarios see
// whether anything answered a crafted packet with a RST.
type tcpCapture struct{ fd int }

func (c *nsClient) captureTCP() (*tcpCapture, error) {
	var fd int
	err := c.run(func() (err error) {
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_TCP)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		tv := syscall.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
		return syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		return nil, err
	}
	return &tcpCapture{fd: fd}, nil
}

func (cp *tcpCapture) close() { syscall.Close(cp.fd) }

// resets reads for up to window and counts the RSTs from `from` to local
// port toPort; it returns early once it has seen until of them (0: never).
func (cp *tcpCapture) resets(from netip.AddrPort, toPort uint16, window time.Duration, until int) (int, error) {
	buf := make([]byte, 1500)
	n := 0
	for deadline := time.Now().Add(window); time.Now().Before(deadline) && (until == 0 || n < until); {
		m, _, err := syscall.Recvfrom(cp.fd, buf, 0)
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		pkt := buf[:m]
		if m < 20 {
			continue
		}
		ihl := int(pkt[0]&0x0f) * 4
		if m < ihl+14 {
			continue
		}
		src := netip.AddrFrom4([4]byte(pkt[12:16]))
		sport := uint16(pkt[ihl])<<8 | uint16(pkt[ihl+1])
		dport := uint16(pkt[ihl+2])<<8 | uint16(pkt[ihl+3])
		if src == from.Addr() && sport == from.Port() && dport == toPort && pkt[ihl+13]&0x04 != 0 {
			n++
		}
	}
	return n, nil
}

//go:build linux

package integration

import (
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"
)

// kernelPath is the kernel's own service path for the benchmarks: in a
// fresh namespace, the endpoint listens on loopback and an iptables nat
// OUTPUT rule DNATs the service address to it, as kube-proxy's KUBE-SEP rule
// does for a service with one endpoint. The client dials from the same
// namespace.
func kernelPath(b *testing.B, serve func(net.Conn)) func() (net.Conn, error) {
	requireRoot(b)
	if _, err := exec.LookPath("iptables"); err != nil {
		b.Fatal("the kernel path needs iptables (apt-get install iptables)")
	}
	ns, name := newNetNS(b)
	var ln net.Listener
	err := inNS(ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		// A client address (else the kernel picks 0.0.0.0 as the source
		// and the replies go nowhere), and a route for the service CIDR so
		// that the connection gets as far as the nat OUTPUT hook.
		if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: prefixNet(tunClient4)}); err != nil {
			return err
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("10.96.0.0/12"))}); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	})
	if err != nil {
		b.Fatalf("namespace %s: %v", name, err)
	}
	be := serveTCP(b, ln, serve)
	rule := []string{"netns", "exec", name, "iptables", "-t", "nat", "-A", "OUTPUT", "-d", "10.96.0.100/32", "-p", "tcp", "--dport", "80",
		"-j", "DNAT", "--to-destination", be.addr.String()}
	if out, err := exec.Command("ip", rule...).CombinedOutput(); err != nil {
		b.Fatalf("ip %v: %v: %s", rule, err, out)
	}
	c := &nsClient{ns: ns, work: make(chan func())}
	startWorkers(b, c)
	return func() (net.Conn, error) { return c.dial("tcp", "10.96.0.100:80") }
}

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// The topology, all in namespaces made here and removed at the end:
//
//	K (kernel + direct client) 192.0.2.1/25 --veth-- 192.0.2.126/25 \
//	U (userproxy client)     192.0.2.129/25 --veth-- 192.0.2.254/25 -- B: endpoints 198.51.100.1-10 on lo
//	P (the peers' host side)  203.0.113.1/26 --veth-- 203.0.113.62/26 /
//	PC (pasta's client): pasta's tap, pasta runs in P
//	TC (tun2socks' client): a TUN whose file descriptor tun2socks, in P, holds
//	KP, UP, PCP, TCP (pod-like clients): each behind K, U, PC or TC over a
//	  veth of MTU 1500, 198.18.N.2/24 via 198.18.N.1; the parent forwards
//	  their packets into its path (kernel rules, userproxy's TUN, pasta's
//	  tap, tun2socks' TUN) as a node forwards its pods' packets
//
// K routes the service CIDR and the endpoints to B; its iptables nat table
// holds what `userproxy rules` prints. U routes the endpoints to B, and
// userproxy routes the service CIDR into its TUN. P is K again for the
// userspace peers, which translate their client's packets into sockets of
// P: the same routes and the same kernel rules (a peer has no service table
// of its own; on a node it would sit beside kube-proxy), so a peer's client
// dials the same ClusterIPs and reaches the same endpoints. PC and TC route
// everything into their peer's device; nothing routes out of B.
const (
	serviceCIDR = "10.96.0.0/12"
	endpointNet = "198.51.100.0/24"
	kAddr, kGW  = "192.0.2.1/25", "192.0.2.126/25"
	uAddr, uGW  = "192.0.2.129/25", "192.0.2.254/25"
	pAddr, pGW  = "203.0.113.1/26", "203.0.113.62/26"
	tunName     = "upbench0"
	pVeth       = "pc0"      // P's veth, the interface pasta copies into PC
	t2sTUN      = "t2sbench" // tun2socks' TUN in TC
	t2sAddr     = "203.0.113.65/32"
	// peerMTU is the MTU of the peers' devices: userproxy's TUN default
	// (and pasta's), so that every userspace row moves packets of one size.
	peerMTU = 65520
)

type topology struct {
	b, k, u   string // namespace names
	p, pc, tc string
	pods      map[string]string // parent namespace -> its pod-like client's namespace
}

// podParents are the namespaces with a pod-like client, with the N of its
// 198.18.N.0/24.
func (t *topology) podParents() []struct {
	ns string
	n  int
} {
	return []struct {
		ns string
		n  int
	}{{t.k, 1}, {t.u, 2}, {t.pc, 3}, {t.tc, 4}}
}

// podMTU is the pod-like clients' veth MTU: a pod's usual, MSS 1460.
const podMTU = 1500

// ipCmd runs `ip args...` and returns its error with the output.
func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inNS runs a command inside namespace ns and returns its output.
func inNS(ns string, timeout time.Duration, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return out, fmt.Errorf("%s %s in %s: %w: %s", name, strings.Join(args, " "), ns, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return out, fmt.Errorf("%s in %s: %w", name, ns, err)
	}
	return out, nil
}

func newTopology() (*topology, error) {
	p := fmt.Sprintf("upbench-%d-", os.Getpid())
	t := &topology{b: p + "b", k: p + "k", u: p + "u", p: p + "p", pc: p + "pc", tc: p + "tc", pods: map[string]string{}}
	for _, pp := range t.podParents() {
		t.pods[pp.ns] = pp.ns + "-pod"
	}
	var steps [][]string
	for _, ns := range t.all() {
		steps = append(steps, []string{"netns", "add", ns}, []string{"-n", ns, "link", "set", "lo", "up"})
	}
	steps = append(steps, [][]string{
		{"-n", t.k, "link", "add", "kc0", "type", "veth", "peer", "name", "kb0", "netns", t.b},
		{"-n", t.u, "link", "add", "uc0", "type", "veth", "peer", "name", "ub0", "netns", t.b},
		{"-n", t.k, "addr", "add", kAddr, "dev", "kc0"}, {"-n", t.b, "addr", "add", kGW, "dev", "kb0"},
		{"-n", t.u, "addr", "add", uAddr, "dev", "uc0"}, {"-n", t.b, "addr", "add", uGW, "dev", "ub0"},
		{"-n", t.k, "link", "set", "kc0", "up"}, {"-n", t.b, "link", "set", "kb0", "up"},
		{"-n", t.u, "link", "set", "uc0", "up"}, {"-n", t.b, "link", "set", "ub0", "up"},
		{"-n", t.k, "route", "add", endpointNet, "via", strings.Split(kGW, "/")[0]},
		{"-n", t.k, "route", "add", serviceCIDR, "via", strings.Split(kGW, "/")[0]},
		{"-n", t.u, "route", "add", endpointNet, "via", strings.Split(uGW, "/")[0]},
		{"-n", t.p, "link", "add", pVeth, "type", "veth", "peer", "name", "pb0", "netns", t.b},
		{"-n", t.p, "addr", "add", pAddr, "dev", pVeth}, {"-n", t.b, "addr", "add", pGW, "dev", "pb0"},
		{"-n", t.p, "link", "set", pVeth, "up"}, {"-n", t.b, "link", "set", "pb0", "up"},
		{"-n", t.p, "route", "add", endpointNet, "via", strings.Split(pGW, "/")[0]},
		{"-n", t.p, "route", "add", serviceCIDR, "via", strings.Split(pGW, "/")[0]},
		// tun2socks' TUN, persistent until TC goes; tun2socks attaches to it.
		{"-n", t.tc, "tuntap", "add", "dev", t2sTUN, "mode", "tun"},
		{"-n", t.tc, "link", "set", t2sTUN, "mtu", fmt.Sprint(peerMTU), "up"},
		{"-n", t.tc, "addr", "add", t2sAddr, "dev", t2sTUN},
		{"-n", t.tc, "route", "add", "default", "dev", t2sTUN},
	}...)
	for i := range endpoints {
		steps = append(steps, []string{"-n", t.b, "addr", "add", endpointAddr(i) + "/32", "dev", "lo"})
	}
	for _, pp := range t.podParents() {
		pod, gw, addr := t.pods[pp.ns], fmt.Sprintf("198.18.%d.1", pp.n), fmt.Sprintf("198.18.%d.2", pp.n)
		steps = append(steps,
			[]string{"-n", pp.ns, "link", "add", "pp0", "mtu", fmt.Sprint(podMTU), "type", "veth", "peer", "name", "pe0", "netns", pod},
			[]string{"-n", pp.ns, "addr", "add", gw + "/24", "dev", "pp0"}, []string{"-n", pod, "addr", "add", addr + "/24", "dev", "pe0"},
			[]string{"-n", pp.ns, "link", "set", "pp0", "up"}, []string{"-n", pod, "link", "set", "pe0", "mtu", fmt.Sprint(podMTU), "up"},
			[]string{"-n", pod, "route", "add", "default", "via", gw})
	}
	// The kernel path does not rewrite the pod's address: the endpoints
	// answer it through K, as a node's pods are answered.
	steps = append(steps, []string{"-n", t.b, "route", "add", "198.18.1.0/24", "via", strings.Split(kAddr, "/")[0]})
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			t.remove()
			return nil, err
		}
	}
	// Many short connections in a few seconds: the whole port range, and
	// TIME_WAIT reuse for outgoing connections (both are per namespace).
	for _, ns := range t.all() {
		if _, err := inNS(ns, 10*time.Second, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000", "net.ipv4.tcp_tw_reuse=1"); err != nil {
			t.remove()
			return nil, err
		}
	}
	for _, pp := range t.podParents() {
		if _, err := inNS(pp.ns, 10*time.Second, "sysctl", "-qw", "net.ipv4.ip_forward=1"); err != nil {
			t.remove()
			return nil, err
		}
	}
	return t, nil
}

// all lists the namespaces, the pod-like clients first, B last.
func (t *topology) all() []string {
	var all []string
	for _, pp := range t.podParents() {
		all = append(all, t.pods[pp.ns])
	}
	return append(all, t.k, t.u, t.p, t.pc, t.tc, t.b)
}

// remove deletes the namespaces (their veths and TUNs go with them).
func (t *topology) remove() {
	for _, ns := range t.all() {
		_ = ipCmd("netns", "del", ns)
	}
}

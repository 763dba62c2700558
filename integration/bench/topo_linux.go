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
//	                                                                  B: endpoints 198.51.100.1-10 on lo
//	U (userproxy client)     192.0.2.129/25 --veth-- 192.0.2.254/25 /
//
// K routes the service CIDR and the endpoints to B; its iptables nat table
// holds what `userproxy rules` prints. U routes the endpoints to B, and
// userproxy routes the service CIDR into its TUN. Nothing routes out.
const (
	serviceCIDR = "10.96.0.0/12"
	endpointNet = "198.51.100.0/24"
	kAddr, kGW  = "192.0.2.1/25", "192.0.2.126/25"
	uAddr, uGW  = "192.0.2.129/25", "192.0.2.254/25"
	tunName     = "upbench0"
)

type topology struct {
	b, k, u string // namespace names
}

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
	t := &topology{b: p + "b", k: p + "k", u: p + "u"}
	steps := [][]string{
		{"netns", "add", t.b}, {"netns", "add", t.k}, {"netns", "add", t.u},
		{"-n", t.b, "link", "set", "lo", "up"}, {"-n", t.k, "link", "set", "lo", "up"}, {"-n", t.u, "link", "set", "lo", "up"},
		{"-n", t.k, "link", "add", "kc0", "type", "veth", "peer", "name", "kb0", "netns", t.b},
		{"-n", t.u, "link", "add", "uc0", "type", "veth", "peer", "name", "ub0", "netns", t.b},
		{"-n", t.k, "addr", "add", kAddr, "dev", "kc0"}, {"-n", t.b, "addr", "add", kGW, "dev", "kb0"},
		{"-n", t.u, "addr", "add", uAddr, "dev", "uc0"}, {"-n", t.b, "addr", "add", uGW, "dev", "ub0"},
		{"-n", t.k, "link", "set", "kc0", "up"}, {"-n", t.b, "link", "set", "kb0", "up"},
		{"-n", t.u, "link", "set", "uc0", "up"}, {"-n", t.b, "link", "set", "ub0", "up"},
		{"-n", t.k, "route", "add", endpointNet, "via", strings.Split(kGW, "/")[0]},
		{"-n", t.k, "route", "add", serviceCIDR, "via", strings.Split(kGW, "/")[0]},
		{"-n", t.u, "route", "add", endpointNet, "via", strings.Split(uGW, "/")[0]},
	}
	for i := range endpoints {
		steps = append(steps, []string{"-n", t.b, "addr", "add", endpointAddr(i) + "/32", "dev", "lo"})
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			t.remove()
			return nil, err
		}
	}
	// Many short connections in a few seconds: the whole port range, and
	// TIME_WAIT reuse for outgoing connections (both are per namespace).
	for _, ns := range []string{t.b, t.k, t.u} {
		if _, err := inNS(ns, 10*time.Second, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000", "net.ipv4.tcp_tw_reuse=1"); err != nil {
			t.remove()
			return nil, err
		}
	}
	return t, nil
}

// remove deletes the namespaces (their veths go with them).
func (t *topology) remove() {
	for _, ns := range []string{t.k, t.u, t.b} {
		_ = ipCmd("netns", "del", ns)
	}
}

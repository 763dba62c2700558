package main

// The host's side of conflicts.go and of `userproxy cleanup`, on Linux:
// kube-proxy's iptables chains (through iptables-save and iptables-restore,
// legacy and nft backends alike), its nftables tables (nft), its IPVS
// dummy device kube-ipvs0 and the ClusterIPs on it, and the route the
// kernel picks for each service CIDR.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// linuxProbe looks at the host with the tools it has; one it lacks finds
// nothing.
type linuxProbe struct{}

// iptablesSaves are the iptables-save commands tried, each a backend and
// family: kube-proxy's rules may sit in the legacy tables or in nftables'
// compatibility tables, whichever its image used.
var iptablesSaves = []string{"iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save", "iptables-save", "ip6tables-save"}

// toolTimeout bounds one run of an external tool.
const toolTimeout = 10 * time.Second

func runTool(name string, args ...string) ([]byte, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), toolTimeout)
	defer cancel()
	return exec.CommandContext(ctx, path, args...).Output()
}

func (linuxProbe) kubeProxyRules() string {
	var found []string
	for _, save := range iptablesSaves {
		out, err := runTool(save, "-t", "nat")
		if err != nil {
			continue
		}
		if hooks := kubeProxyHooks(out); len(hooks) > 0 && !slices.Contains(found, save) {
			found = append(found, save)
		}
	}
	for _, fam := range []string{"ip", "ip6"} {
		if _, err := runTool("nft", "list", "table", fam, "kube-proxy"); err == nil {
			found = append(found, "nft table "+fam+" kube-proxy")
		}
	}
	if len(found) == 0 {
		return ""
	}
	return fmt.Sprintf("kube-proxy's rules are still on this host (%s): they catch ClusterIP traffic before the route into the TUN; remove them with `userproxy cleanup` (or the old kube-proxy image's `kube-proxy --cleanup`)", strings.Join(found, ", "))
}

func (linuxProbe) localClusterIPs(cidrs []netip.Prefix) string {
	var found []string
	ifaces, err := net.Interfaces()
	if err != nil {
		return ""
	}
	for _, ifc := range ifaces {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok {
				continue
			}
			ip = ip.Unmap()
			if slices.ContainsFunc(cidrs, func(p netip.Prefix) bool { return p.Contains(ip) }) {
				found = append(found, ip.String()+" on "+ifc.Name)
			}
		}
	}
	if len(found) == 0 {
		return ""
	}
	shown := found[:min(len(found), maxServicesNamedInNote)]
	return fmt.Sprintf("%d addresses in the service CIDRs are local addresses of this host (%s): the kernel delivers them to itself before the route into the TUN (kube-proxy's IPVS mode leaves its ClusterIPs on kube-ipvs0); remove them with `userproxy cleanup` (ip link del kube-ipvs0)", len(found), strings.Join(shown, ", "))
}

func (linuxProbe) serviceCIDRRoute(cidrs []netip.Prefix, tun string) string {
	link, err := netlink.LinkByName(tun)
	if err != nil {
		return ""
	}
	var wrong []string
	for _, p := range cidrs {
		// An address well inside the CIDR: its route is the CIDR's.
		probe := p.Addr().Next()
		routes, err := netlink.RouteGet(probe.AsSlice())
		if err != nil || len(routes) == 0 {
			continue
		}
		if r := routes[0]; r.LinkIndex != link.Attrs().Index {
			dev := fmt.Sprint(r.LinkIndex)
			if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil {
				dev = l.Attrs().Name
			}
			wrong = append(wrong, fmt.Sprintf("%s goes to %s", probe, dev))
		}
	}
	if len(wrong) == 0 {
		return ""
	}
	return fmt.Sprintf("the kernel routes service addresses elsewhere than the TUN %s (%s): a more specific route or a policy rule takes them; remove it (ip route show table all; ip rule)", tun, strings.Join(wrong, ", "))
}

func newHostProbe() hostProbe { return linuxProbe{} }

// cleanupKubeProxy removes kube-proxy's leftovers as its --cleanup does
// (cmd/kube-proxy/app/server_linux.go platformCleanup): every KUBE-* chain
// and the rules of the built-in chains that jump to one, in every table of
// every iptables backend and family; the nftables tables ip and ip6
// kube-proxy; the IPVS dummy device kube-ipvs0 (with the ClusterIPs on it);
// and, with ipvsadm on the host, the IPVS virtual servers (kube-proxy
// clears them all, as does this). It reports what it removed.
func cleanupKubeProxy() ([]string, error) {
	var done []string
	var errs []error
	for _, save := range iptablesSaves {
		out, err := runTool(save)
		if err != nil {
			continue
		}
		restore := strings.Replace(save, "-save", "-restore", 1)
		script, n := kubeChainsRemoval(out)
		if n == 0 {
			continue
		}
		path, err := exec.LookPath(restore)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s found kube-proxy's chains but %s is missing: %w", save, restore, err))
			continue
		}
		cmd := exec.Command(path, "--noflush")
		cmd.Stdin = strings.NewReader(script)
		if o, err := cmd.CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("%s --noflush: %w: %s", restore, err, strings.TrimSpace(string(o))))
			continue
		}
		done = append(done, fmt.Sprintf("%s: %d KUBE-* chains", restore, n))
	}
	for _, fam := range []string{"ip", "ip6"} {
		if _, err := runTool("nft", "list", "table", fam, "kube-proxy"); err != nil {
			continue
		}
		if _, err := runTool("nft", "delete", "table", fam, "kube-proxy"); err != nil {
			errs = append(errs, fmt.Errorf("nft delete table %s kube-proxy: %w", fam, err))
			continue
		}
		done = append(done, "nft table "+fam+" kube-proxy")
	}
	if l, err := netlink.LinkByName("kube-ipvs0"); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting kube-ipvs0: %w", err))
		} else {
			done = append(done, "the device kube-ipvs0")
		}
	}
	if out, err := runTool("ipvsadm", "-Sn"); err == nil && len(bytes.TrimSpace(out)) > 0 {
		if _, err := runTool("ipvsadm", "-C"); err != nil {
			errs = append(errs, fmt.Errorf("ipvsadm -C: %w", err))
		} else {
			done = append(done, "the IPVS virtual servers")
		}
	}
	return done, errors.Join(errs...)
}

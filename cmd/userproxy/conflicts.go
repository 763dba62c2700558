package main

// Conflicts: what keeps Service traffic from userproxy's TUN while the
// proxy itself looks fine. Each was seen to fail every connection with
// /healthz ok and nothing logged: kube-proxy's chains still hooked into nat
// PREROUTING/OUTPUT (they DNAT ClusterIP traffic before routing), ClusterIPs
// present as local addresses (kube-proxy's IPVS mode puts them on
// kube-ipvs0: the kernel delivers them locally), a route for a service CIDR
// that leads elsewhere than the TUN, and a Service whose ClusterIP lies
// outside every --service-cidr (k3s' 10.43.0.0/16 against the default). The
// host is looked at at start and every conflictInterval, the ClusterIPs on
// every table. Each cause found is logged once with what to do, counted in
// userproxy_host_conflicts{cause}, listed on /healthz as a note, and makes
// /readyz fail naming it.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/service"
)

// The causes, userproxy_host_conflicts' label values.
const (
	causeKubeProxyRules    = "kube_proxy_rules"
	causeLocalClusterIPs   = "local_cluster_ips"
	causeServiceCIDRRoute  = "service_cidr_route"
	causeClusterIPOutside  = "cluster_ip_outside_service_cidrs"
	conflictInterval       = 10 * time.Second
	maxServicesNamedInNote = 5
)

// conflictCauses are every cause, for the gauge's series.
var conflictCauses = []string{causeKubeProxyRules, causeLocalClusterIPs, causeServiceCIDRRoute, causeClusterIPOutside}

// hostProbe looks at the host for the first three causes (conflicts_linux.go);
// each returns what it found, "" for nothing.
type hostProbe interface {
	kubeProxyRules() string
	localClusterIPs(cidrs []netip.Prefix) string
	serviceCIDRRoute(cidrs []netip.Prefix, tun string) string
}

// conflicts holds the causes found; safe for concurrent use.
type conflicts struct {
	cidrs  atomic.Pointer[[]netip.Prefix] // routed into the TUN
	tun    string
	probe  hostProbe
	logger *zap.Logger

	mu     sync.Mutex
	causes map[string]string // cause -> the message: what was found and what to do

	tableMu sync.Mutex // one syncTable at a time: the last CIDRs win
}

func newConflicts(cidrs []netip.Prefix, tun string, probe hostProbe, logger *zap.Logger) *conflicts {
	c := &conflicts{tun: tun, probe: probe, logger: logger, causes: map[string]string{}}
	c.cidrs.Store(&cidrs)
	return c
}

// serviceCIDRs are the CIDRs routed into the TUN.
func (c *conflicts) serviceCIDRs() []netip.Prefix { return *c.cidrs.Load() }

// setServiceCIDRs replaces them (the cluster's changed); the caller then
// syncs the table and checks the host again.
func (c *conflicts) setServiceCIDRs(cidrs []netip.Prefix) { c.cidrs.Store(&cidrs) }

// set records cause with msg ("" clears it), logging a new or changed one
// and the end of one.
func (c *conflicts) set(cause, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.causes[cause]
	switch {
	case msg == old:
	case msg == "":
		delete(c.causes, cause)
		c.logger.Info("conflict resolved", zap.String("cause", cause))
	default:
		c.causes[cause] = msg
		c.logger.Error("Service traffic does not reach the proxy", zap.String("cause", cause), zap.String("problem", msg))
	}
}

// checkHost looks at the host once.
func (c *conflicts) checkHost() {
	if c.probe == nil {
		return
	}
	c.set(causeKubeProxyRules, c.probe.kubeProxyRules())
	cidrs := c.serviceCIDRs()
	c.set(causeLocalClusterIPs, c.probe.localClusterIPs(cidrs))
	c.set(causeServiceCIDRRoute, c.probe.serviceCIDRRoute(cidrs, c.tun))
}

// run looks at the host every conflictInterval until ctx ends.
func (c *conflicts) run(ctx context.Context) { every(ctx, conflictInterval, c.checkHost) }

// syncTable finds the Services of t whose ClusterIP no --service-cidr
// routes into the TUN.
func (c *conflicts) syncTable(t *service.Table) {
	c.tableMu.Lock()
	defer c.tableMu.Unlock()
	cidrs := c.serviceCIDRs()
	var names []string
	var ips []netip.Addr
	for _, p := range t.Ports() {
		ip := p.ClusterIP
		if !ip.IsValid() || slices.ContainsFunc(cidrs, func(pf netip.Prefix) bool { return pf.Contains(ip) }) {
			continue
		}
		name := p.Name.Namespace + "/" + p.Name.Name
		if !slices.Contains(names, name) {
			names = append(names, name)
			ips = append(ips, ip)
		}
	}
	if len(names) == 0 {
		c.set(causeClusterIPOutside, "")
		return
	}
	shown := names[:min(len(names), maxServicesNamedInNote)]
	more := ""
	if len(names) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(names)-len(shown))
	}
	c.set(causeClusterIPOutside, fmt.Sprintf("%d Services have a ClusterIP outside every --service-cidr (%s), so their traffic is not routed into the TUN: %s (%s)%s; add the cluster's service CIDR with --service-cidr",
		len(names), prefixesString(cidrs), strings.Join(shown, ", "), ips[0], more))
}

// err is /readyz's check: the causes found, or nil.
func (c *conflicts) err() error {
	notes := c.notes()
	if len(notes) == 0 {
		return nil
	}
	return errors.New(strings.Join(notes, "; "))
}

// notes lists the causes found, sorted.
func (c *conflicts) notes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for cause, msg := range c.causes {
		out = append(out, cause+": "+msg)
	}
	slices.Sort(out)
	return out
}

// found reports whether cause is present (the gauge).
func (c *conflicts) found(cause string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.causes[cause]
	return ok
}

func prefixesString(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// kubeProxyHooks returns the rules of the nat table's PREROUTING and OUTPUT
// chains that jump to kube-proxy's KUBE-SERVICES, in iptables-save's form.
func kubeProxyHooks(save []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	table := ""
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "*") {
			table = l[1:]
			continue
		}
		if table == "nat" && (strings.HasPrefix(l, "-A PREROUTING ") || strings.HasPrefix(l, "-A OUTPUT ")) && strings.Contains(l, "-j KUBE-SERVICES") {
			out = append(out, l)
		}
	}
	return out
}

// kubeChainsRemoval turns iptables-save output into an iptables-restore
// --noflush script that deletes the built-in chains' jumps to KUBE-*
// chains, then flushes and deletes those chains, table by table; n is how
// many KUBE-* chains it removes.
func kubeChainsRemoval(save []byte) (script string, n int) {
	var b strings.Builder
	type table struct {
		name   string
		jumps  []string
		chains []string
	}
	var tables []*table
	var cur *table
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case strings.HasPrefix(l, "*"):
			cur = &table{name: l[1:]}
			tables = append(tables, cur)
		case cur == nil:
		case strings.HasPrefix(l, ":KUBE-"):
			cur.chains = append(cur.chains, strings.Fields(l[1:])[0])
		case strings.HasPrefix(l, "-A "):
			f := strings.Fields(l)
			if len(f) > 1 && !strings.HasPrefix(f[1], "KUBE-") && strings.Contains(l, " -j KUBE-") {
				cur.jumps = append(cur.jumps, "-D"+l[2:])
			}
		}
	}
	for _, t := range tables {
		if len(t.chains) == 0 && len(t.jumps) == 0 {
			continue
		}
		fmt.Fprintf(&b, "*%s\n", t.name)
		for _, j := range t.jumps {
			b.WriteString(j + "\n")
		}
		for _, c := range t.chains {
			fmt.Fprintf(&b, "-F %s\n", c)
		}
		for _, c := range t.chains {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
		n += len(t.chains)
	}
	return b.String(), n
}

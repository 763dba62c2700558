package main

// Cluster DNS in run:
//
//  1. flags: on by default at the 10th address of the first service CIDR
//     (kubeadm's 10.96.0.10), which must lie in a service CIDR so that the
//     kernel routes it into the TUN;
//  2. a clusterdns.Responder over the proxy's table, registered with the
//     proxy as the local server at dnsIP:53;
//  3. after each table, a log line when a Service takes the address over
//     (the responder steps aside) or leaves it;
//  4. the host's resolver: systemd-resolved gets the address and the
//     routing domain ~<cluster-domain> for the TUN (hostdns_linux.go),
//     undone on exit; without it, the lines to add are logged.

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// The responder serves the proxy's local flows (clusterdns may not import
// proxy, so the assertion lives here).
var _ proxy.LocalHandler = (*clusterdns.Responder)(nil)

// dnsFlags are run's cluster DNS flags.
type dnsFlags struct {
	enabled    bool
	ip         string
	domain     string
	upstream   string
	hostConfig bool
	// addr is the validated DNS address (--dns-ip or its default).
	addr netip.Addr
}

func (d *dnsFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&d.enabled, "dns", true, "answer cluster DNS (*.svc.<cluster-domain>) at --dns-ip:53 from the service table")
	fs.StringVar(&d.ip, "dns-ip", "", "address of the cluster DNS server (default: the 10th address of the first --service-cidr, e.g. 10.96.0.10); must be in a service CIDR")
	fs.StringVar(&d.domain, "cluster-domain", clusterdns.DefaultDomain, "the cluster domain DNS answers for")
	fs.StringVar(&d.upstream, "dns-upstream", "", "ip:port to forward names outside the cluster domain to (default: none, they are REFUSED)")
	fs.BoolVar(&d.hostConfig, "dns-host-config", true, "register the DNS address and ~<cluster-domain> with systemd-resolved for the TUN (Linux; undone on exit); false, or without resolved: log the lines to add")
}

// validate checks the flags against the service CIDRs and sets addr (step 1).
func (d *dnsFlags) validate(cidrs []netip.Prefix) error {
	if !d.enabled {
		return nil
	}
	if d.ip == "" {
		if len(cidrs) == 0 {
			return errors.New("--dns-ip: no service CIDR to take the default from")
		}
		a, ok := nthAddr(cidrs[0], 10)
		if !ok {
			return fmt.Errorf("--dns-ip: service CIDR %s has no 10th address; set --dns-ip", cidrs[0])
		}
		d.addr = a
	} else {
		a, err := netip.ParseAddr(d.ip)
		if err != nil || a.Zone() != "" || a.Is4In6() {
			return fmt.Errorf("--dns-ip %q: not an IP address", d.ip)
		}
		d.addr = a
	}
	if !inAny(cidrs, d.addr) {
		return fmt.Errorf("--dns-ip %s is in no --service-cidr: the kernel would not route it into the TUN", d.addr)
	}
	domain := strings.TrimSuffix(d.domain, ".")
	if _, ok := dns.IsDomainName(domain); !ok || domain == "" || strings.ContainsAny(domain, "\\ ") {
		return fmt.Errorf("--cluster-domain %q: not a domain name", d.domain)
	}
	d.domain = strings.ToLower(domain)
	if d.upstream != "" {
		up, err := netip.ParseAddrPort(d.upstream)
		if err != nil {
			return fmt.Errorf("--dns-upstream %q: want ip:port: %w", d.upstream, err)
		}
		if inAny(cidrs, up.Addr()) {
			// It would be routed into the TUN, back to us.
			return fmt.Errorf("--dns-upstream %s is in a service CIDR", up)
		}
	}
	return nil
}

// nthAddr returns the n-th address after a prefix's first one (10.96.0.0/12,
// 10 -> 10.96.0.10), if the prefix holds it.
func nthAddr(p netip.Prefix, n int) (netip.Addr, bool) {
	a := p.Masked().Addr()
	for range n {
		a = a.Next()
	}
	return a, a.IsValid() && p.Contains(a)
}

func inAny(cidrs []netip.Prefix, a netip.Addr) bool {
	for _, p := range cidrs {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// field describes cluster DNS for the start-up log line.
func (d *dnsFlags) field() zap.Field {
	if !d.enabled {
		return zap.String("dns", "off")
	}
	s := netip.AddrPortFrom(d.addr, 53).String() + " for " + d.domain
	if d.upstream != "" {
		s += ", upstream " + d.upstream
	}
	return zap.String("dns", s)
}

// newResponder builds the responder and registers it with the proxy
// (step 2); nil with --dns=false.
func newResponder(f *runFlags, px *proxy.Proxy, logger *zap.Logger) (*clusterdns.Responder, error) {
	if !f.dns.enabled {
		return nil, nil
	}
	r, err := clusterdns.New(clusterdns.Config{
		Domain:       f.dns.domain,
		Table:        px.Table,
		Addrs:        []netip.Addr{f.dns.addr},
		ServiceCIDRs: f.serviceCIDRs.values,
		Upstream:     f.dns.upstream,
		Logger:       logger.Named("dns"),
	})
	if err != nil {
		return nil, err
	}
	px.SetLocal(netip.AddrPortFrom(f.dns.addr, 53), r)
	return r, nil
}

// stepAsideLogger returns the OnSync hook of step 3: it logs when the
// Service owning the DNS address changes (OnSync calls are serialized).
func stepAsideLogger(f *runFlags, logger *zap.Logger) func(*service.Table) {
	if !f.dns.enabled {
		return func(*service.Table) {}
	}
	addr := netip.AddrPortFrom(f.dns.addr, 53)
	logger = logger.Named("dns")
	first, owner := true, ""
	return func(t *service.Table) {
		now := ""
		if n, ok := clusterdns.SteppedAside(t, f.dns.addr); ok {
			now = n.String()
		}
		if now == owner && !first {
			return
		}
		switch {
		case now != "":
			logger.Info("dns: stepped aside for "+now+": its Service owns the DNS address, queries go to its endpoints",
				zap.Stringer("addr", addr), zap.String("service", now))
		case !first:
			logger.Info("dns: answering again: no Service owns the DNS address any more", zap.Stringer("addr", addr), zap.String("previous", owner))
		}
		first, owner = false, now
	}
}

// hostDNS is what the host's resolver is told (step 4).
type hostDNS struct {
	tun     string
	ip      netip.Addr
	domain  string
	enabled bool // --dns-host-config
}

// manualLines are the lines to add by hand where run cannot configure the
// host's resolver, per resolver.
func (h hostDNS) manualLines(goos string) []string {
	if goos == "darwin" {
		return []string{
			"/etc/resolver/" + h.domain + ": nameserver " + h.ip.String(),
		}
	}
	return []string{
		"systemd-resolved: resolvectl dns " + h.tun + " " + h.ip.String() + " && resolvectl domain " + h.tun + " ~" + h.domain,
		"dnsmasq or NetworkManager's dnsmasq: server=/" + h.domain + "/" + h.ip.String(),
		"/etc/resolv.conf (first, so every name goes to it; set --dns-upstream or keep your other nameserver lines after it): nameserver " +
			h.ip.String() + " | search svc." + h.domain + " " + h.domain,
	}
}

package main

// The mapping of kube-proxy's KubeProxyConfiguration (decoded, defaulted
// and validated by internal/kpconfig) onto run's options.

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/userproxy/userproxy/cmd/userproxy/internal/kpconfig"
)

// The proxy modes, as /proxyMode answers them.
const (
	modeIPTables = kpconfig.ModeIPTables
	modeIPVS     = kpconfig.ModeIPVS
	modeNFTables = kpconfig.ModeNFTables
)

// applyKubeProxyConfig sets run's options from c (defaulted and validated), field by
// field; what kube-proxy does with a field and userproxy does differently
// is said beside it.
func applyKubeProxyConfig(c *kpv1alpha1.KubeProxyConfiguration, f *runFlags) error {
	// mode: iptables' lottery, IPVS' scheduler (rr by default, as
	// ipvs/proxier.go), nftables' lottery with its NodePort addresses.
	f.proxyMode = string(c.Mode)
	f.scheduler = "random"
	if c.Mode == modeIPVS {
		f.scheduler = c.IPVS.Scheduler
		if f.scheduler == "" {
			f.scheduler = "rr"
		}
	}
	_, f.minSyncPeriod = kpconfig.ActiveSyncPeriods(c)
	f.kubeconfig = c.ClientConnection.Kubeconfig
	f.clientQPS, f.clientBurst = c.ClientConnection.QPS, int(c.ClientConnection.Burst)
	f.clientContentType = c.ClientConnection.ContentType
	if c.HostnameOverride != "" {
		f.nodeName = strings.ToLower(strings.TrimSpace(c.HostnameOverride))
	}
	f.healthzAddr = c.HealthzBindAddress
	f.adminAddr = c.MetricsBindAddress
	f.profiling = c.EnableProfiling
	f.bindAddressHardFail = c.BindAddressHardFail
	if c.ClusterCIDR != "" {
		if err := f.clusterCIDRs.Set(maskedList(c.ClusterCIDR)); err != nil {
			return fmt.Errorf("KubeProxyConfiguration.clusterCIDR: %w", err)
		}
	}
	// NodePorts: kube-proxy's keywords; unset means every local address
	// in iptables and ipvs modes (localhost only with
	// iptables.localhostNodePorts, IPv4 only, as route_localnet), the
	// primary addresses in nftables mode (server_linux.go), which serves
	// none on localhost.
	np := slices.Clone(c.NodePortAddresses)
	if len(np) == 0 {
		np = []string{"all"}
		if c.Mode == modeNFTables {
			np = []string{"primary"}
		}
	}
	f.nodePortAddresses = strings.Join(np, ",")
	localhost4 := c.Mode == modeIPTables && *c.IPTables.LocalhostNodePorts
	if slices.Contains(np, "localhost") && c.Mode != modeNFTables {
		localhost4 = true
	}
	f.nodePortFilter = func(a netip.Addr) bool {
		if a.IsLoopback() {
			return a.Is4() && localhost4
		}
		return true
	}
	if c.OOMScoreAdj != nil {
		f.oomScoreAdj = c.OOMScoreAdj
	}
	// conntrack: the table's size as kube-proxy sizes nf_conntrack_max
	// (maxPerCore x CPUs, at least min; 0: userproxy's own default), and
	// its timeouts (0: the kernel's, which userproxy's defaults are).
	ct := c.Conntrack
	f.conntrackMaxPerCore, f.conntrackMin = int(*ct.MaxPerCore), int(*ct.Min)
	if d := ct.TCPEstablishedTimeout.Duration; d > 0 {
		f.ctEstablished = d
	}
	if d := ct.TCPCloseWaitTimeout.Duration; d > 0 {
		f.ctCloseWait = d
	}
	if d := ct.UDPTimeout.Duration; d > 0 {
		f.ctUDP = d
	}
	if d := ct.UDPStreamTimeout.Duration; d > 0 {
		f.ctUDPStream = d
	}
	f.ctLiberal = ct.TCPBeLiberal
	// logging: kube-proxy's formats, text (klog's) and json; its
	// verbosity as zap's level (2 and up: debug).
	f.log.format = "text"
	if c.Logging.Format == "json" {
		f.log.format = "json"
	}
	f.log.level = "info"
	if c.Logging.Verbosity >= 2 {
		f.log.level = "debug"
	}
	return nil
}

// maskedList drops host bits from a comma-separated list of CIDRs, as
// kube-proxy's parsing does.
func maskedList(s string) string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if pf, err := netip.ParsePrefix(strings.TrimSpace(p)); err == nil {
			out = append(out, pf.Masked().String())
		}
	}
	return strings.Join(out, ",")
}

package main

// kube-proxy's KubeProxyConfiguration (kubeproxy.config.k8s.io/v1alpha1),
// as `kube-proxy --config` takes it, in the order kube-proxy handles it:
//
//  1. decode strictly: an unknown or duplicated field, or another kind,
//     refuses the file naming it (kube-proxy falls back to a lenient decode
//     with a log line; a drop-in that ignores a field an admin set would
//     fail silently, so we refuse);
//  2. defaults: kube-proxy's (pkg/proxy/apis/config/v1alpha1/defaults.go,
//     SetDefaults_KubeProxyConfiguration, and cmd/kube-proxy/app/
//     server_linux.go platformApplyDefaults);
//  3. validation: kube-proxy's rules (pkg/proxy/apis/config/validation/
//     validation.go), with the field's path in each message, then the
//     fields userproxy cannot honour, refused with the reason;
//  4. the mapping onto run's options (applyTo).

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/balancer"
)

const (
	kubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyKind       = "KubeProxyConfiguration"
)

// The proxy modes kube-proxy v1.37 takes on Linux.
const (
	modeIPTables = "iptables"
	modeIPVS     = "ipvs"
	modeNFTables = "nftables"
)

// loadKubeProxyConfig reads and strictly decodes the file at path.
func loadKubeProxyConfig(path string) (*kpv1alpha1.KubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return decodeKubeProxyConfig(path, data)
}

// decodeKubeProxyConfig decodes data, the contents of the file name.
func decodeKubeProxyConfig(name string, data []byte) (*kpv1alpha1.KubeProxyConfiguration, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("--config %s: the file is empty; want a %s (%s)", name, kubeProxyKind, kubeProxyAPIVersion)
	}
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	if meta.APIVersion != kubeProxyAPIVersion || meta.Kind != kubeProxyKind {
		return nil, fmt.Errorf("--config %s: apiVersion %q kind %q: want %s %s (userproxy's own objects go to `userproxy run --config`)",
			name, meta.APIVersion, meta.Kind, kubeProxyAPIVersion, kubeProxyKind)
	}
	// YAML to JSON refuses a key given twice (naming its line); the
	// strict JSON decode names every unknown field by its path, as
	// apimachinery's strict decoding does for kube-proxy.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	var c kpv1alpha1.KubeProxyConfiguration
	strict, err := sigsjson.UnmarshalStrict(js, &c, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("--config %s: %w", name, errors.Join(strict...))
	}
	return &c, nil
}

// defaultKubeProxyConfig fills what c leaves unset with kube-proxy v1.37's
// defaults on Linux.
func defaultKubeProxyConfig(c *kpv1alpha1.KubeProxyConfiguration) {
	c.APIVersion, c.Kind = kubeProxyAPIVersion, kubeProxyKind
	if c.FeatureGates == nil {
		c.FeatureGates = map[string]bool{}
	}
	if c.BindAddress == "" {
		c.BindAddress = "0.0.0.0"
	}
	v6 := false
	if ip := net.ParseIP(c.BindAddress); ip != nil && ip.To4() == nil {
		v6 = true
	}
	// An address without a port gets the default port (defaults.go).
	c.HealthzBindAddress = withDefaultPort(c.HealthzBindAddress, v6, "0.0.0.0", "::", 10256, true)
	c.MetricsBindAddress = withDefaultPort(c.MetricsBindAddress, v6, "127.0.0.1", "::1", 10249, true)
	if c.Mode == "" {
		c.Mode = modeIPTables // platformApplyDefaults: the best available proxier on Linux
	}
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = "ClusterCIDR"
	}
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = ptrTo(int32(-999)) // qos.KubeProxyOOMScoreAdj
	}
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = ptrTo(int32(14))
	}
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = ptrTo(true)
	}
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = ptrTo(int32(14))
	}
	for _, d := range []*metav1.Duration{&c.IPTables.SyncPeriod, &c.IPVS.SyncPeriod, &c.NFTables.SyncPeriod} {
		if d.Duration == 0 {
			d.Duration = 30 * time.Second
		}
	}
	for _, d := range []*metav1.Duration{&c.IPTables.MinSyncPeriod, &c.NFTables.MinSyncPeriod} {
		if d.Duration == 0 {
			d.Duration = time.Second
		}
	}
	if c.Conntrack.MaxPerCore == nil {
		c.Conntrack.MaxPerCore = ptrTo(int32(32 * 1024))
	}
	if c.Conntrack.Min == nil {
		c.Conntrack.Min = ptrTo(int32(128 * 1024))
	}
	if c.Conntrack.TCPEstablishedTimeout == nil {
		c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: 24 * time.Hour}
	}
	if c.Conntrack.TCPCloseWaitTimeout == nil {
		c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: time.Hour}
	}
	if c.ConfigSyncPeriod.Duration == 0 {
		c.ConfigSyncPeriod.Duration = 15 * time.Minute
	}
	if c.ClientConnection.ContentType == "" {
		c.ClientConnection.ContentType = "application/vnd.kubernetes.protobuf"
	}
	if c.ClientConnection.QPS == 0 {
		c.ClientConnection.QPS = 5
	}
	if c.ClientConnection.Burst == 0 {
		c.ClientConnection.Burst = 10
	}
	if c.Logging.Format == "" {
		c.Logging.Format = "text"
	}
	if c.Logging.FlushFrequency.Duration.Duration == 0 {
		c.Logging.FlushFrequency.Duration.Duration = 5 * time.Second
		c.Logging.FlushFrequency.SerializeAsString = true
	}
}

// withDefaultPort is defaults.go's treatment of healthzBindAddress and
// metricsBindAddress: empty gets the default address (when emptyDefault),
// and an address without a port gets the default port.
func withDefaultPort(addr string, v6 bool, any4, any6 string, port int, emptyDefault bool) string {
	if addr == "" {
		if !emptyDefault {
			return addr
		}
		addr = any4
		if v6 {
			addr = any6
		}
	}
	if net.ParseIP(addr) != nil {
		return net.JoinHostPort(addr, fmt.Sprint(port))
	}
	return addr
}

func ptrTo[T any](v T) *T { return &v }

// kubeProxyGates are the feature gates kube-proxy v1.37 knows that reach
// its proxier, with their defaults (pkg/features/kube_features.go): a gate
// set to its default is accepted; one userproxy does not implement is
// refused when set otherwise, as is a gate kube-proxy does not know.
var kubeProxyGates = map[string]struct {
	def        bool
	supported  bool   // userproxy behaves the same either way
	reasonNote string // why a change is refused
}{
	"KubeProxyIPVS":                       {def: true, supported: true},
	"KubeProxyNFTablesLocalhostNodePorts": {def: false, reasonNote: "userproxy's nftables mode serves no NodePort on localhost, as kube-proxy's without the gate"},
	"AllAlpha":                            {def: false, reasonNote: "no alpha feature of kube-proxy's is implemented"},
	"AllBeta":                             {def: false, reasonNote: "turning every beta gate on or off is not supported"},
}

// validateKubeProxyConfig checks c as kube-proxy's Validate does, each
// message naming the field, then refuses what userproxy cannot honour.
func validateKubeProxyConfig(c *kpv1alpha1.KubeProxyConfiguration) error {
	var errs []error
	bad := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("KubeProxyConfiguration.%s: invalid value %v: %s", field, value, why))
	}
	unsupported := func(field string, value any, why string) {
		errs = append(errs, fmt.Errorf("KubeProxyConfiguration.%s: %v is not supported by userproxy: %s", field, value, why))
	}
	for name, on := range c.FeatureGates {
		g, ok := kubeProxyGates[name]
		switch {
		case !ok:
			bad("featureGates", name, "not a feature gate kube-proxy v1.37 knows")
		case on != g.def && !g.supported:
			unsupported("featureGates["+name+"]", on, g.reasonNote)
		case name == "KubeProxyIPVS" && !on && c.Mode == modeIPVS:
			bad("mode", c.Mode, "the KubeProxyIPVS feature gate is off")
		}
	}
	switch c.Mode {
	case modeIPTables, modeIPVS, modeNFTables:
	case "kernelspace":
		unsupported("mode", c.Mode, "it is Windows' proxier")
	default:
		bad("mode", fmt.Sprintf("%q", c.Mode), "must be iptables, ipvs or nftables, or blank (blank means the best-available proxy [currently iptables])")
	}
	sync, minSync := activeSyncPeriods(c)
	if sync <= 0 {
		bad(string(c.Mode)+".syncPeriod", sync, "must be greater than 0")
	}
	if minSync < 0 {
		bad(string(c.Mode)+".minSyncPeriod", minSync, "must be greater than or equal to 0")
	} else if minSync > sync {
		bad(string(c.Mode)+".minSyncPeriod", minSync, "must be less than or equal to "+string(c.Mode)+".syncPeriod")
	}
	if b := c.IPTables.MasqueradeBit; b != nil && (*b < 0 || *b > 31) {
		bad("iptables.masqueradeBit", *b, "must be within the range [0, 31]")
	}
	if b := c.NFTables.MasqueradeBit; c.Mode == modeNFTables && b != nil && (*b < 0 || *b > 31) {
		bad("nftables.masqueradeBit", *b, "must be within the range [0, 31]")
	}
	if c.Mode == modeIPVS {
		for _, d := range []struct {
			name string
			v    time.Duration
		}{{"ipvs.tcpTimeout", c.IPVS.TCPTimeout.Duration}, {"ipvs.tcpFinTimeout", c.IPVS.TCPFinTimeout.Duration}, {"ipvs.udpTimeout", c.IPVS.UDPTimeout.Duration}} {
			switch {
			case d.v < 0:
				bad(d.name, d.v, "must be greater than or equal to 0")
			case d.v > 0:
				unsupported(d.name, d.v, "userproxy keeps conntrack's timeouts for every mode (set conntrack.tcpEstablishedTimeout and the others)")
			}
		}
		for _, s := range c.IPVS.ExcludeCIDRs {
			if _, err := netip.ParsePrefix(s); err != nil {
				bad("ipvs.excludeCIDRs", s, "must be a valid CIDR")
			}
		}
		if c.IPVS.Scheduler != "" {
			if _, err := balancer.ParseScheduler(c.IPVS.Scheduler, ""); err != nil {
				bad("ipvs.scheduler", c.IPVS.Scheduler, err.Error())
			}
		}
	}
	if c.ConfigSyncPeriod.Duration <= 0 {
		bad("configSyncPeriod", c.ConfigSyncPeriod.Duration, "must be greater than 0")
	}
	if net.ParseIP(c.BindAddress) == nil {
		bad("bindAddress", c.BindAddress, "not a valid textual representation of an IP address")
	}
	if c.HealthzBindAddress != "" {
		if err := checkHostPort(c.HealthzBindAddress); err != nil {
			bad("healthzBindAddress", c.HealthzBindAddress, err.Error())
		}
	}
	if err := checkHostPort(c.MetricsBindAddress); err != nil {
		bad("metricsBindAddress", c.MetricsBindAddress, err.Error())
	}
	if c.ClientConnection.Burst < 0 {
		bad("clientConnection.burst", c.ClientConnection.Burst, "must be greater than or equal to 0")
	}
	if v := c.OOMScoreAdj; v != nil && (*v < -1000 || *v > 1000) {
		bad("oomScoreAdj", *v, "must be within the range [-1000, 1000]")
	}
	ct := c.Conntrack
	if ct.MaxPerCore != nil && *ct.MaxPerCore < 0 {
		bad("conntrack.maxPerCore", *ct.MaxPerCore, "must be greater than or equal to 0")
	}
	if ct.Min != nil && *ct.Min < 0 {
		bad("conntrack.min", *ct.Min, "must be greater than or equal to 0")
	}
	if d := ct.TCPEstablishedTimeout; d != nil && d.Duration < 0 {
		bad("conntrack.tcpEstablishedTimeout", d.Duration, "must be greater than or equal to 0")
	}
	if d := ct.TCPCloseWaitTimeout; d != nil && d.Duration < 0 {
		bad("conntrack.tcpCloseWaitTimeout", d.Duration, "must be greater than or equal to 0")
	}
	if ct.UDPTimeout.Duration < 0 {
		bad("conntrack.udpTimeout", ct.UDPTimeout.Duration, "must be greater than or equal to 0")
	}
	if ct.UDPStreamTimeout.Duration < 0 {
		bad("conntrack.udpStreamTimeout", ct.UDPStreamTimeout.Duration, "must be greater than or equal to 0")
	}
	switch c.DetectLocalMode {
	case "ClusterCIDR":
		if err := checkClusterCIDRs(c.ClusterCIDR); err != nil {
			bad("clusterCIDR", fmt.Sprintf("%q", c.ClusterCIDR), err.Error())
		}
	case "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix":
		unsupported("detectLocalMode", c.DetectLocalMode, "only ClusterCIDR tells local traffic for now (set clusterCIDR)")
	default:
		bad("detectLocalMode", fmt.Sprintf("%q", c.DetectLocalMode), "must be ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")
	}
	seen := map[string]bool{}
	for _, a := range c.NodePortAddresses {
		switch {
		case a == "primary" || a == "localhost" || a == "all":
			if seen[a] {
				bad("nodePortAddresses", a, "may not be repeated")
			}
			seen[a] = true
		default:
			if _, err := netip.ParsePrefix(a); err != nil {
				bad("nodePortAddresses", a, "must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all'")
			}
		}
	}
	switch lf := c.Logging.Format; lf {
	case "text", "json":
	default:
		bad("logging.format", lf, "must be text or json")
	}
	if len(c.Logging.VModule) > 0 {
		unsupported("logging.vmodule", c.Logging.VModule, "userproxy's log levels are not set per file")
	}
	if c.Logging.FlushFrequency.Duration.Duration <= 0 {
		bad("logging.flushFrequency", c.Logging.FlushFrequency.Duration.Duration, "must be greater than 0")
	}
	if c.ShowHiddenMetricsForVersion != "" {
		unsupported("showHiddenMetricsForVersion", c.ShowHiddenMetricsForVersion, "userproxy hides no deprecated metric")
	}
	if c.ClientConnection.AcceptContentTypes != "" {
		unsupported("clientConnection.acceptContentTypes", c.ClientConnection.AcceptContentTypes, "the client takes the API server's default")
	}
	if w := c.Winkernel; w != (kpv1alpha1.KubeProxyWinkernelConfiguration{}) {
		unsupported("winkernel", "a non-empty section", "it configures Windows' proxier")
	}
	if c.WindowsRunAsService {
		unsupported("windowsRunAsService", true, "it is for Windows")
	}
	return errors.Join(errs...)
}

// activeSyncPeriods are the sync periods of c's mode (kube-proxy's
// conversion.go takes them from the mode's own section).
func activeSyncPeriods(c *kpv1alpha1.KubeProxyConfiguration) (sync, minSync time.Duration) {
	switch c.Mode {
	case modeIPVS:
		return c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration
	case modeNFTables:
		return c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration
	}
	return c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration
}

// checkHostPort is kube-proxy's check of a bind address: IP:port, the port
// 1-65535.
func checkHostPort(s string) error {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return errors.New("must be IP:port")
	}
	if ap.Port() == 0 {
		return errors.New("must be a valid port number")
	}
	return nil
}

// checkClusterCIDRs is kube-proxy's check of clusterCIDR: empty, one CIDR,
// or a dual-stack pair, comma-separated.
func checkClusterCIDRs(s string) error {
	if s == "" {
		return nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return errors.New("only one CIDR allowed or a valid DualStack CIDR (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)")
	}
	var fams []bool
	for _, p := range parts {
		pf, err := netip.ParsePrefix(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("must be a valid CIDR: %s", p)
		}
		fams = append(fams, pf.Addr().Is4())
	}
	if len(fams) == 2 && fams[0] == fams[1] {
		return errors.New("must be a valid DualStack CIDR (e.g. 10.100.0.0/16,fde4:8dba:82e1::/48)")
	}
	return nil
}

// applyTo sets run's options from c (defaulted and validated), field by
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
	_, f.minSyncPeriod = activeSyncPeriods(c)
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
	// logging: kube-proxy's verbosity as zap's level (2 and up: debug).
	f.log.format = "console"
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

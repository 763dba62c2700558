package kpconfig

// In the order kube-proxy handles its configuration:
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
//  4. the mapping onto run's options: cmd/userproxy's
//     applyKubeProxyConfig.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/balancer"
)

// The group version and kind of the configuration file.
const (
	APIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	Kind       = "KubeProxyConfiguration"
)

// ModeIPTables, ModeIPVS and ModeNFTables are the proxy modes kube-proxy
// v1.37 takes on Linux.
const (
	ModeIPTables = "iptables"
	ModeIPVS     = "ipvs"
	ModeNFTables = "nftables"
)

// Load reads and strictly decodes the file at path.
func Load(path string) (*kpv1alpha1.KubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	return Decode(path, data)
}

// Decode decodes data, the contents of the file name.
func Decode(name string, data []byte) (*kpv1alpha1.KubeProxyConfiguration, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("--config %s: the file is empty; want a %s (%s)", name, Kind, APIVersion)
	}
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(data, &meta); err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	if meta.APIVersion != APIVersion || meta.Kind != Kind {
		return nil, fmt.Errorf("--config %s: apiVersion %q kind %q: want %s %s (userproxy's own objects go to `userproxy run --config`)",
			name, meta.APIVersion, meta.Kind, APIVersion, Kind)
	}
	// YAML to JSON refuses a key given twice (naming its line); the
	// strict JSON decode names every unknown field by its path, as
	// apimachinery's strict decoding does for kube-proxy.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", name, err)
	}
	if err := checkBufferSizes(js); err != nil {
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

// checkBufferSizes refuses logging.options.{text,json}.infoBufferSize
// other than 0 before the typed decode parses them: they are
// resource.Quantity values, whose parser takes seconds for "1e-9999999" and
// minutes for one more digit (FuzzKubeProxyConfig found it), so a crafted
// file would hang the start. The options are alpha in kube-proxy and
// userproxy's logger has no such buffer.
func checkBufferSizes(js []byte) error {
	var probe struct {
		Logging struct {
			Options map[string]struct {
				InfoBufferSize json.RawMessage `json:"infoBufferSize"`
			} `json:"options"`
		} `json:"logging"`
	}
	if err := json.Unmarshal(js, &probe); err != nil {
		return nil // the typed decode says what is wrong
	}
	for format, o := range probe.Logging.Options {
		switch v := strings.TrimSpace(string(o.InfoBufferSize)); v {
		case "", "0", `"0"`, "null":
		default:
			return fmt.Errorf("KubeProxyConfiguration.logging.options.%s.infoBufferSize: %s is not supported by userproxy: its logger keeps no info buffer (an alpha option of kube-proxy's)", format, v)
		}
	}
	return nil
}

// Default fills what c leaves unset with kube-proxy v1.37's
// defaults on Linux.
func Default(c *kpv1alpha1.KubeProxyConfiguration) {
	c.APIVersion, c.Kind = APIVersion, Kind
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
		c.Mode = ModeIPTables // platformApplyDefaults: the best available proxier on Linux
	}
	if c.DetectLocalMode == "" {
		c.DetectLocalMode = "ClusterCIDR"
	}
	if c.OOMScoreAdj == nil {
		c.OOMScoreAdj = Ptr(int32(-999)) // qos.KubeProxyOOMScoreAdj
	}
	if c.IPTables.MasqueradeBit == nil {
		c.IPTables.MasqueradeBit = Ptr(int32(14))
	}
	if c.IPTables.LocalhostNodePorts == nil {
		c.IPTables.LocalhostNodePorts = Ptr(true)
	}
	if c.NFTables.MasqueradeBit == nil {
		c.NFTables.MasqueradeBit = Ptr(int32(14))
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
		c.Conntrack.MaxPerCore = Ptr(int32(32 * 1024))
	}
	if c.Conntrack.Min == nil {
		c.Conntrack.Min = Ptr(int32(128 * 1024))
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

// Ptr returns a pointer to v.
func Ptr[T any](v T) *T { return &v }

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

// Validate checks c as kube-proxy's Validate does, each
// message naming the field, then refuses what userproxy cannot honour.
func Validate(c *kpv1alpha1.KubeProxyConfiguration) error {
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
		case name == "KubeProxyIPVS" && !on && c.Mode == ModeIPVS:
			bad("mode", c.Mode, "the KubeProxyIPVS feature gate is off")
		}
	}
	switch c.Mode {
	case ModeIPTables, ModeIPVS, ModeNFTables:
	case "kernelspace":
		unsupported("mode", c.Mode, "it is Windows' proxier")
	default:
		bad("mode", fmt.Sprintf("%q", c.Mode), "must be iptables, ipvs or nftables, or blank (blank means the best-available proxy [currently iptables])")
	}
	sync, minSync := ActiveSyncPeriods(c)
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
	if b := c.NFTables.MasqueradeBit; c.Mode == ModeNFTables && b != nil && (*b < 0 || *b > 31) {
		bad("nftables.masqueradeBit", *b, "must be within the range [0, 31]")
	}
	if c.Mode == ModeIPVS {
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

// ActiveSyncPeriods are the sync periods of c's mode (kube-proxy's
// conversion.go takes them from the mode's own section).
func ActiveSyncPeriods(c *kpv1alpha1.KubeProxyConfiguration) (sync, minSync time.Duration) {
	switch c.Mode {
	case ModeIPVS:
		return c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration
	case ModeNFTables:
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

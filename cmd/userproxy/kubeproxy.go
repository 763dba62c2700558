package main

// userproxy as kube-proxy. Started as `kube-proxy` (the image links
// /usr/local/bin/kube-proxy to the binary) or as `userproxy kube-proxy`, it
// takes kube-proxy v1.37's command line (cmd/kube-proxy/app/options.go
// AddFlags: the same names, meanings and defaults, pflag-style) and its
// KubeProxyConfiguration (kubeproxyconfig.go), maps both onto run's options
// and runs. In order:
//
//  1. the flags; --version and --help answer and exit 0;
//  2. the configuration: the --config file, which replaces what the flags
//     say except --hostname-override, --master and the logging flags given
//     (kube-proxy's Complete), or the flags; kube-proxy's defaults;
//  3. validation, kube-proxy's and the fields userproxy cannot honour;
//  4. --write-config-to writes the effective configuration and exits;
//  5. run, with kube-proxy's defaults where run's differ: the health server
//     on every address, NodePorts per nodePortAddresses, endpoints dialled
//     directly (a node routes to its pods).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsapi "k8s.io/component-base/logs/api/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/cmd/userproxy/internal/kpconfig"
)

// kubeProxyVersion is the kube-proxy release whose command line and
// configuration userproxy takes.
const kubeProxyVersion = "v1.37.2"

// kubeProxyOptions are kube-proxy's flags: those of the process, and those
// bound to the configuration (cfg), which a --config file replaces.
type kubeProxyOptions struct {
	configFile, writeConfigTo  string
	cleanup, initOnly          bool
	version                    bool
	master                     string
	cfg                        kpv1alpha1.KubeProxyConfiguration
	featureGates               string
	clusterCIDR                string
	nodePortAddresses          []string
	ipvsExcludeCIDRs           []string
	iptablesSync, iptablesMin  time.Duration
	ipvsSync, ipvsMin          time.Duration
	healthzPort, metricsPort   int32
	verbosity                  int
	vmodule                    string
	loggingFormat              string
	flushFrequency             time.Duration
	maxPerCore, ctMin          int32
	ctEstablished, ctCloseWait time.Duration
	oomScoreAdj, masqBit       int32
	localhostNodePorts         bool
	mode, detectLocalMode      string
	// userproxy's own, which kube-proxy has no need of.
	serviceCIDRs prefixList
	tunName      string
	dialVia      string
}

func (o *kubeProxyOptions) register(fs *pflag.FlagSet) {
	c := &o.cfg
	fs.StringVar(&o.configFile, "config", "", "The path to the configuration file (a KubeProxyConfiguration, kubeproxy.config.k8s.io/v1alpha1).")
	fs.StringVar(&o.writeConfigTo, "write-config-to", "", "If set, write the default configuration values to this file and exit.")
	fs.BoolVar(&o.cleanup, "cleanup", false, "If true cleanup iptables, nftables and ipvs rules and exit.")
	fs.BoolVar(&o.initOnly, "init-only", false, "If true, perform any initialization steps that must be done with full root privileges, and then exit.")
	fs.BoolVar(&o.version, "version", false, "Print version information and quit.")
	fs.StringVar(&o.featureGates, "feature-gates", "", "A set of key=value pairs that describe feature gates for alpha/experimental features. This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.ClientConnection.Kubeconfig, "kubeconfig", "", "Path to kubeconfig file with authorization information (the master location can be overridden by the master flag).")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server (overrides any value in kubeconfig)")
	fs.StringVar(&c.ClientConnection.ContentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "Content type of requests sent to apiserver.")
	fs.Int32Var(&c.ClientConnection.Burst, "kube-api-burst", 10, "Burst to use while talking with kubernetes apiserver")
	fs.Float32Var(&c.ClientConnection.QPS, "kube-api-qps", 5, "QPS to use while talking with kubernetes apiserver")
	fs.StringVar(&c.HostnameOverride, "hostname-override", "", "If non-empty, will be used as the name of the Node that kube-proxy is running on. If unset, the node name is assumed to be the same as the node's hostname.")
	fs.StringVar(&c.BindAddress, "bind-address", "0.0.0.0", "Overrides kube-proxy's idea of what its node's primary IP is. This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.HealthzBindAddress, "healthz-bind-address", "0.0.0.0:10256", "The IP address and port for the health check server to serve on, defaulting to \"0.0.0.0:10256\". This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.MetricsBindAddress, "metrics-bind-address", "127.0.0.1:10249", "The IP address and port for the metrics server to serve on, defaulting to \"127.0.0.1:10249\". This parameter is ignored if a config file is specified by --config.")
	fs.BoolVar(&c.BindAddressHardFail, "bind-address-hard-fail", false, "If true kube-proxy will treat failure to bind to a port as fatal and exit")
	fs.BoolVar(&c.EnableProfiling, "profiling", false, "If true enables profiling via web interface on /debug/pprof handler. This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.ShowHiddenMetricsForVersion, "show-hidden-metrics-for-version", "", "The previous version for which you want to show hidden metrics.")
	fs.StringVar(&o.mode, "proxy-mode", "", "Which proxy mode to use: on Linux this can be 'iptables' (default), 'ipvs', or 'nftables'. This parameter is ignored if a config file is specified by --config.")
	fs.Int32Var(&o.masqBit, "iptables-masquerade-bit", 14, "Used only with the iptables or nftables proxy mode (no packet is marked by userproxy): must be within [0, 31].")
	fs.BoolVar(&c.IPTables.MasqueradeAll, "masquerade-all", false, "SNAT all traffic sent via Service cluster IPs. (userproxy's flows always leave from the node's own sockets.)")
	fs.BoolVar(&o.localhostNodePorts, "iptables-localhost-nodeports", true, "If false, kube-proxy will disable the legacy behavior of allowing NodePort services to be accessed via localhost. (iptables mode, IPv4 only)")
	fs.DurationVar(&o.iptablesSync, "iptables-sync-period", 30*time.Second, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&o.iptablesMin, "iptables-min-sync-period", time.Second, "The minimum period between iptables rule resyncs (e.g. '5s', '1m', '2h22m'). A value of 0 means every Service or EndpointSlice change will result in an immediate iptables resync.")
	fs.DurationVar(&o.ipvsSync, "ipvs-sync-period", 30*time.Second, "An interval (e.g. '5s', '1m', '2h22m') indicating how frequently various re-synchronizing and cleanup operations are performed. Must be greater than 0.")
	fs.DurationVar(&o.ipvsMin, "ipvs-min-sync-period", time.Second, "The minimum period between IPVS rule resyncs (e.g. '5s', '1m', '2h22m').")
	fs.StringVar(&c.IPVS.Scheduler, "ipvs-scheduler", "", "The ipvs scheduler type when proxy mode is ipvs (rr by default; rr, wrr, lc, wlc, sed, nq, sh, dh, mh)")
	fs.StringSliceVar(&o.ipvsExcludeCIDRs, "ipvs-exclude-cidrs", nil, "A comma-separated list of CIDRs which the ipvs proxier should not touch when cleaning up IPVS rules.")
	fs.BoolVar(&c.IPVS.StrictARP, "ipvs-strict-arp", false, "Enable strict ARP by setting arp_ignore to 1 and arp_announce to 2 (no ARP is involved in userproxy)")
	fs.DurationVar(&c.IPVS.TCPTimeout.Duration, "ipvs-tcp-timeout", 0, "The timeout for idle IPVS TCP connections, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&c.IPVS.TCPFinTimeout.Duration, "ipvs-tcpfin-timeout", 0, "The timeout for IPVS TCP connections after receiving a FIN packet, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.DurationVar(&c.IPVS.UDPTimeout.Duration, "ipvs-udp-timeout", 0, "The timeout for IPVS UDP packets, 0 to leave as-is. (e.g. '5s', '1m', '2h22m').")
	fs.StringVar(&o.detectLocalMode, "detect-local-mode", "", "Mode to use to detect local traffic. This parameter is ignored if a config file is specified by --config.")
	fs.StringVar(&c.DetectLocal.BridgeInterface, "pod-bridge-interface", "", "A bridge interface name. When --detect-local-mode is set to BridgeInterface, kube-proxy will consider traffic to be local if it originates from this bridge.")
	fs.StringVar(&c.DetectLocal.InterfaceNamePrefix, "pod-interface-name-prefix", "", "An interface name prefix. When --detect-local-mode is set to InterfaceNamePrefix, kube-proxy will consider traffic to be local if it originates from any interface whose name begins with this prefix.")
	fs.StringVar(&o.clusterCIDR, "cluster-cidr", "", "The CIDR range of the pods in the cluster. (For dual-stack clusters, this can be a comma-separated dual-stack pair of CIDR ranges.). When --detect-local-mode is set to ClusterCIDR, kube-proxy will consider traffic to be local if its source IP is in this range.")
	fs.StringSliceVar(&o.nodePortAddresses, "nodeport-addresses", nil, "A list of CIDR ranges that contain valid node IPs, or alternatively, the single string 'primary'. If set, connections to NodePort services will only be accepted on node IPs in one of the indicated ranges. If unset, NodePort connections will be accepted on all local IPs.")
	fs.Int32Var(&o.oomScoreAdj, "oom-score-adj", -999, "The oom-score-adj value for kube-proxy process. Values must be within the range [-1000, 1000].")
	fs.Int32Var(&o.maxPerCore, "conntrack-max-per-core", 32*1024, "Maximum number of NAT connections to track per CPU core (0 to leave the limit as-is and ignore conntrack-min).")
	fs.Int32Var(&o.ctMin, "conntrack-min", 128*1024, "Minimum number of conntrack entries to allocate, regardless of conntrack-max-per-core (set conntrack-max-per-core=0 to leave the limit as-is).")
	fs.DurationVar(&o.ctEstablished, "conntrack-tcp-timeout-established", 24*time.Hour, "Idle timeout for established TCP connections (0 to leave as-is)")
	fs.DurationVar(&o.ctCloseWait, "conntrack-tcp-timeout-close-wait", time.Hour, "NAT timeout for TCP connections in the CLOSE_WAIT state")
	fs.BoolVar(&c.Conntrack.TCPBeLiberal, "conntrack-tcp-be-liberal", false, "Enable liberal mode for tracking TCP packets by setting nf_conntrack_tcp_be_liberal to 1")
	fs.DurationVar(&c.Conntrack.UDPTimeout.Duration, "conntrack-udp-timeout", 0, "Idle timeout for UNREPLIED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.Conntrack.UDPStreamTimeout.Duration, "conntrack-udp-timeout-stream", 0, "Idle timeout for ASSURED UDP connections (0 to leave as-is)")
	fs.DurationVar(&c.ConfigSyncPeriod.Duration, "config-sync-period", 15*time.Minute, "How often configuration from the apiserver is refreshed. Must be greater than 0.")
	fs.Int32Var(&o.healthzPort, "healthz-port", 10256, "The port to bind the health check server. Use 0 to disable.")
	fs.Int32Var(&o.metricsPort, "metrics-port", 10249, "The port to bind the metrics server. Use 0 to disable.")
	_ = fs.MarkDeprecated("healthz-port", "This flag is deprecated and will be removed in a future release. Please use --healthz-bind-address instead.")
	_ = fs.MarkDeprecated("metrics-port", "This flag is deprecated and will be removed in a future release. Please use --metrics-bind-address instead.")
	fs.StringVar(&o.loggingFormat, "logging-format", "text", "Sets the log format. Permitted formats: \"json\", \"text\".")
	fs.DurationVar(&o.flushFrequency, "log-flush-frequency", 5*time.Second, "Maximum number of seconds between log flushes")
	fs.IntVarP(&o.verbosity, "v", "v", 0, "number for the log level verbosity (2 and above: userproxy's debug level)")
	fs.StringVar(&o.vmodule, "vmodule", "", "comma-separated list of pattern=N settings for file-filtered logging (only works for text log format)")
	o.serviceCIDRs.values = nil
	fs.Var(&o.serviceCIDRs, "service-cidr", "userproxy: the service CIDRs routed into its TUN, repeatable (default 10.96.0.0/12, kubeadm's serviceSubnet)")
	fs.StringVar(&o.tunName, "tun-name", "userproxy0", "userproxy: the TUN device (created when missing)")
	fs.StringVar(&o.dialVia, "dial-via", "direct", "userproxy: how TCP flows reach endpoints (direct, apiserver, auto; see userproxy run --help)")
}

// wordSepNormalize takes "_" for "-" in flag names, as kube-proxy's
// command line does (component-base/cli/flag WordSepNormalizeFunc).
func wordSepNormalize(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

const kubeProxyUsage = `kube-proxy (userproxy): the Kubernetes network proxy, in userspace.

userproxy takes kube-proxy %s's command line and KubeProxyConfiguration, so
that kube-proxy's DaemonSet runs it with only the image changed. Services'
ClusterIPs, NodePorts, external and load-balancer IPs are served through a
TUN device, with kube-proxy's endpoint selection (iptables mode's lottery,
IPVS mode's schedulers), without netfilter rules.

Usage:
  kube-proxy [flags]
  userproxy kube-proxy [flags]

Examples:
  kube-proxy --config=/var/lib/kube-proxy/config.conf --hostname-override=$(NODE_NAME)
  kube-proxy --kubeconfig=/etc/kubernetes/proxy.conf --proxy-mode=ipvs --ipvs-scheduler=lc

Flags:
`

// runKubeProxy is kube-proxy's command.
func runKubeProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("kube-proxy", pflag.ContinueOnError)
	fs.SetNormalizeFunc(wordSepNormalize)
	fs.SetOutput(stderr)
	fs.SortFlags = true
	var o kubeProxyOptions
	o.register(fs)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stdout, kubeProxyUsage, kubeProxyVersion)
			fmt.Fprint(stdout, fs.FlagUsages())
			return nil
		}
		return usageErr(fmt.Errorf("kube-proxy: %w (kube-proxy --help lists the flags)", err))
	}
	if o.version {
		fmt.Fprintf(stdout, "Kubernetes %s (userproxy %s)\n", kubeProxyVersion, readBuildInfo().Version)
		return nil
	}
	if fs.NArg() > 0 {
		return usageErr(fmt.Errorf("\"kube-proxy\" does not take any arguments, got %q", fs.Args()))
	}
	cfg, err := o.complete(fs)
	if err != nil {
		return err
	}
	if err := kpconfig.Validate(cfg); err != nil {
		return fmt.Errorf("kube-proxy: the configuration%s:\n%w", o.configNamed(), err)
	}
	if o.writeConfigTo != "" {
		out, err := yaml.Marshal(cfg)
		if err != nil {
			return fmt.Errorf("--write-config-to: %w", err)
		}
		if err := os.WriteFile(o.writeConfigTo, out, 0o644); err != nil {
			return fmt.Errorf("--write-config-to: %w", err)
		}
		fmt.Fprintf(stderr, "kube-proxy: wrote the configuration to %s\n", o.writeConfigTo)
		return nil
	}
	if o.cleanup {
		return cleanup(stdout)
	}

	// run's defaults, then the configuration over them.
	var f runFlags
	f.register(newDefaultsFlagSet())
	f.dialViaName = o.dialVia
	f.tunName = o.tunName
	if len(o.serviceCIDRs.values) > 0 {
		f.serviceCIDRs = o.serviceCIDRs
	}
	f.master = o.master
	if err := applyKubeProxyConfig(cfg, &f); err != nil {
		return err
	}
	f.configz = func() ([]byte, error) { return json.Marshal(map[string]any{"kubeproxy.config.k8s.io": cfg}) }
	logger, err := f.validatedLogger(stderr)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	if o.initOnly {
		applyOOMScoreAdj(f.oomScoreAdj, logger)
		return nil
	}
	logKubeProxyStart(logger, cfg, &f, o.configFile)
	applyOOMScoreAdj(f.oomScoreAdj, logger)
	return runProxy(ctx, &f, logger)
}

// configNamed names the --config file in messages, if there is one.
func (o *kubeProxyOptions) configNamed() string {
	if o.configFile == "" {
		return " from the flags"
	}
	return " in " + o.configFile
}

// complete builds the configuration as kube-proxy's Complete does: the
// --config file in place of what the flags bound to it say, or the flags;
// then --hostname-override and the logging flags given, over either; then
// the defaults.
func (o *kubeProxyOptions) complete(fs *pflag.FlagSet) (*kpv1alpha1.KubeProxyConfiguration, error) {
	var cfg *kpv1alpha1.KubeProxyConfiguration
	if o.configFile != "" {
		c, err := kpconfig.Load(o.configFile)
		if err != nil {
			return nil, err
		}
		cfg = c
	} else {
		c := o.cfg
		c.Mode = kpv1alpha1.ProxyMode(o.mode)
		c.DetectLocalMode = kpv1alpha1.LocalMode(o.detectLocalMode)
		c.ClusterCIDR = o.clusterCIDR
		c.NodePortAddresses = o.nodePortAddresses
		c.IPVS.ExcludeCIDRs = o.ipvsExcludeCIDRs
		c.OOMScoreAdj = kpconfig.Ptr(o.oomScoreAdj)
		c.IPTables.MasqueradeBit = kpconfig.Ptr(o.masqBit)
		c.IPTables.LocalhostNodePorts = kpconfig.Ptr(o.localhostNodePorts)
		c.Conntrack.MaxPerCore, c.Conntrack.Min = kpconfig.Ptr(o.maxPerCore), kpconfig.Ptr(o.ctMin)
		c.Conntrack.TCPEstablishedTimeout = &metav1.Duration{Duration: o.ctEstablished}
		c.Conntrack.TCPCloseWaitTimeout = &metav1.Duration{Duration: o.ctCloseWait}
		// The sync periods go to the mode's own section (options.go
		// processV1Alpha1Flags).
		if c.Mode == modeIPVS {
			c.IPVS.SyncPeriod.Duration, c.IPVS.MinSyncPeriod.Duration = o.ipvsSync, o.ipvsMin
		} else {
			c.IPTables.SyncPeriod.Duration, c.IPTables.MinSyncPeriod.Duration = o.iptablesSync, o.iptablesMin
			c.NFTables.SyncPeriod.Duration, c.NFTables.MinSyncPeriod.Duration = o.iptablesSync, o.iptablesMin
		}
		gates, err := parseFeatureGates(o.featureGates)
		if err != nil {
			return nil, fmt.Errorf("--feature-gates: %w", err)
		}
		c.FeatureGates = gates
		cfg = &c
	}
	if fs.Changed("hostname-override") {
		h := strings.ToLower(strings.TrimSpace(o.cfg.HostnameOverride))
		if h == "" {
			return nil, errors.New("--hostname-override: empty hostname-override is invalid")
		}
		cfg.HostnameOverride = h
	}
	if fs.Changed("v") {
		cfg.Logging.Verbosity = logsapi.VerbosityLevel(max(o.verbosity, 0))
	}
	if fs.Changed("logging-format") {
		cfg.Logging.Format = o.loggingFormat
	}
	if fs.Changed("log-flush-frequency") {
		cfg.Logging.FlushFrequency.Duration.Duration = o.flushFrequency
	}
	if fs.Changed("vmodule") && o.vmodule != "" {
		return nil, errors.New("--vmodule: userproxy's log levels are not set per file")
	}
	kpconfig.Default(cfg)
	if o.configFile == "" {
		// The deprecated port flags, when given, set the port of the
		// bind address after the defaults (0: no health server; no
		// metrics address, which validation then refuses).
		if fs.Changed("healthz-port") {
			cfg.HealthzBindAddress = withPort(cfg.HealthzBindAddress, o.healthzPort)
		}
		if fs.Changed("metrics-port") {
			cfg.MetricsBindAddress = withPort(cfg.MetricsBindAddress, o.metricsPort)
		}
	}
	return cfg, nil
}

// withPort replaces the port of a host:port address; port 0 gives "".
func withPort(addr string, port int32) string {
	if port == 0 {
		return ""
	}
	host := addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// parseFeatureGates parses kube-proxy's --feature-gates: key=bool pairs,
// comma-separated.
func parseFeatureGates(s string) (map[string]bool, error) {
	gates := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("missing bool value for %s", kv)
		}
		b, err := strconv.ParseBool(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("invalid value of %s=%s, err: %w", k, v, err)
		}
		gates[strings.TrimSpace(k)] = b
	}
	return gates, nil
}

// logKubeProxyStart logs kube-proxy's start-up lines (cmd/kube-proxy/app
// server.go, server_linux.go) as structured entries.
func logKubeProxyStart(logger *zap.Logger, c *kpv1alpha1.KubeProxyConfiguration, f *runFlags, file string) {
	logger.Info("Version info", zap.String("version", versionString()), zap.String("kubeProxyVersion", kubeProxyVersion))
	logger.Info("Golang settings", zap.String("GOGC", os.Getenv("GOGC")), zap.String("GOMAXPROCS", os.Getenv("GOMAXPROCS")),
		zap.String("GOTRACEBACK", os.Getenv("GOTRACEBACK")))
	if file != "" {
		logger.Info("Using the configuration file", zap.String("file", file))
	}
	if ips := nodeIPs(c.BindAddress); len(ips) > 0 {
		logger.Info("Successfully retrieved NodeIPs", zap.Stringers("NodeIPs", ips))
	} else {
		logger.Info("Can't determine this node's IP, assuming loopback; if this is incorrect, please set the --bind-address flag")
	}
	// The primary family is the first --service-cidr's, as kube-proxy's is
	// its first node IP's.
	primary := "IPv4"
	if len(f.serviceCIDRs.values) > 0 && !f.serviceCIDRs.values[0].Addr().Is4() {
		primary = "IPv6"
	}
	if len(servedFamilies(f.serviceCIDRs.values)) == 2 {
		logger.Info("kube-proxy running in dual-stack mode", zap.String("primary ipFamily", primary))
	} else {
		logger.Info("kube-proxy running in single-stack mode", zap.String("ipFamily", primary))
	}
	switch c.Mode {
	case modeIPVS:
		logger.Info("Using ipvs Proxier", zap.String("scheduler", f.scheduler))
	case modeNFTables:
		logger.Info("Using nftables Proxier")
	default:
		logger.Info("Using iptables Proxier")
	}
	if len(c.NodePortAddresses) == 0 && c.Mode != modeNFTables {
		logger.Error("nodePortAddresses is unset; NodePort connections will be accepted on all local IPs. Consider using `--nodeport-addresses primary`")
	}
	if !c.BindAddressHardFail {
		logger.Info("bindAddressHardFail is false, but userproxy exits when it cannot bind its health or metrics address all the same")
	}
	if c.IPTables.MasqueradeAll || c.NFTables.MasqueradeAll {
		logger.Info("masqueradeAll: every proxied flow leaves from the node's own sockets in userproxy, so endpoints see the node's address for every client")
	}
}

// nodeIPs is what kube-proxy takes for the node's addresses: bindAddress
// when it names one, else the primary address of each family (kube-proxy
// asks the Node object; userproxy the default routes).
func nodeIPs(bindAddress string) []netip.Addr {
	if a, err := netip.ParseAddr(bindAddress); err == nil && !a.IsUnspecified() && !a.IsLoopback() {
		return []netip.Addr{a}
	}
	ips, _ := primaryAddrs()
	return ips
}

// newDefaultsFlagSet is a throwaway flag set: registering run's flags on it
// sets their defaults.
func newDefaultsFlagSet() *pflag.FlagSet { return pflag.NewFlagSet("defaults", pflag.ContinueOnError) }

// usageError is an error in how a command was called: main exits 2 for
// it, 1 for any other failure.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func usageErr(err error) error { return usageError{err} }

// applyOOMScoreAdj writes kube-proxy's oomScoreAdj for this process; a
// failure is logged, as kube-proxy logs it.
func applyOOMScoreAdj(v *int32, logger *zap.Logger) {
	if v == nil {
		return
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(int(*v))), 0); err != nil {
		logger.Warn("Failed to apply OOMScore", zap.Int32("oomScoreAdj", *v), zap.Error(err))
	}
}

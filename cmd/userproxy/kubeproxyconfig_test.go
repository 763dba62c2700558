package main

import (
	"github.com/userproxy/userproxy/cmd/userproxy/internal/kpconfig"

	"net/netip"
	"strings"
	"testing"
	"time"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// kubeadmConfigConf is config.conf as kubeadm v1.37 writes it into the
// kube-proxy ConfigMap: its componentconfigs/kubeproxy.go Default sets
// bindAddress, clusterCIDR (from podSubnet), clientConnection.kubeconfig
// and mode, and the rest is the v1alpha1 type's zero value, marshalled to
// JSON and then YAML (MarshalToYamlForCodecs), as here.
func kubeadmConfigConf(t *testing.T, mode, podSubnet string) []byte {
	t.Helper()
	out, err := kubeadmConf(mode, podSubnet)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// kubeadmConf is kubeadmConfigConf without a test.
func kubeadmConf(mode, podSubnet string) ([]byte, error) {
	c := kpv1alpha1.KubeProxyConfiguration{
		BindAddress: "0.0.0.0",
		ClusterCIDR: podSubnet,
		Mode:        kpv1alpha1.ProxyMode(mode),
	}
	c.APIVersion, c.Kind = kpconfig.APIVersion, kpconfig.Kind
	c.FeatureGates = map[string]bool{}
	c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
	return yaml.Marshal(&c)
}

// loadKubeadm decodes, defaults, validates and maps a kubeadm config.conf.
func loadKubeadm(t *testing.T, data []byte) (*kpv1alpha1.KubeProxyConfiguration, *runFlags) {
	t.Helper()
	c, err := kpconfig.Decode("config.conf", data)
	if err != nil {
		t.Fatalf("decoding kubeadm's config.conf: %v\n%s", err, data)
	}
	kpconfig.Default(c)
	if err := kpconfig.Validate(c); err != nil {
		t.Fatalf("validating kubeadm's config.conf: %v", err)
	}
	var f runFlags
	f.register(newDefaultsFlagSet())
	if err := applyKubeProxyConfig(c, &f); err != nil {
		t.Fatal(err)
	}
	return c, &f
}

// TestKubeProxyConfigKubeadm: kubeadm's config.conf, iptables and ipvs
// modes, gets kube-proxy's defaults (pkg/proxy/apis/config/v1alpha1
// defaults.go) and maps onto run's options: the lottery or the IPVS
// scheduler, the health server on every address, the metrics address on
// loopback, NodePorts on every local address (localhost IPv4 only), the
// conntrack table sized as nf_conntrack_max.
func TestKubeProxyConfigKubeadm(t *testing.T) {
	data := kubeadmConfigConf(t, "iptables", "10.244.0.0/16")
	c, f := loadKubeadm(t, data)
	if c.HealthzBindAddress != "0.0.0.0:10256" || c.MetricsBindAddress != "127.0.0.1:10249" {
		t.Errorf("bind addresses %q %q", c.HealthzBindAddress, c.MetricsBindAddress)
	}
	if f.scheduler != "random" || proxyModeOf(f) != "iptables" || f.healthzAddr != "0.0.0.0:10256" || f.adminAddr != "127.0.0.1:10249" {
		t.Errorf("mapped: scheduler %q mode %q healthz %q admin %q", f.scheduler, proxyModeOf(f), f.healthzAddr, f.adminAddr)
	}
	if f.log.format != "text" { // kube-proxy's default logging.format: klog's lines
		t.Errorf("logging.format %q mapped to --log-format %q, want text", c.Logging.Format, f.log.format)
	}
	if f.minSyncPeriod != time.Second || f.ctEstablished != 24*time.Hour || f.ctCloseWait != time.Hour || f.conntrackMaxPerCore != 32768 || f.conntrackMin != 131072 {
		t.Errorf("mapped: minSync %v, conntrack %v %v %d %d", f.minSyncPeriod, f.ctEstablished, f.ctCloseWait, f.conntrackMaxPerCore, f.conntrackMin)
	}
	if len(f.clusterCIDRs.values) != 1 || f.clusterCIDRs.values[0] != netip.MustParsePrefix("10.244.0.0/16") {
		t.Errorf("cluster CIDRs %v", f.clusterCIDRs.values)
	}
	if f.nodePortAddresses != "all" || !f.nodePortFilter(netip.MustParseAddr("127.0.0.1")) || f.nodePortFilter(netip.MustParseAddr("::1")) ||
		!f.nodePortFilter(netip.MustParseAddr("192.0.2.7")) {
		t.Errorf("NodePorts %q: want every address, localhost over IPv4 only", f.nodePortAddresses)
	}
	if f.kubeconfig != "/var/lib/kube-proxy/kubeconfig.conf" || f.clientQPS != 5 || f.clientBurst != 10 || *f.oomScoreAdj != -999 {
		t.Errorf("client %q %v %d, oom %d", f.kubeconfig, f.clientQPS, f.clientBurst, *f.oomScoreAdj)
	}

	// mode: ipvs with scheduler lc, as the ConfigMap edit.
	ipvs := strings.Replace(string(kubeadmConfigConf(t, "ipvs", "10.244.0.0/16")), "scheduler: \"\"", "scheduler: lc", 1)
	_, f = loadKubeadm(t, []byte(ipvs))
	if f.scheduler != "lc" || proxyModeOf(f) != "ipvs" || f.minSyncPeriod != 0 {
		t.Errorf("ipvs: scheduler %q mode %q minSync %v; want lc, ipvs, 0", f.scheduler, proxyModeOf(f), f.minSyncPeriod)
	}
	_, f = loadKubeadm(t, kubeadmConfigConf(t, "ipvs", ""))
	if f.scheduler != "rr" {
		t.Errorf("ipvs without a scheduler: %q; want rr (ipvs/proxier.go)", f.scheduler)
	}
	// nftables: the primary addresses, no localhost NodePorts.
	_, f = loadKubeadm(t, kubeadmConfigConf(t, "nftables", ""))
	if f.nodePortAddresses != "primary" || f.nodePortFilter(netip.MustParseAddr("127.0.0.1")) || f.scheduler != "random" {
		t.Errorf("nftables: NodePorts %q, scheduler %q", f.nodePortAddresses, f.scheduler)
	}
}

// TestKubeProxyConfigRefused: every field of v1alpha1 that can be wrong,
// each refused with a message naming it: an unknown field (top level and
// nested), kube-proxy's validation rules (validation.go), and what
// userproxy cannot honour.
func TestKubeProxyConfigRefused(t *testing.T) {
	base := string(kubeadmConfigConf(t, "iptables", "10.244.0.0/16"))
	set := func(old, new string) string {
		if !strings.Contains(base, old) {
			t.Fatalf("kubeadm's config.conf has no %q", old)
		}
		return strings.Replace(base, old, new, 1)
	}
	tests := []struct {
		name, data, want string
	}{
		{"unknown field", base + "bogus: 1\n", `unknown field "bogus"`},
		{"unknown nested field", set("  masqueradeAll: false\n", "  masqueradeAll: false\n  bogus: 1\n"), `unknown field "iptables.bogus"`},
		{"duplicate field", base + "mode: ipvs\n", `key "mode" already set`},
		{"another kind", strings.Replace(base, "kind: KubeProxyConfiguration", "kind: KubeletConfiguration", 1), `kind "KubeletConfiguration"`},
		{"another version", strings.Replace(base, "v1alpha1", "v1beta1", 1), `apiVersion "kubeproxy.config.k8s.io/v1beta1"`},
		{"empty", "", "the file is empty"},
		{"not YAML", "mode: [", "config.conf"},
		{"wrong type", set("mode: iptables", "mode: [a]"), "mode"},
		{"mode", set("mode: iptables", "mode: userspace"), "KubeProxyConfiguration.mode"},
		{"mode kernelspace", set("mode: iptables", "mode: kernelspace"), "KubeProxyConfiguration.mode: kernelspace is not supported"},
		{"ipvs gate off", set("mode: iptables", "mode: ipvs\nfeatureGates:\n  KubeProxyIPVS: false"), "KubeProxyIPVS feature gate is off"},
		{"unknown gate", base + "featureGates:\n  NoSuchGate: true\n", "KubeProxyConfiguration.featureGates: invalid value NoSuchGate"},
		{"alpha gate", base + "featureGates:\n  KubeProxyNFTablesLocalhostNodePorts: true\n", "featureGates[KubeProxyNFTablesLocalhostNodePorts]"},
		{"iptables.syncPeriod negative", set("  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs", "  minSyncPeriod: 0s\n  syncPeriod: -1s\nipvs"), "KubeProxyConfiguration.iptables.syncPeriod"},
		{"iptables.minSyncPeriod above", set("  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs", "  minSyncPeriod: 1m\n  syncPeriod: 30s\nipvs"), "KubeProxyConfiguration.iptables.minSyncPeriod"},
		{"iptables.minSyncPeriod negative", set("  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs", "  minSyncPeriod: -1s\n  syncPeriod: 30s\nipvs"), "KubeProxyConfiguration.iptables.minSyncPeriod"},
		{"iptables.masqueradeBit", set("  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs", "  masqueradeBit: 32\n  minSyncPeriod: 0s\n  syncPeriod: 0s\nipvs"), "KubeProxyConfiguration.iptables.masqueradeBit"},
		{"nftables.masqueradeBit", set("mode: iptables\nnftables:\n  masqueradeAll: false\n  masqueradeBit: null", "mode: nftables\nnftables:\n  masqueradeAll: false\n  masqueradeBit: -1"), "KubeProxyConfiguration.nftables.masqueradeBit"},
		{"configSyncPeriod", set("configSyncPeriod: 0s", "configSyncPeriod: -1s"), "KubeProxyConfiguration.configSyncPeriod"},
		{"bindAddress", set("bindAddress: 0.0.0.0", "bindAddress: nowhere"), "KubeProxyConfiguration.bindAddress"},
		{"healthzBindAddress", set(`healthzBindAddress: ""`, "healthzBindAddress: 0.0.0.0:99999"), "KubeProxyConfiguration.healthzBindAddress"},
		{"metricsBindAddress", set(`metricsBindAddress: ""`, "metricsBindAddress: localhost:10249"), "KubeProxyConfiguration.metricsBindAddress"},
		{"clientConnection.burst", set("  burst: 0", "  burst: -1"), "KubeProxyConfiguration.clientConnection.burst"},
		{"clientConnection.acceptContentTypes", set(`  acceptContentTypes: ""`, "  acceptContentTypes: application/json"), "KubeProxyConfiguration.clientConnection.acceptContentTypes"},
		{"oomScoreAdj", set("oomScoreAdj: null", "oomScoreAdj: 1001"), "KubeProxyConfiguration.oomScoreAdj"},
		{"conntrack.maxPerCore", set("  maxPerCore: null", "  maxPerCore: -1"), "KubeProxyConfiguration.conntrack.maxPerCore"},
		{"conntrack.min", set("  min: null", "  min: -1"), "KubeProxyConfiguration.conntrack.min"},
		{"conntrack.tcpEstablishedTimeout", set("  tcpEstablishedTimeout: null", "  tcpEstablishedTimeout: -1s"), "KubeProxyConfiguration.conntrack.tcpEstablishedTimeout"},
		{"conntrack.tcpCloseWaitTimeout", set("  tcpCloseWaitTimeout: null", "  tcpCloseWaitTimeout: -1s"), "KubeProxyConfiguration.conntrack.tcpCloseWaitTimeout"},
		{"conntrack.udpTimeout", set("  udpTimeout: 0s\ndetectLocal", "  udpTimeout: -1s\ndetectLocal"), "KubeProxyConfiguration.conntrack.udpTimeout"},
		{"conntrack.udpStreamTimeout", set("  udpStreamTimeout: 0s", "  udpStreamTimeout: -1s"), "KubeProxyConfiguration.conntrack.udpStreamTimeout"},
		{"clusterCIDR", set("clusterCIDR: 10.244.0.0/16", "clusterCIDR: 10.244.0.0/16,10.245.0.0/16"), "KubeProxyConfiguration.clusterCIDR"},
		{"clusterCIDR not a CIDR", set("clusterCIDR: 10.244.0.0/16", "clusterCIDR: pods"), "KubeProxyConfiguration.clusterCIDR"},
		{"detectLocalMode", set(`detectLocalMode: ""`, "detectLocalMode: Magic"), "KubeProxyConfiguration.detectLocalMode"},
		{"detectLocalMode unsupported", set(`detectLocalMode: ""`, "detectLocalMode: NodeCIDR"), "KubeProxyConfiguration.detectLocalMode: NodeCIDR is not supported"},
		{"nodePortAddresses", set("nodePortAddresses: null", "nodePortAddresses: [eth0]"), "KubeProxyConfiguration.nodePortAddresses"},
		{"nodePortAddresses repeated", set("nodePortAddresses: null", "nodePortAddresses: [primary, primary]"), "may not be repeated"},
		{"logging.format", set("logging:\n", "logging:\n  format: xml\n"), "KubeProxyConfiguration.logging.format"},
		{"logging.vmodule", set("logging:\n", "logging:\n  vmodule: [{filePattern: proxier.go, verbosity: 4}]\n"), "KubeProxyConfiguration.logging.vmodule"},
		// A resource.Quantity the apimachinery parser takes minutes over:
		// refused before it is parsed (FuzzKubeProxyConfig).
		{"logging.options.text.infoBufferSize", set(`      infoBufferSize: "0"`, `      infoBufferSize: "1e-99999999"`), "KubeProxyConfiguration.logging.options.json.infoBufferSize"},
		{"logging.flushFrequency", set("  flushFrequency: 0", "  flushFrequency: -1s"), "KubeProxyConfiguration.logging.flushFrequency"},
		{"showHiddenMetricsForVersion", set(`showHiddenMetricsForVersion: ""`, "showHiddenMetricsForVersion: \"1.36\""), "KubeProxyConfiguration.showHiddenMetricsForVersion"},
		{"winkernel", set(`  networkName: ""`, "  networkName: nat"), "KubeProxyConfiguration.winkernel"},
		{"windowsRunAsService", base + "windowsRunAsService: true\n", "KubeProxyConfiguration.windowsRunAsService"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := kpconfig.Decode("config.conf", []byte(tt.data))
			if err == nil {
				kpconfig.Default(c)
				err = kpconfig.Validate(c)
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v; want an error with %q", err, tt.want)
			}
			if strings.HasPrefix(tt.want, "KubeProxyConfiguration.") || strings.Contains(tt.want, "field") {
				return
			}
			if !strings.Contains(err.Error(), "config.conf") && !strings.Contains(err.Error(), "KubeProxyConfiguration.") {
				t.Errorf("%v: names neither the file nor the field", err)
			}
		})
	}
	// The IPVS timeouts and scheduler, in ipvs mode.
	ipvs := string(kubeadmConfigConf(t, "ipvs", ""))
	for field, want := range map[string]string{
		"  tcpTimeout: 0s":       "KubeProxyConfiguration.ipvs.tcpTimeout: 10m0s is not supported",
		"  tcpFinTimeout: 0s":    "KubeProxyConfiguration.ipvs.tcpFinTimeout: 10m0s is not supported",
		"  udpTimeout: 0s\nkind": "KubeProxyConfiguration.ipvs.udpTimeout: 10m0s is not supported",
		`  scheduler: ""`:        "KubeProxyConfiguration.ipvs.scheduler",
		"  excludeCIDRs: null":   "KubeProxyConfiguration.ipvs.excludeCIDRs",
	} {
		repl := strings.Replace(field, "0s", "10m", 1)
		switch {
		case strings.Contains(field, "scheduler"):
			repl = "  scheduler: fastest"
		case strings.Contains(field, "excludeCIDRs"):
			repl = "  excludeCIDRs: [not-a-cidr]"
		}
		if !strings.Contains(ipvs, field) {
			t.Fatalf("kubeadm's ipvs config.conf has no %q", field)
		}
		c, err := kpconfig.Decode("config.conf", []byte(strings.Replace(ipvs, field, repl, 1)))
		if err == nil {
			kpconfig.Default(c)
			err = kpconfig.Validate(c)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v; want %q", repl, err, want)
		}
	}
}

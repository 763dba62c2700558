package kpconfig

import (
	"testing"

	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/balancer"
)

// FuzzKubeProxyConfig feeds any bytes to `kube-proxy --config`'s path:
// decode, defaults, validation. Nothing panics; an accepted configuration
// has a mode kube-proxy v1.37 takes and, in ipvs mode, a scheduler balancer
// knows; written back (--write-config-to), it reads back as accepted.
func FuzzKubeProxyConfig(f *testing.F) {
	for _, mode := range []string{"iptables", "ipvs", "nftables", ""} {
		// config.conf as kubeadm writes it: a few fields set, the rest the
		// type's zero value.
		c := kpv1alpha1.KubeProxyConfiguration{BindAddress: "0.0.0.0", ClusterCIDR: "10.244.0.0/16,fd00:244::/64", Mode: kpv1alpha1.ProxyMode(mode)}
		c.APIVersion, c.Kind = APIVersion, Kind
		c.ClientConnection.Kubeconfig = "/var/lib/kube-proxy/kubeconfig.conf"
		out, err := yaml.Marshal(&c)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(out)
	}
	f.Add([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs: {scheduler: mh}\nnodePortAddresses: [primary, 10.0.0.0/8]\n"))
	f.Add([]byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nconntrack: {maxPerCore: 0, min: 5}\nhealthzBindAddress: \"::\"\nbindAddress: \"::\"\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Decode("fuzz.conf", data)
		if err != nil {
			return
		}
		Default(c)
		if Validate(c) != nil {
			return
		}
		switch c.Mode {
		case ModeIPTables, ModeNFTables:
		case ModeIPVS:
			if c.IPVS.Scheduler != "" {
				if _, err := balancer.ParseScheduler(c.IPVS.Scheduler, ""); err != nil {
					t.Fatalf("accepted scheduler %q: %v", c.IPVS.Scheduler, err)
				}
			}
		default:
			t.Fatalf("accepted mode %q", c.Mode)
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("writing back: %v", err)
		}
		again, err := Decode("written.conf", out)
		if err == nil {
			Default(again)
			err = Validate(again)
		}
		if err != nil {
			t.Fatalf("the configuration written back is refused: %v\n%s", err, out)
		}
	})
}

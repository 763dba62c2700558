//go:build linux

package integration

// kube-proxy's DaemonSet with only the image changed (root, a real API
// server): the binary, started as kube-proxy with kubeadm's command
// (/usr/local/bin/kube-proxy --config=/var/lib/kube-proxy/config.conf
// --hostname-override=$(NODE_NAME)) and kubeadm's config.conf edited as
// the admin edits it (mode: ipvs, scheduler: lc), serves the
// ClusterIP with least-connection scheduling, the health server on every
// address, kube-proxy's /proxyMode, /configz and /metrics on the metrics
// address.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"
)

// kubeadmProxyConfig is config.conf as kubeadm v1.37 writes it
// (cmd/kubeadm/app/componentconfigs/kubeproxy.go Default: bindAddress,
// clusterCIDR from podSubnet, clientConnection.kubeconfig and mode set, the
// rest the type's zero value, marshalled to JSON and then YAML).
func kubeadmProxyConfig(t *testing.T, kubeconfig, mode, podSubnet string) []byte {
	t.Helper()
	c := kpv1alpha1.KubeProxyConfiguration{BindAddress: "0.0.0.0", ClusterCIDR: podSubnet, Mode: kpv1alpha1.ProxyMode(mode)}
	c.APIVersion, c.Kind = "kubeproxy.config.k8s.io/v1alpha1", "KubeProxyConfiguration"
	c.FeatureGates = map[string]bool{}
	c.ClientConnection.Kubeconfig = kubeconfig
	out, err := yaml.Marshal(&c)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestKubeProxyDropIn(t *testing.T) {
	bin := userproxyBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rig := startKubeAPIRig(t, ctx, holdServer)
	u, cs := rig.u, rig.cs

	vip := createTCPService(t, ctx, cs, "db", "tcp", 5432)
	port, proto, ready, name := int32(diffTCPPort), v1.ProtocolTCP, true, "tcp"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "db-1", Labels: map[string]string{discoveryv1.LabelServiceName: "db"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for i := range 2 {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{diffBackend(i).String()},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// kubeadm's config.conf with the admin's edit, and the binary as
	// /usr/local/bin/kube-proxy: a link named kube-proxy.
	conf := string(kubeadmProxyConfig(t, rig.cluster.Kubeconfig(), "ipvs", "10.244.0.0/16"))
	conf = strings.Replace(conf, `scheduler: ""`, "scheduler: lc", 1)
	confPath := filepath.Join(rig.dir, "config.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	kubeProxy := filepath.Join(rig.dir, "kube-proxy")
	if err := os.Symlink(bin, kubeProxy); err != nil {
		t.Fatal(err)
	}
	p := startProc(t, "ip", "netns", "exec", rig.uName, kubeProxy, "--config="+confPath, "--hostname-override=Node-A")
	u.waitHealthy(p)

	// kube-proxy's endpoints on the metrics address.
	if code, body, err := u.get("/proxyMode"); err != nil || code != http.StatusOK || body != "ipvs" {
		t.Errorf("/proxyMode: %d %q %v; want 200 \"ipvs\"", code, body, err)
	}
	code, body, err := u.get("/configz")
	var configz map[string]kpv1alpha1.KubeProxyConfiguration
	if err != nil || code != http.StatusOK || json.Unmarshal([]byte(body), &configz) != nil {
		t.Fatalf("/configz: %d %v\n%s", code, err, body)
	}
	if c := configz["kubeproxy.config.k8s.io"]; c.IPVS.Scheduler != "lc" || c.HostnameOverride != "node-a" || c.HealthzBindAddress != "0.0.0.0:10256" {
		t.Errorf("/configz: scheduler %q, hostnameOverride %q, healthzBindAddress %q", c.IPVS.Scheduler, c.HostnameOverride, c.HealthzBindAddress)
	}
	if code, body, err := u.get("/metrics"); err != nil || code != http.StatusOK || !strings.Contains(body, "kubeproxy_sync_proxy_rules_duration_seconds") {
		t.Errorf("/metrics: %d %v", code, err)
	}
	// The health server on every address (kube-proxy's 0.0.0.0:10256), not
	// only loopback: the veth's.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) { return u.c.dial(network, addr) }}}
	resp, err := hc.Get("http://203.0.113.1:10256/livez")
	if err != nil {
		t.Fatalf("the health server on the node's address: %v", err)
	}
	live, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(live), `"healthy":true`) {
		t.Errorf("/livez on 203.0.113.1:10256: %d %s", resp.StatusCode, live)
	}

	// Least connection, on held connections: each new one goes to the
	// endpoint holding fewer (IPVS lc), so that ten held connections stay
	// within one of each other at every step (the lottery does that one
	// time in 32); the endpoint whose connections close gets the next two.
	dial := func() (net.Conn, string) {
		t.Helper()
		c, err := u.c.dial("tcp", vip)
		if err != nil {
			t.Fatalf("dialling %s: %v", vip, err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [1]byte
		if _, err := io.ReadFull(c, b[:]); err != nil {
			t.Fatalf("reading the endpoint's name from %s: %v", vip, err)
		}
		return c, string(b[:])
	}
	waitFor(t, "the ClusterIP "+vip+" to answer", func() bool {
		c, err := u.c.dial("tcp", vip)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
	time.Sleep(200 * time.Millisecond) // the probe's flow closed, as far as the balancer counts
	held := map[string][]net.Conn{}
	var order []string
	for range 10 {
		c, got := dial()
		held[got] = append(held[got], c)
		order = append(order, got)
		if d := len(held["a"]) - len(held["b"]); d > 1 || d < -1 {
			t.Fatalf("least connection: held %d on a and %d on b after %v", len(held["a"]), len(held["b"]), order)
		}
	}
	t.Logf("ten held connections went %v", order)
	for _, c := range held["a"] {
		c.Close()
	}
	held["a"] = nil
	time.Sleep(200 * time.Millisecond)
	for i := range 2 {
		c, got := dial()
		defer c.Close()
		if got != "a" {
			t.Fatalf("connection %d after a's closed went to %q; want a, which holds none", i+1, got)
		}
	}
	for _, c := range held["b"] {
		c.Close()
	}
	if err := p.stop(t); err != nil {
		t.Fatalf("kube-proxy exit: %v", err)
	}
}

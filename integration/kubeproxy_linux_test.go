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
	"bytes"
	"context"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpv1alpha1 "k8s.io/kube-proxy/config/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/integration/kubeapi"
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

	// kubeadm's DaemonSet and ConfigMap, from kubeadm's own source, the
	// image swapped and config.conf edited as the admin edits it; applied
	// to the API server (server-side dry run); then the binary started as
	// that DaemonSet's container would be, with the ConfigMap's files.
	ds, cm := kubeadmProxyManifests(t, rig.cluster.URL())
	for i, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "kube-proxy" {
			ds.Spec.Template.Spec.Containers[i].Image = "registry.example/userproxy:test"
		}
	}
	cm.Data["config.conf"] = strings.Replace(cm.Data["config.conf"], `scheduler: ""`, "scheduler: lc", 1)
	cm.Data["config.conf"] = strings.Replace(cm.Data["config.conf"], "mode: iptables", "mode: ipvs", 1)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := cs.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, dry); err != nil {
		t.Fatalf("kubeadm's ConfigMap, dry run: %v", err)
	}
	if _, err := cs.AppsV1().DaemonSets("kube-system").Create(ctx, ds, dry); err != nil {
		t.Fatalf("kubeadm's DaemonSet with the image swapped, dry run: %v", err)
	}
	cmd := kubeadmContainer(t, rig, ds, cm, bin, "Node-A")
	p := startProc(t, append([]string{"ip", "netns", "exec", rig.uName}, cmd...)...)
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

// kubeadmProxyManifests renders kubeadm v1.37's kube-proxy DaemonSet and
// ConfigMap from its source (cmd/kubeadm/app/phases/addons/proxy/
// manifests.go in the module cache, downloaded if missing): the templates
// filled as its proxy.go fills them, config.conf as its componentconfigs
// write it (kubeadmProxyConfig), the API server at server.
func kubeadmProxyManifests(t *testing.T, server string) (*appsv1.DaemonSet, *v1.ConfigMap) {
	t.Helper()
	dl := exec.Command("go", "mod", "download", "-json", "k8s.io/kubernetes@"+kubeapi.Version)
	dl.Dir = "kubeapiserver" // the module that pins it
	out, err := dl.Output()
	if err != nil {
		t.Fatalf("go mod download k8s.io/kubernetes@%s: %v", kubeapi.Version, err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, out)
	}
	src := filepath.Join(mod.Dir, "cmd/kubeadm/app/phases/addons/proxy/manifests.go")
	f, err := parser.ParseFile(token.NewFileSet(), src, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, sp := range g.Specs {
			vs := sp.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
					if v, err := strconv.Unquote(lit.Value); err == nil {
						consts[n.Name] = v
					}
				}
			}
		}
	}
	render := func(name string, data any) []byte {
		tmpl, ok := consts[name]
		if !ok {
			t.Fatalf("%s has no constant %s", src, name)
		}
		var b bytes.Buffer
		if err := template.Must(template.New(name).Parse(tmpl)).Execute(&b, data); err != nil {
			t.Fatalf("rendering %s: %v", name, err)
		}
		return b.Bytes()
	}
	// proxy.go: config.conf indented four spaces into the ConfigMap.
	var conf strings.Builder
	for _, l := range strings.Split(strings.TrimRight(string(kubeadmProxyConfig(t, "/var/lib/kube-proxy/kubeconfig.conf", "iptables", "10.244.0.0/16")), "\n"), "\n") {
		conf.WriteString("    " + l + "\n")
	}
	var cm v1.ConfigMap
	if err := yaml.UnmarshalStrict(render("KubeProxyConfigMap19", map[string]string{
		"ProxyConfigMap": "kube-proxy", "ProxyConfigMapKey": "config.conf", "ControlPlaneEndpoint": server,
		"ProxyConfig": strings.TrimRight(conf.String(), "\n"),
	}), &cm); err != nil {
		t.Fatalf("kubeadm's ConfigMap: %v", err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(render("KubeProxyDaemonSet19", map[string]string{
		"Image": "registry.k8s.io/kube-proxy:" + kubeapi.Version, "ProxyConfigMap": "kube-proxy", "ProxyConfigMapKey": "config.conf",
	}), &ds); err != nil {
		t.Fatalf("kubeadm's DaemonSet: %v", err)
	}
	return &ds, &cm
}

// kubeadmContainer is the command line of ds's kube-proxy container as the
// kubelet would run it on node nodeName, here: the ConfigMap's files where
// the container mounts them (/var/lib/kube-proxy, under the rig's directory),
// the service account's token and CA where kubeconfig.conf reads them (a
// TokenRequest of the kube-proxy ServiceAccount, bound to system:node-proxier
// as kubeadm binds it), /usr/local/bin/kube-proxy a link to bin, and
// $(NODE_NAME) expanded.
func kubeadmContainer(t *testing.T, rig *kubeAPIRig, ds *appsv1.DaemonSet, cm *v1.ConfigMap, bin, nodeName string) []string {
	t.Helper()
	ctx := context.Background()
	root := filepath.Join(rig.dir, "node")
	mapPath := func(p string) string { return filepath.Join(root, p) }
	var c *v1.Container
	for i := range ds.Spec.Template.Spec.Containers {
		if ds.Spec.Template.Spec.Containers[i].Name == "kube-proxy" {
			c = &ds.Spec.Template.Spec.Containers[i]
		}
	}
	if c == nil || len(c.Command) == 0 {
		t.Fatal("kubeadm's DaemonSet has no kube-proxy container with a command")
	}
	// The ServiceAccount, its binding and a token, as kubeadm sets them up.
	cs := rig.cs
	if _, err := cs.CoreV1().ServiceAccounts("kube-system").Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:node-proxier"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kube-proxy", Namespace: "kube-system"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "kube-proxy",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa := "/var/run/secrets/kubernetes.io/serviceaccount"
	for name, data := range map[string][]byte{"token": []byte(tr.Status.Token), "ca.crt": rig.cluster.CA()} {
		if err := os.MkdirAll(mapPath(sa), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mapPath(sa), name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The ConfigMap's volume, its absolute paths moved under root.
	var mount string
	for _, m := range c.VolumeMounts {
		if m.Name == "kube-proxy" {
			mount = m.MountPath
		}
	}
	if err := os.MkdirAll(mapPath(mount), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range cm.Data {
		data = strings.ReplaceAll(data, sa, mapPath(sa))
		data = strings.ReplaceAll(data, mount+"/", mapPath(mount)+"/")
		if err := os.WriteFile(filepath.Join(mapPath(mount), name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	exe := mapPath(c.Command[0])
	if err := os.MkdirAll(filepath.Dir(exe), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, exe); err != nil {
		t.Fatal(err)
	}
	cmd := []string{exe}
	for _, a := range c.Command[1:] {
		a = strings.ReplaceAll(a, "$(NODE_NAME)", nodeName)
		a = strings.ReplaceAll(a, mount+"/", mapPath(mount)+"/")
		cmd = append(cmd, a)
	}
	t.Logf("kubeadm's kube-proxy container: %q, run as %q", c.Command, cmd)
	return cmd
}

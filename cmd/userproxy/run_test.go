package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// --handshake-timeout runs from the client's SYN, the endpoint dial within
// it (netstack's admitSYN starts the timer at the SYN), and its help must
// say so: it once said the time started once the endpoint was dialled.
func TestHandshakeTimeoutHelpSaysSYN(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f runFlags
	f.register(fs)
	fl := fs.Lookup("handshake-timeout")
	if fl == nil {
		t.Fatal("no --handshake-timeout flag")
	}
	for _, want := range []string{"SYN", "dial"} {
		if !strings.Contains(fl.Usage, want) {
			t.Errorf("--handshake-timeout help %q does not mention %q", fl.Usage, want)
		}
	}
	if strings.Contains(fl.Usage, "once the endpoint was dialled") {
		t.Errorf("--handshake-timeout help %q says the time starts after the dial", fl.Usage)
	}
}

// TestCheckServiceAnnotations: a file Service naming an unknown scheduler, or
// flags its scheduler does not take, is refused with the annotation named.
func TestCheckServiceAnnotations(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		fail bool
	}{
		{nil, false},
		{map[string]string{service.AnnotationScheduler: "mh", service.AnnotationSchedulerFlags: "mh-port"}, false},
		{map[string]string{service.AnnotationScheduler: "fastest"}, true},
		{map[string]string{service.AnnotationScheduler: "rr", service.AnnotationSchedulerFlags: "sh-port"}, true},
		{map[string]string{service.AnnotationProxyProtocol: "v2"}, false},
		{map[string]string{service.AnnotationProxyProtocol: "v3"}, true},
		{map[string]string{service.AnnotationProxyProtocol: "v1"}, true}, // the Service has a UDP port
	} {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Annotations: tc.ann},
			Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{Protocol: v1.ProtocolTCP}, {Protocol: v1.ProtocolUDP}}}}
		err := checkServiceAnnotations(s)
		if (err != nil) != tc.fail || (err != nil && !strings.Contains(err.Error(), "metadata.annotations[userproxy.io/")) {
			t.Errorf("%v: %v", tc.ann, err)
		}
	}
}

// TestManifestArgsAreRunFlags: every argument the shipped manifests give
// `userproxy run` is one of its flags, with a value it accepts (the API
// server's dry run, TestManifestsDryRun, checks the schema, not the args).
func TestManifestArgsAreRunFlags(t *testing.T) {
	for _, file := range []string{"daemonset.yaml", "sidecar.yaml"} {
		data, err := os.ReadFile("../../examples/kubernetes/" + file)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, doc := range strings.Split(string(data), "\n---") {
			var obj struct {
				Spec struct {
					Containers []v1.Container `json:"containers"`
					Template   struct {
						Spec struct {
							Containers []v1.Container `json:"containers"`
						} `json:"spec"`
					} `json:"template"`
				} `json:"spec"`
			}
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			for _, c := range append(obj.Spec.Containers, obj.Spec.Template.Spec.Containers...) {
				if len(c.Args) == 0 || c.Args[0] != "run" {
					continue
				}
				found++
				fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
				fs.SetOutput(io.Discard)
				var f runFlags
				f.register(fs)
				// $(NODE_NAME) is the downward API's: any name will do here.
				args := strings.ReplaceAll(strings.Join(c.Args[1:], "\x00"), "$(NODE_NAME)", "node-a")
				if err := fs.Parse(strings.Split(args, "\x00")); err != nil {
					t.Errorf("%s: container %s: %v", file, c.Name, err)
					continue
				}
				if err := f.validate(); err != nil {
					t.Errorf("%s: container %s: %v", file, c.Name, err)
				}
				if _, err := nodePortAddrs(strings.ReplaceAll(f.nodePortAddresses, "primary,", "")); err != nil {
					t.Errorf("%s: container %s: %v", file, c.Name, err)
				}
			}
		}
		if found != 1 {
			t.Errorf("%s: %d containers run userproxy, want 1", file, found)
		}
	}
}

// TestCheckInClusterHost: in cluster, an API server address inside a
// --service-cidr is refused at start with what to do.
func TestCheckInClusterHost(t *testing.T) {
	var f runFlags
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f.register(fs)
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	if err := checkInClusterHost(&f); err == nil || !strings.Contains(err.Error(), "KUBERNETES_SERVICE_HOST=10.96.0.1") {
		t.Fatalf("ClusterIP host: %v", err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "192.0.2.10")
	if err := checkInClusterHost(&f); err != nil {
		t.Fatalf("a control-plane address: %v", err)
	}
	f.kubeconfig = "/some/kubeconfig"
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	if err := checkInClusterHost(&f); err != nil {
		t.Fatalf("with --kubeconfig: %v", err)
	}
}

// TestReadAndWatchNode: run's wiring of the Node: read at start (the first
// table uses its zone), then watched; --zone overrides the label, and the
// autoscaler's taint makes the node ineligible.
func TestReadAndWatchNode(t *testing.T) {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{v1.LabelTopologyZone: "zone-a"}}}
	for _, override := range []string{"", "zone-x"} {
		client := fake.NewClientset(node.DeepCopy())
		tr, err := service.NewTracker(service.Config{Zone: override})
		if err != nil {
			t.Fatal(err)
		}
		ph := admin.NewProxierHealth(tr, nil, true, 0, nil)
		f := &runFlags{nodeName: "node-a", zone: override}
		ctx, cancel := context.WithCancel(context.Background())
		readNode(ctx, client, f, tr, ph, zap.NewNop())
		wantZone := "zone-a"
		if override != "" {
			wantZone = override
		}
		if tr.Zone() != wantZone || !ph.NodeEligible() {
			t.Fatalf("--zone %q, after the read: zone %q eligible %v", override, tr.Zone(), ph.NodeEligible())
		}
		done := make(chan struct{})
		go func() { defer close(done); watchNode(ctx, client, f, tr, ph, zap.NewNop()) }()
		tainted := node.DeepCopy()
		tainted.Labels[v1.LabelTopologyZone] = "zone-b"
		tainted.Spec.Taints = []v1.Taint{{Key: kube.ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}
		if _, err := client.CoreV1().Nodes().Update(ctx, tainted, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if override == "" {
			wantZone = "zone-b"
		}
		deadline := time.Now().Add(5 * time.Second)
		for ph.NodeEligible() || tr.Zone() != wantZone {
			if time.Now().After(deadline) {
				t.Fatalf("--zone %q, after the taint: zone %q eligible %v", override, tr.Zone(), ph.NodeEligible())
			}
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		<-done
		tr.Close()
	}
}

// TestPrepareRunDir: setup --run-dir makes the directory for the user
// alone (mode 0700, owned by it), and tightens one that exists; --user
// takes uid[:gid] as numbers, for an image without /etc/passwd.
func TestPrepareRunDir(t *testing.T) {
	uid, gid := os.Getuid(), os.Getgid()
	dir := filepath.Join(t.TempDir(), "run", "userproxy")
	for _, spec := range []string{fmt.Sprintf("%d:%d", uid, gid), fmt.Sprint(uid)} {
		if err := prepareRunDir(dir, spec); err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: mode %v, want 0700", spec, fi.Mode().Perm())
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid {
			t.Errorf("%s: owner %d, want %d", spec, st.Uid, uid)
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"1000:x", "name:1000", "no-such-user-upx"} {
		if err := prepareRunDir(dir, bad); err == nil {
			t.Errorf("--user %q accepted", bad)
		}
	}
}

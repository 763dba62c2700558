package main

import (
	"flag"
	"io"
	"os"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/userproxy/userproxy/service"
)

// --handshake-timeout runs from the client's SYN, the endpoint dial within
// it (netstack's admitSYN starts the timer at the SYN), and its help must
// say so: it once said the time started once the endpoint was dialled.
func TestHandshakeTimeoutHelpSaysSYN(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
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
				fs := flag.NewFlagSet("run", flag.ContinueOnError)
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
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
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

package main

import (
	"flag"
	"io"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

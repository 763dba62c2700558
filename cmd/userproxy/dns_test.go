package main

import (
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/service"
)

func parseRun(t *testing.T, args ...string) (*runFlags, error) {
	t.Helper()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f runFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return &f, f.validate()
}

// The DNS flags: the default address, and what is refused.
func TestDNSFlags(t *testing.T) {
	cases := []struct {
		args     []string
		wantAddr string // "" when refused
		domain   string
	}{
		{nil, "10.96.0.10", "cluster.local"},
		{[]string{"--service-cidr", "fd00:96::/64", "--service-cidr", "10.96.0.0/12"}, "fd00:96::a", "cluster.local"},
		{[]string{"--dns-ip", "10.100.0.53", "--cluster-domain", "Corp.Example."}, "10.100.0.53", "corp.example"},
		{[]string{"--dns-ip", "192.0.2.53"}, "", ""},          // outside the service CIDRs
		{[]string{"--dns-ip", "nonsense"}, "", ""},            //
		{[]string{"--service-cidr", "10.96.0.0/29"}, "", ""},  // no 10th address
		{[]string{"--cluster-domain", "bad..domain"}, "", ""}, //
		{[]string{"--dns-upstream", "10.96.0.20:53"}, "", ""}, // would loop back into the TUN
		{[]string{"--dns-upstream", "dns.example"}, "", ""},   // not ip:port
		{[]string{"--dns-upstream", "127.0.0.53:53"}, "10.96.0.10", "cluster.local"},
		{[]string{"--dns=false", "--dns-ip", "192.0.2.53"}, "invalid IP", ""}, // off: not checked, no address
	}
	for _, c := range cases {
		f, err := parseRun(t, c.args...)
		switch {
		case c.wantAddr == "" && err == nil:
			t.Errorf("%v: accepted (address %s)", c.args, f.dns.addr)
		case c.wantAddr != "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case err == nil && (f.dns.addr.String() != c.wantAddr || f.dns.domain != c.domain && c.domain != ""):
			t.Errorf("%v: address %s, domain %q; want %s, %q", c.args, f.dns.addr, f.dns.domain, c.wantAddr, c.domain)
		}
	}
}

// The darwin lines name the /etc/resolver file.
func TestManualLinesDarwin(t *testing.T) {
	h := hostDNS{tun: "utun5", ip: netip.MustParseAddr("10.96.0.10"), domain: "cluster.local"}
	if diff := cmp.Diff([]string{"/etc/resolver/cluster.local: nameserver 10.96.0.10"}, h.manualLines("darwin")); diff != "" {
		t.Error(diff)
	}
}

// The log says once when a Service takes the DNS address over, and once
// when it leaves.
func TestStepAsideLogger(t *testing.T) {
	f, err := parseRun(t)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	hook := stepAsideLogger(f, zap.New(core))
	tr, err := service.NewTracker(service.Config{Clock: service.NewManualClock(time.Unix(0, 0))})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	tr.OnSynced()
	kubeDNS := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns"},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []v1.ServicePort{{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53}}},
	}
	var got []string
	step := func() {
		hook(tr.Current())
		for _, e := range logs.TakeAll() {
			got = append(got, e.Message)
		}
	}
	step()
	tr.OnServiceAdd(kubeDNS)
	step()
	step()
	tr.OnServiceDelete(kubeDNS)
	step()
	want := []string{
		"dns: stepped aside for kube-system/kube-dns: its Service owns the DNS address, queries go to its endpoints",
		"dns: answering again: no Service owns the DNS address any more",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log (-want +got):\n%s", diff)
	}
}

package main

import (
	"flag"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/service"
)

func parseRun(t *testing.T, args ...string) (*runFlags, error) {
	t.Helper()
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
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

// fakeResolved records the resolvectl commands and fails those asked to.
type fakeResolved struct {
	ran    []string
	fail   string // a command prefix that fails
	noTool bool
}

func (f *fakeResolved) resolved(active, hostNS bool) resolved {
	return resolved{
		lookPath: func(name string) (string, error) {
			if f.noTool {
				return "", io.EOF
			}
			return "/usr/bin/" + name, nil
		},
		run: func(name string, args ...string) ([]byte, error) {
			cmd := name + " " + strings.Join(args, " ")
			f.ran = append(f.ran, cmd)
			if f.fail != "" && strings.HasPrefix(cmd, f.fail) {
				return []byte("Failed to set DNS configuration: Access denied"), io.ErrUnexpectedEOF
			}
			return nil, nil
		},
		active:    func() bool { return active },
		hostNetNS: func() bool { return hostNS },
	}
}

// run registers cluster DNS with systemd-resolved when it can, and undoes
// it on exit; otherwise it logs the lines to add and runs nothing.
func TestConfigureHostDNS(t *testing.T) {
	h := hostDNS{tun: "userproxy0", ip: netip.MustParseAddr("10.96.0.10"), domain: "cluster.local", enabled: true}
	set := []string{"/usr/bin/resolvectl dns userproxy0 10.96.0.10", "/usr/bin/resolvectl domain userproxy0 ~cluster.local"}
	revert := "/usr/bin/resolvectl revert userproxy0"
	cases := []struct {
		name           string
		fake           fakeResolved
		active, hostNS bool
		disabled       bool
		wantRun        []string // at start
		wantAfter      []string // after the returned function
		wantManual     bool
	}{
		{name: "resolved", active: true, hostNS: true, wantRun: set, wantAfter: append(set[:2:2], revert)},
		{name: "--dns-host-config=false", active: true, hostNS: true, disabled: true, wantManual: true},
		{name: "another network namespace", active: true, hostNS: false, wantManual: true},
		{name: "resolved not running", active: false, hostNS: true, wantManual: true},
		{name: "no resolvectl", fake: fakeResolved{noTool: true}, active: true, hostNS: true, wantManual: true},
		{name: "dns refused", fake: fakeResolved{fail: "/usr/bin/resolvectl dns"}, active: true, hostNS: true,
			wantRun: set[:1], wantAfter: set[:1], wantManual: true},
		{name: "domain refused: the server is taken back", fake: fakeResolved{fail: "/usr/bin/resolvectl domain"}, active: true, hostNS: true,
			wantRun: append(set[:2:2], revert), wantAfter: append(set[:2:2], revert), wantManual: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			hc := h
			hc.enabled = !c.disabled
			undo := c.fake.resolved(c.active, c.hostNS).configure(hc, zap.New(core))
			if diff := cmp.Diff(c.wantRun, c.fake.ran); diff != "" {
				t.Errorf("commands at start (-want +got):\n%s", diff)
			}
			undo()
			if diff := cmp.Diff(c.wantAfter, c.fake.ran); diff != "" {
				t.Errorf("commands after undo (-want +got):\n%s", diff)
			}
			manual := logs.FilterMessageSnippet("add one of").All()
			if (len(manual) == 1) != c.wantManual {
				t.Fatalf("manual lines logged %d times, want %v", len(manual), c.wantManual)
			}
			if c.wantManual {
				text := strings.Join(toStrings(manual[0].ContextMap()["lines"]), "\n")
				for _, want := range []string{"resolvectl dns userproxy0 10.96.0.10", "server=/cluster.local/10.96.0.10", "nameserver 10.96.0.10", "search svc.cluster.local cluster.local"} {
					if !strings.Contains(text, want) {
						t.Errorf("the manual lines lack %q:\n%s", want, text)
					}
				}
			}
		})
	}
}

func toStrings(v any) []string {
	var out []string
	if vs, ok := v.([]any); ok {
		for _, s := range vs {
			out = append(out, s.(string))
		}
	}
	if vs, ok := v.([]string); ok {
		out = vs
	}
	return out
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

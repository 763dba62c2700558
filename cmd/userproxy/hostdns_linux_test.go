package main

import (
	"io"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

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

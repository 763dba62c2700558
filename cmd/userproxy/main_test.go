package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestDemoSplitsAndPrintsKubeProxyProbabilities(t *testing.T) {
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), []string{"demo", "--endpoints", "3", "--connections", "3000", "--seed", "42"}, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, errOut.String())
	}
	text := out.String()
	for _, want := range []string{"0.3333333333", "0.5000000000", "(last rule)"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	// The connection counts of the three rows add up to 3000.
	rows := regexp.MustCompile(`(?m)^\s*10\.244\.\S+\s+\S+(?: rule\))?\s+\S+\s+(\d+)\s`).FindAllStringSubmatch(text, -1)
	if len(rows) != 3 {
		t.Fatalf("found %d endpoint rows, want 3:\n%s", len(rows), text)
	}
	sum := 0
	for _, r := range rows {
		n, _ := strconv.Atoi(r[1])
		sum += n
	}
	if sum != 3000 {
		t.Errorf("rows sum to %d connections, want 3000:\n%s", sum, text)
	}
}

func TestDemoAffinityPinsClients(t *testing.T) {
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), []string{"demo", "--endpoints", "4", "--connections", "1000", "--clients", "10", "--affinity", "1h", "--seed", "7"}, &out, &errOut)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, errOut.String())
	}
	// Each of the 10 clients' first connection runs the lottery; the other
	// 990 are decided by affinity.
	if !strings.Contains(out.String(), "affinity decided 990 of 1000 connections") {
		t.Errorf("unexpected affinity count:\n%s", out.String())
	}
}

func TestBadArgumentsAreRefused(t *testing.T) {
	for _, args := range [][]string{
		{"demo", "--endpoints", "0"},
		{"demo", "--affinity", "25h"},
		{"demo", "--log-format", "xml"},
		{"nosuchcommand"},
		{},
		{"run", "--config", "a.yaml", "--kubeconfig", "k"},
		{"run", "--config", "a.yaml", "--mtu", "100"},
		{"run", "--config", "a.yaml", "--service-cidr", "10.96.0.1/12"},
		{"run", "--config", "a.yaml", "--service-cidr", "nonsense"},
		{"run", "--config", "a.yaml", "--tun-name", "a-name-longer-than-15"},
		{"run", "--config", "a.yaml", "--dial-timeout", "0s"},
		{"run", "--config", "a.yaml", "--scheduler", "fastest"},
		{"run", "--config", "a.yaml", "--scheduler", "rr", "--scheduler-flags", "mh-port"},
		{"run", "--config", "a.yaml", "extra"},
		{"run", "--config", "a.yaml", "--dial-via", "apiserver"},
		{"run", "--kubeconfig", "k", "--dial-via", "tunnel"},
		{"run", "--kubeconfig", "k", "--dial-direct-timeout", "10s"},
		{"run", "--kubeconfig", "k", "--apiserver-tunnel-idle", "0s"},
		{"setup"},
		{"conntrack"},
		{"conntrack", "purge"},
		{"rules", "--format", "xml", "--config", "a.yaml"},
		{"rules", "--nodeport-addresses", "primary", "--config", "a.yaml"},
		{"rules", "--nodeport-addresses", "10.0.0.0/8,nonsense", "--config", "a.yaml"},
		{"ipvs", "extra"},
		{"ipvs", "--stats=maybe"},
	} {
		var out, errOut bytes.Buffer
		if err := runMain(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}
}

// A bad config at start is refused with the file and the problem named,
// before any device is touched.
func TestRunRefusesBadConfig(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/bad.yaml"
	if err := os.WriteFile(path, []byte("apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {bogusField: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := runMain(context.Background(), []string{"run", "--config", path, "--admin-addr", ""}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "bogusField") {
		t.Fatalf("run with a bad config: %v", err)
	}
}

// rules --config prints kube-proxy's chains offline.
func TestRulesOffline(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := runMain(context.Background(), []string{"rules", "--config", "../../examples/quickstart.yaml", "--node-name", "n"}, &out, &errOut); err != nil {
		t.Fatalf("rules: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"*nat", "-j KUBE-SVC-", "--probability 0.33333333349", "--to-destination 127.0.0.3:8080", "COMMIT"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rules output lacks %q", want)
		}
	}
}

// rules --nodeport-addresses with loopback: one KUBE-SERVICES jump per
// local address the CIDR holds (127.0.0.1 on any host), and the
// localhost NodePort rule with --nfacct.
func TestRulesNodePortAddresses(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"rules", "--config", "../../examples/quickstart.yaml", "--node-name", "n", "--nodeport-addresses", "127.0.0.0/8", "--nfacct"}
	if err := runMain(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("rules: %v\n%s", err, errOut.String())
	}
	for _, want := range []string{"-A KUBE-SERVICES -d 127.0.0.1/32 -m comment", "-A KUBE-FIREWALL ", "--nfacct-name  ct_state_invalid_dropped_pkts"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("rules output lacks %q\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "--dst-type LOCAL -j KUBE-NODEPORTS") {
		t.Errorf("rules output has the match-all nodeports rule\n%s", out.String())
	}
}

// TestHelp: every command's --help goes to stdout and succeeds, with what
// the command does, examples and its flags; kube-proxy's too, with
// kube-proxy's flag names.
func TestHelp(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--help"}, []string{"Examples:", "\nConntrack:\n      --conntrack-max int", "--control-socket"}},
		{[]string{"run", "-help"}, []string{"\nObjects:\n      --config string"}},
		{[]string{"run", "-h"}, []string{"-service-cidr"}},
		{[]string{"setup", "--help"}, []string{"Examples:", "-user"}},
		{[]string{"conntrack", "flush", "--help"}, []string{"Examples:", "-control-socket"}},
		{[]string{"rules", "--help"}, []string{"Examples:"}},
		{[]string{"ipvs", "--help"}, []string{"Examples:"}},
		{[]string{"demo", "--help"}, []string{"Examples:"}},
		{[]string{"explain", "--help"}, []string{"Examples:", "--config", "--nodeport"}},
		{[]string{"kube-proxy", "--help"}, []string{"Examples:", "--hostname-override", "--ipvs-scheduler", "--conntrack-max-per-core", "--write-config-to"}},
		{[]string{"kube-proxy", "-h"}, []string{"--config string"}},
	} {
		var out, errOut bytes.Buffer
		if err := runMain(context.Background(), tt.args, &out, &errOut); err != nil {
			t.Errorf("%v: %v", tt.args, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%v: stdout lacks %q:\n%s", tt.args, w, out.String())
			}
		}
		if errOut.Len() != 0 {
			t.Errorf("%v: wrote to stderr: %s", tt.args, errOut.String())
		}
	}
}

// TestExitCodes: a usage error exits 2, any other failure 1 (main's
// exitCode); kube-proxy's --version answers and exits 0.
func TestExitCodes(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"nosuchcommand"}, 2},
		{[]string{"run", "--nosuchflag"}, 2},
		{[]string{"run", "services.yaml"}, 2},
		{[]string{"kube-proxy", "--nosuchflag"}, 2},
		{[]string{"kube-proxy", "extra"}, 2},
		{[]string{"kube-proxy", "--config", "/nonexistent/config.conf"}, 1},
		{[]string{"kube-proxy", "--proxy-mode", "userspace", "--write-config-to", "/dev/null"}, 1},
		{[]string{"run", "--config", "a.yaml", "--kubeconfig", "k"}, 1},
	} {
		var out, errOut bytes.Buffer
		err := runMain(context.Background(), tt.args, &out, &errOut)
		if err == nil || exitCode(err) != tt.code {
			t.Errorf("%v: %v, exit code %d; want %d", tt.args, err, exitCode(err), tt.code)
		}
	}
	var out, errOut bytes.Buffer
	if err := runMain(context.Background(), []string{"kube-proxy", "--version"}, &out, &errOut); err != nil || !strings.HasPrefix(out.String(), "Kubernetes v1.37.2 (userproxy ") {
		t.Errorf("kube-proxy --version: %v %q", err, out.String())
	}
	out.Reset()
	if err := runMain(context.Background(), []string{"version"}, &out, &errOut); err != nil || !strings.Contains(out.String(), "go1.") {
		t.Errorf("version: %v %q", err, out.String())
	}
}

package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
)

// TestHints: each start-up failure a user can fix names the cause, the
// flag and the fix, and exits 1 (not 2, a usage error's code).
func TestHints(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, taken := net.Listen("tcp", ln.Addr().String())
	if taken == nil {
		t.Fatal("a second listen on one address succeeded")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	run := func(args ...string) error {
		var out, errOut bytes.Buffer
		err := runMain(context.Background(), append([]string{"run", "--admin-addr", "", "--healthz-bind-address", ""}, args...), &out, &errOut)
		if err == nil {
			t.Fatalf("run %v succeeded", args)
		}
		if exitCode(err) != 1 {
			t.Errorf("run %v: exit code %d, want 1", args, exitCode(err))
		}
		return err
	}
	// A bad configuration is the first thing said, before the file limit.
	var logs, none bytes.Buffer
	if err := runMain(context.Background(), []string{"run", "--admin-addr", "", "--healthz-bind-address", "", "--config", "/nonexistent/services.yaml"}, &none, &logs); err == nil ||
		!strings.Contains(err.Error(), "/nonexistent/services.yaml") || strings.Contains(logs.String(), "open file limit") {
		t.Errorf("run with a missing --config: %v; logged before it:\n%s", err, logs.String())
	}
	var out, errOut bytes.Buffer
	if err := runMain(context.Background(), []string{"run", "services.yaml"}, &out, &errOut); err == nil ||
		exitCode(err) != 2 || !strings.Contains(err.Error(), "goes to --config FILE") {
		t.Errorf("run services.yaml: %v (exit %d), want a usage error pointing to --config FILE", err, exitCode(err))
	}
	for _, c := range []struct {
		name    string
		err     error
		want    []string
		notWant []string
	}{
		{"admin address taken", listenHint("--admin-addr", ln.Addr().String(), taken),
			[]string{"--admin-addr " + ln.Addr().String(), "address already in use", "another userproxy", "another --admin-addr"}, nil},
		{"TUN held", tunHint("userproxy0", false, &os.SyscallError{Syscall: "TUNSETIFF", Err: syscall.EBUSY}),
			[]string{"TUN device userproxy0", "device or resource busy", "another userproxy run", "another --tun-name"}, nil},
		{"TUN creation refused", tunHint("userproxy0", true, &os.PathError{Op: "open", Path: "/dev/net/tun", Err: syscall.EPERM}),
			[]string{"creating TUN device userproxy0", "run as root", "sudo userproxy setup --user $USER"}, nil},
		{"setup unprivileged", rootHint("setup", &os.PathError{Op: "chmod", Path: "/dev/net/tun", Err: syscall.EPERM}),
			[]string{"chmod /dev/net/tun: operation not permitted", "run it as root", "sudo userproxy setup"}, nil},
		{"run with no source, outside a cluster", run(),
			[]string{"neither --config nor --kubeconfig", "not a pod", "--config FILE", "--kubeconfig FILE"}, []string{"--dial-via"}},
		{"run with a missing kubeconfig", run("--kubeconfig", "/nonexistent/kubeconfig"),
			[]string{"--kubeconfig /nonexistent/kubeconfig", "no such file"}, []string{"--dial-via"}},
	} {
		msg := c.err.Error()
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q lacks %q", c.name, msg, w)
			}
		}
		for _, w := range c.notWant {
			if strings.Contains(msg, w) {
				t.Errorf("%s: %q blames %q", c.name, msg, w)
			}
		}
	}
}

//go:build linux

package integration

import (
	"os/exec"
	"strings"
	"testing"
)

// The README's first command: the quickstart runs the real binary in a
// namespace of its own, makes 1000 connections and must see every endpoint.
func TestQuickstart(t *testing.T) {
	requireRoot(t)
	cmd := exec.Command("go", "run", "./examples/quickstart")
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("quickstart: %v\n%s", err, out)
	}
	for _, want := range []string{"127.0.0.1:8080", "127.0.0.2:8080", "127.0.0.3:8080", "answered", "userproxy_flows_total{protocol=\"tcp\",result=\"proxied\"} 1000"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("quickstart output lacks %q:\n%s", want, out)
		}
	}
}

package main

import (
	"io"
	"testing"

	"github.com/spf13/pflag"

	"github.com/userproxy/userproxy/proxy"
)

// TestDialViaFlags: --dial-via's default follows the source; the direct
// attempt's bound is checked only where it applies (auto), so a short
// --dial-timeout still works with a file.
func TestDialViaFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want proxy.DialVia
	}{
		{[]string{"--config", "a.yaml"}, proxy.ViaDirect},
		{[]string{"--config", "a.yaml", "--dial-timeout", "500ms"}, proxy.ViaDirect},
		{[]string{"--kubeconfig", "k"}, proxy.ViaAuto},
		{[]string{"--kubeconfig", "k", "--dial-via", "apiserver", "--dial-timeout", "500ms"}, proxy.ViaAPIServer},
		{[]string{"--kubeconfig", "k", "--dial-via", "direct"}, proxy.ViaDirect},
		{[]string{"--kubeconfig", "k", "--dial-timeout", "3s", "--dial-direct-timeout", "300ms"}, proxy.ViaAuto},
	} {
		fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f runFlags
		f.register(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if err := f.validate(); err != nil || f.via != tc.want {
			t.Errorf("%v: via %v, %v; want %v", tc.args, f.via, err, tc.want)
		}
	}
}

package main

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestRunFlagsGrouped: every flag of run is in a group of its --help (a
// new flag without one would land under "Other flags").
func TestRunFlagsGrouped(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	var f runFlags
	f.register(fs)
	fs.VisitAll(func(fl *pflag.Flag) {
		if len(fl.Annotations[flagGroupAnnotation]) != 2 {
			t.Errorf("--%s has no group in run --help", fl.Name)
		}
	})
	if u := groupedUsages(fs); strings.Contains(u, "Other flags") {
		t.Errorf("run --help has ungrouped flags:\n%s", u)
	}
}

// TestSingleDashLongFlags: the flags userproxy took before pflag, spelt
// with one dash, still parse; one-letter runs that name no long flag stay
// an error, and nothing after "--" is rewritten.
func TestSingleDashLongFlags(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	var f runFlags
	f.register(fs)
	args := []string{"-config", "a.yaml", "-tun-name=up1", "--mtu", "1500", "-service-cidr", "10.43.0.0/16", "--", "-zone"}
	if _, err := parseArgs(fs, args, io.Discard, ""); err != nil {
		t.Fatal(err)
	}
	if f.config != "a.yaml" || f.tunName != "up1" || f.mtu != 1500 || f.serviceCIDRs.String() != "10.43.0.0/16" {
		t.Errorf("parsed config %q tun %q mtu %d cidrs %s", f.config, f.tunName, f.mtu, f.serviceCIDRs.String())
	}
	if got := fs.Args(); len(got) != 1 || got[0] != "-zone" {
		t.Errorf("arguments after --: %q", got)
	}
	fs = pflag.NewFlagSet("run", pflag.ContinueOnError)
	f.register(fs)
	if _, err := parseArgs(fs, []string{"-zzz"}, io.Discard, ""); err == nil || exitCode(err) != 2 {
		t.Errorf("-zzz: %v", err)
	}
}

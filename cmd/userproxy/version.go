package main

// The version: what -ldflags "-X main.version=..." stamped (make image), or
// what the Go toolchain recorded of the build (the module version, the
// commit and its time when built from a checkout with VCS stamping), and
// the Go version.

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// buildInfo is what the binary knows of its build.
type buildInfo struct {
	Version, Revision, Time, GoVersion string
	Modified                           bool
}

func readBuildInfo() buildInfo {
	b := buildInfo{Version: version, GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Modified = s.Value == "true"
		}
	}
	return b
}

// versionString is the version in one word or a few: "v1.2.3", or "dev
// (abc1234def56, 2026-12-07T06:00:00Z, modified)".
func versionString() string {
	b := readBuildInfo()
	var extra []string
	if b.Revision != "" {
		extra = append(extra, b.Revision[:min(12, len(b.Revision))])
	}
	if b.Time != "" {
		extra = append(extra, b.Time)
	}
	if b.Modified {
		extra = append(extra, "modified")
	}
	if len(extra) == 0 {
		return b.Version
	}
	return b.Version + " (" + strings.Join(extra, ", ") + ")"
}

//go:build !linux

package main

import (
	"runtime"

	"go.uber.org/zap"
)

// configureHostDNS logs the lines that make the host resolve the cluster
// domain through cluster DNS (on macOS, a file in /etc/resolver); run
// changes nothing on the host. The returned function does nothing.
func configureHostDNS(h hostDNS, logger *zap.Logger) func() {
	logger.Info("cluster DNS: to resolve *."+h.domain+" on this host, add",
		zap.Strings("lines", h.manualLines(runtime.GOOS)))
	return func() {}
}

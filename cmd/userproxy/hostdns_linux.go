package main

import (
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"

	"go.uber.org/zap"
)

// resolved drives systemd-resolved through resolvectl. Its fields are the
// outside world, injectable for tests.
type resolved struct {
	// lookPath finds resolvectl (exec.LookPath).
	lookPath func(string) (string, error)
	// run runs a command and returns its combined output.
	run func(name string, args ...string) ([]byte, error)
	// active reports whether systemd-resolved runs (its runtime directory
	// exists).
	active func() bool
	// hostNetNS reports whether the process is in the network namespace
	// of PID 1, where systemd-resolved sees the TUN; elsewhere (a test's
	// namespace, some containers) its interface index means another link.
	hostNetNS func() bool
}

func systemResolved() resolved {
	return resolved{
		lookPath: exec.LookPath,
		run:      func(name string, args ...string) ([]byte, error) { return exec.Command(name, args...).CombinedOutput() },
		active: func() bool {
			fi, err := os.Stat("/run/systemd/resolve")
			return err == nil && fi.IsDir()
		},
		hostNetNS: func() bool {
			self, err1 := os.Stat("/proc/self/ns/net")
			pid1, err2 := os.Stat("/proc/1/ns/net")
			if err1 != nil || err2 != nil {
				return false
			}
			a, ok1 := self.Sys().(*syscall.Stat_t)
			b, ok2 := pid1.Sys().(*syscall.Stat_t)
			return ok1 && ok2 && a.Ino == b.Ino && a.Dev == b.Dev
		},
	}
}

// configureHostDNS points systemd-resolved at cluster DNS for names in the
// cluster domain, on the TUN's link, and returns the function that undoes
// it; where it cannot, it logs the lines to add by hand and returns a no-op.
// It never edits /etc/resolv.conf.
func configureHostDNS(h hostDNS, logger *zap.Logger) func() {
	return systemResolved().configure(h, logger)
}

func (r resolved) configure(h hostDNS, logger *zap.Logger) func() {
	manual := func(why string) func() {
		logger.Info("cluster DNS: not registered with the host's resolver ("+why+"); to resolve *."+h.domain+" on this host, add one of",
			zap.Strings("lines", h.manualLines(runtime.GOOS)))
		return func() {}
	}
	switch {
	case !h.enabled:
		return manual("--dns-host-config=false")
	case !r.hostNetNS():
		return manual("not in the host's network namespace")
	case !r.active():
		return manual("systemd-resolved is not running")
	}
	tool, err := r.lookPath("resolvectl")
	if err != nil {
		return manual("resolvectl not found")
	}
	resolvectl := func(args ...string) error {
		out, err := r.run(tool, args...)
		if err != nil {
			return errors.New("resolvectl " + strings.Join(args, " ") + ": " + err.Error() + ": " + strings.TrimSpace(string(out)))
		}
		return nil
	}
	revert := func() {
		if err := resolvectl("revert", h.tun); err != nil {
			logger.Warn("cluster DNS: undoing the systemd-resolved settings of the TUN", zap.Error(err))
			return
		}
		logger.Info("cluster DNS: systemd-resolved settings of the TUN undone", zap.String("link", h.tun))
	}
	if err := resolvectl("dns", h.tun, h.ip.String()); err != nil {
		logger.Warn("cluster DNS: systemd-resolved refused the DNS server", zap.Error(err))
		return manual("resolvectl failed")
	}
	if err := resolvectl("domain", h.tun, "~"+h.domain); err != nil {
		logger.Warn("cluster DNS: systemd-resolved refused the routing domain", zap.Error(err))
		revert()
		return manual("resolvectl failed")
	}
	logger.Info("cluster DNS: registered with systemd-resolved", zap.String("link", h.tun),
		zap.Stringer("server", h.ip), zap.String("domain", "~"+h.domain))
	return revert
}

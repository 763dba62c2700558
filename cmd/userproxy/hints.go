package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// What a start-up failure the user can fix says: what is wrong, which
// flag it concerns, and what to do. Each is checked for its wording by
// TestHints.

// listenHint words a failed listen on addr, given by flag.
func listenHint(flag, addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%s %s: the address is taken (%w): another userproxy, or kube-proxy, is probably running on this host; "+
			"stop it, or give this one another %s (\"\" turns the server off)", flag, addr, err, flag)
	}
	if errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("%s %s: %w: a port below 1024 needs root or CAP_NET_BIND_SERVICE", flag, addr, err)
	}
	return fmt.Errorf("%s %s: %w", flag, addr, err)
}

// tunHint words a failed open of the TUN device name; created says run
// was about to create it.
func tunHint(name string, created bool, err error) error {
	switch {
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("TUN device %s: %w: another process holds it, probably another userproxy run; "+
			"stop it, or give this one another --tun-name", name, err)
	case created && (errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM)):
		return fmt.Errorf("creating TUN device %s: %w: run as root (or with CAP_NET_ADMIN), "+
			"or create the device once with `sudo userproxy setup --user $USER` and run without privileges", name, err)
	case errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM):
		return fmt.Errorf("opening TUN device %s: %w: it belongs to another user; run as root, or as its owner "+
			"(`ip -d link show %s` shows the owner; `sudo userproxy setup --remove --tun-name %s` removes it)", name, err, name, name)
	}
	return fmt.Errorf("TUN device %s: %w", name, err)
}

// rootHint words a failure of a command that needs root.
func rootHint(command string, err error) error {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM) {
		return fmt.Errorf("%s: %w: run it as root (sudo userproxy %s ...)", command, err, command)
	}
	return fmt.Errorf("%s: %w", command, err)
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// runSetup creates, once and as root, the persistent TUN device that lets
// `userproxy run` work without privileges; --remove deletes it.
func runSetup(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("setup", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	userName := fs.String("user", "", "user who will own the device and run userproxy (required unless --remove)")
	tunName := fs.String("tun-name", "userproxy0", "TUN device to create")
	mtu := fs.Int("mtu", defaultMTU, "MTU of the device")
	remove := fs.Bool("remove", false, "remove the device (and its routes) instead")
	runDir := fs.String("run-dir", "", "instead of a device, make this directory (mode 0700) for --user's control and handover sockets: a DaemonSet's hostPath, made ready by an init container")
	var cidrs prefixList
	cidrs.values = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	fs.Var(&cidrs, "service-cidr", "service CIDR routed into the device (repeatable)")
	var lf logFlags
	lf.register(fs)
	if help, err := parseArgs(fs, args, stdout, setupAbout); help || err != nil {
		return err
	}
	if !*remove && *userName == "" {
		return errors.New("setup: --user is required")
	}
	if *runDir != "" {
		if *remove {
			return usageErr(errors.New("setup: --run-dir and --remove exclude each other"))
		}
		if err := prepareRunDir(*runDir, *userName); err != nil {
			return fmt.Errorf("setup: %w", err)
		}
		fmt.Fprintf(stdout, "%s is ready for %s's sockets\n", *runDir, *userName)
		return nil
	}
	if *mtu < 1280 || *mtu > 65520 {
		return fmt.Errorf("--mtu %d: want 1280..65520", *mtu)
	}
	logger, err := lf.newLogger(stderr)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	if err := setupTUN(*tunName, *userName, *mtu, cidrs.values, *remove, logger); err != nil {
		return rootHint("setup", err)
	}
	if !*remove {
		fmt.Fprintf(stdout, "TUN device %s is ready for %s; now run, without sudo:\n  userproxy run --tun-name %s --config FILE\n", *tunName, *userName, *tunName)
	}
	return nil
}

// prepareRunDir makes dir, or takes it as it is, for the user of spec (a
// name, or uid[:gid]) alone: owned by it, mode 0700. The handover and
// control sockets go in it, and a DaemonSet's hostPath is made by the
// kubelet as root's.
func prepareRunDir(dir, spec string) error {
	uid, gid, err := lookupUser(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("--run-dir: %w", err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return fmt.Errorf("--run-dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return fmt.Errorf("--run-dir: %w", err)
	}
	return nil
}

// lookupUser resolves --user: uid[:gid] as numbers (an image without
// /etc/passwd has no names; the gid defaults to the uid), else a name.
func lookupUser(spec string) (uid, gid int, err error) {
	u, g, hasGID := strings.Cut(spec, ":")
	if n, err := strconv.ParseUint(u, 10, 31); err == nil {
		gid := n
		if hasGID {
			if gid, err = strconv.ParseUint(g, 10, 31); err != nil {
				return 0, 0, fmt.Errorf("--user %q: gid: %w", spec, err)
			}
		}
		return int(n), int(gid), nil
	}
	if hasGID {
		return 0, 0, fmt.Errorf("--user %q: want a name, or uid[:gid] as numbers", spec)
	}
	pw, err := user.Lookup(spec)
	if err != nil {
		return 0, 0, fmt.Errorf("--user %q: %w", spec, err)
	}
	uid64, err := strconv.ParseUint(pw.Uid, 10, 31)
	if err != nil {
		return 0, 0, fmt.Errorf("--user %q: uid %q: %w", spec, pw.Uid, err)
	}
	gid64, err := strconv.ParseUint(pw.Gid, 10, 31)
	if err != nil {
		return 0, 0, fmt.Errorf("--user %q: gid %q: %w", spec, pw.Gid, err)
	}
	return int(uid64), int(gid64), nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"

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

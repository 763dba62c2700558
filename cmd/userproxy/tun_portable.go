package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
)

// The portable path's routes: commands behind one interface, route(8) on
// macOS and ip(8) on Linux (--tun-portable), so that Linux runs the code
// macOS runs, but for the command itself.

// routeCommands add and remove a route into a device with a command. add
// reports errRouteExists for a route that is there already.
type routeCommands interface {
	add(dst netip.Prefix, dev string) error
	del(dst netip.Prefix, dev string) error
}

// runRouteCommand runs a route command; "File exists" (both tools' word
// for a route that is there) is errRouteExists.
func runRouteCommand(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err == nil {
		return nil
	}
	if strings.Contains(string(out), "File exists") {
		return errRouteExists
	}
	return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
}

// bsdArgs are route(8)'s family, kind and target for dst: a host route
// for a single address, a network route otherwise.
func bsdArgs(dst netip.Prefix) (family, kind, target string) {
	family = "-inet"
	if dst.Addr().Is6() {
		family = "-inet6"
	}
	if dst.IsSingleIP() {
		return family, "-host", dst.Addr().String()
	}
	return family, "-net", dst.String()
}

// ipRoute is ip(8), for the portable path on Linux.
type ipRoute struct{}

func (ipRoute) add(dst netip.Prefix, dev string) error {
	err := runRouteCommand("ip", "route", "add", dst.String(), "dev", dev)
	if err != nil && !errors.Is(err, errRouteExists) {
		// Without privilege the kernel refuses before it looks: a route
		// that is there already (`userproxy setup` made it) is fine.
		if out, serr := exec.Command("ip", "route", "show", "exact", dst.String(), "dev", dev).Output(); serr == nil && len(strings.TrimSpace(string(out))) > 0 {
			return errRouteExists
		}
	}
	return err
}

func (ipRoute) del(dst netip.Prefix, dev string) error {
	err := runRouteCommand("ip", "route", "del", dst.String(), "dev", dev)
	if err != nil && (strings.Contains(err.Error(), "No such process") || strings.Contains(err.Error(), "Cannot find device")) {
		return nil // gone already, with its device
	}
	return err
}

// routeCmds is routeOps through routeCommands, for one device.
type routeCmds struct {
	dev  string
	cmds routeCommands
}

func (r routeCmds) add(dst netip.Prefix) error { return r.cmds.add(dst, r.dev) }
func (r routeCmds) del(dst netip.Prefix) error { return r.cmds.del(dst, r.dev) }

//go:build !linux

package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/netstack"
)

// tunDevice is the TUN the proxy reads (macOS: a utun device the system
// names), and the routes run added.
type tunDevice struct {
	link   *netstack.Link
	name   string
	routes []netip.Prefix
	logger *zap.Logger
}

// openTUN opens a utun device and routes cidrs into it with route(8). This
// path compiles and is meant for macOS; it is not tested in CI.
func openTUN(name string, mtu int, offload bool, cidrs []netip.Prefix, logger *zap.Logger) (*tunDevice, error) {
	link, err := netstack.OpenTUN(netstack.TUNOptions{Name: name, MTU: uint32(mtu)})
	if err != nil {
		return nil, err
	}
	d := &tunDevice{link: link, name: link.Name(), logger: logger}
	for _, p := range cidrs {
		family := "-inet"
		if p.Addr().Is6() {
			family = "-inet6"
		}
		out, err := exec.Command("route", "-n", "add", family, "-net", p.String(), "-interface", d.name).CombinedOutput()
		if err != nil {
			d.close()
			return nil, fmt.Errorf("route add %s -interface %s: %v: %s", p, d.name, err, out)
		}
		d.routes = append(d.routes, p)
	}
	return d, nil
}

func (d *tunDevice) close() {
	for _, p := range d.routes {
		if out, err := exec.Command("route", "-n", "delete", "-net", p.String()).CombinedOutput(); err != nil {
			d.logger.Warn("removing route", zap.Stringer("cidr", p), zap.Error(err), zap.ByteString("output", out))
		}
	}
	d.routes = nil
}

func setupTUN(name, userName string, mtu int, cidrs []netip.Prefix, remove bool, logger *zap.Logger) error {
	return errors.New("userproxy setup: persistent TUN devices are a Linux feature")
}

// routeCmds adds and removes host routes into the device with route(8)
// (routeOps). Not tested in CI, like the rest of this path.
type routeCmds struct{ dev string }

// hostRoutes returns the device's routeOps for external addresses.
func (d *tunDevice) hostRoutes() (routeOps, error) { return routeCmds{dev: d.name}, nil }

func (r routeCmds) add(dst netip.Prefix) error {
	family := "-inet"
	if dst.Addr().Is6() {
		family = "-inet6"
	}
	out, err := exec.Command("route", "-n", "add", family, "-host", dst.Addr().String(), "-interface", r.dev).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "File exists") {
			return errRouteExists
		}
		return fmt.Errorf("route add %s -interface %s: %v: %s", dst.Addr(), r.dev, err, out)
	}
	return nil
}

func (r routeCmds) del(dst netip.Prefix) error {
	out, err := exec.Command("route", "-n", "delete", "-host", dst.Addr().String()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("route delete %s: %v: %s", dst.Addr(), err, out)
	}
	return nil
}

// primaryAddrs is not available here: give --nodeport-addresses CIDRs.
func primaryAddrs() ([]netip.Addr, error) {
	return nil, errors.New("\"primary\" is resolved on Linux only; give CIDRs")
}

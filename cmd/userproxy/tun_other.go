//go:build !linux

package main

import (
	"errors"
	"net/netip"

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
	// handedOver is never set here (handover_other.go).
	handedOver bool
}

// openTUN opens a utun device (the portable path, the only one here) and
// routes cidrs into it with route(8). This path runs on Linux too
// (--tun-portable, tun_linux.go), with ip(8) in place of route(8); on macOS
// itself it is not tested in CI.
func openTUN(c tunConfig, cidrs []netip.Prefix, logger *zap.Logger) (*tunDevice, error) {
	link, err := netstack.OpenTUN(netstack.TUNOptions{Name: c.name, MTU: uint32(c.mtu), Portable: true})
	if err != nil {
		return nil, err
	}
	d := &tunDevice{link: link, name: link.Name(), logger: logger}
	for _, p := range cidrs {
		if err := (bsdRoute{}).add(p, d.name); err != nil {
			d.close()
			return nil, err
		}
		d.routes = append(d.routes, p)
	}
	return d, nil
}

func (d *tunDevice) close() {
	for _, p := range d.routes {
		if err := (bsdRoute{}).del(p, d.name); err != nil {
			d.logger.Warn("removing route", zap.Stringer("cidr", p), zap.Error(err))
		}
	}
	d.routes = nil
}

func setupTUN(name, userName string, mtu int, cidrs []netip.Prefix, remove bool, logger *zap.Logger) error {
	return errors.New("userproxy setup: persistent TUN devices are a Linux feature")
}

// hostRoutes returns the device's routeOps for external addresses.
func (d *tunDevice) hostRoutes() (routeOps, error) {
	return routeCmds{dev: d.name, cmds: bsdRoute{}}, nil
}

// primaryAddrs is not available here: give --nodeport-addresses CIDRs.
func primaryAddrs() ([]netip.Addr, error) {
	return nil, errors.New("\"primary\" is resolved on Linux only; give CIDRs")
}

// bsdRoute is route(8), as on macOS.
type bsdRoute struct{}

func (bsdRoute) add(dst netip.Prefix, dev string) error {
	family, kind, target := bsdArgs(dst)
	return runRouteCommand("route", "-n", "add", family, kind, target, "-interface", dev)
}

func (bsdRoute) del(dst netip.Prefix, _ string) error {
	family, kind, target := bsdArgs(dst)
	return runRouteCommand("route", "-n", "delete", family, kind, target)
}

//go:build !linux

package netstack

import "github.com/songgao/water"

// OpenTUN opens a TUN device the portable way, the only one here
// (tun_portable.go).
func OpenTUN(opts TUNOptions) (*Link, error) { return openPortableTUN(opts) }

// portableConfig is water's configuration: the system names the device.
func portableConfig(TUNOptions) water.Config { return water.Config{DeviceType: water.TUN} }

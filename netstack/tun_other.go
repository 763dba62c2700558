//go:build !linux

package netstack

import (
	"fmt"

	"github.com/songgao/water"
)

// OpenTUN opens a TUN device with water and pumps it with NewDeviceLink's two
// goroutines. On macOS the system names the device (utunN); Link.Name tells
// which.
func OpenTUN(opts TUNOptions) (*Link, error) {
	ifce, err := water.New(water.Config{DeviceType: water.TUN})
	if err != nil {
		return nil, fmt.Errorf("opening a TUN device: %w", err)
	}
	return NewDeviceLink(ifce, ifce.Name(), opts.MTU), nil
}

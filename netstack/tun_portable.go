package netstack

import (
	"fmt"

	"github.com/songgao/water"
)

// openPortableTUN opens a TUN device with water and pumps it with
// NewDeviceLink's two goroutines (TUNOptions.Portable). On macOS the
// system names the device (utunN); Link.Name tells which.
func openPortableTUN(opts TUNOptions) (*Link, error) {
	if opts.MTU == 0 {
		opts.MTU = DefaultMTU
	}
	ifce, err := water.New(portableConfig(opts))
	if err != nil {
		return nil, fmt.Errorf("opening a TUN device: %w", err)
	}
	return NewDeviceLink(ifce, ifce.Name(), opts.MTU), nil
}

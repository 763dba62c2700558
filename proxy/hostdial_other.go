//go:build !linux

package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
)

// dialHost connects to ep from the host, within ctx: net's dial with the
// default dialer (hostdial_linux.go has the Linux one).
func dialHost(ctx context.Context, ep netip.AddrPort) (net.Conn, error) {
	return defaultDialer.DialContext(ctx, "tcp", ep.String())
}

// TranslateSupported reports that translated TCP flows need Linux
// (hostdial_linux.go).
func TranslateSupported() error { return errors.New("translated TCP flows need Linux") }

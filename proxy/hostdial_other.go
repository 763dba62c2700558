//go:build !linux

package proxy

import (
	"context"
	"net"
	"net/netip"
)

// dialHost connects to ep from the host, within ctx: net's dial with the
// default dialer (hostdial_linux.go has the Linux one).
func dialHost(ctx context.Context, ep netip.AddrPort) (net.Conn, error) {
	return defaultDialer.DialContext(ctx, "tcp", ep.String())
}

//go:build !linux

package proxy

import (
	"context"
	"net"
	"net/netip"
	"time"
)

var hostDialer = net.Dialer{KeepAlive: 15 * time.Second}

// dialHost connects to ep from the host, within ctx: net's dial, with
// net.Dialer's default keep-alive (hostdial_linux.go has the Linux one).
func dialHost(ctx context.Context, ep netip.AddrPort) (net.Conn, error) {
	return hostDialer.DialContext(ctx, "tcp", ep.String())
}

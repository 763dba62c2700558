//go:build !linux

package main

// Handover moves a TUN's queues and flows' sockets with Linux's
// SCM_RIGHTS; elsewhere --take-over is refused and no socket is served.

import (
	"errors"
	"net"
	"net/netip"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

type takeover struct{ committed bool }

func takeOver(string, *zap.Logger) (*takeover, error) {
	return nil, errors.New("--take-over: handing a proxy over needs Linux")
}

func (*takeover) fail(error) {}

func adoptTUN(*takeover, string, []netip.Prefix, *zap.Logger) (*tunDevice, error) {
	return nil, errors.New("handing a proxy over needs Linux")
}

func adoptFlows(*takeover, *tunDevice, *netstack.Stack, *proxy.Proxy, *handoverStats, *zap.Logger) error {
	return errors.New("handing a proxy over needs Linux")
}

type handoverServer struct{}

func listenHandover(string, *netstack.Stack, *tunDevice, *proxy.Proxy, listenerLender, *handoverStats, *zap.Logger) *handoverServer {
	return nil
}

func (*handoverServer) Done() <-chan struct{} { return nil }
func (*handoverServer) Close()                {}

func inheritListeners(*takeover, *proxy.NodePorts, *service.Table, string) net.Listener { return nil }

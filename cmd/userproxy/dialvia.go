package main

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/source/kube"
)

// dialVia resolves --dial-via: empty means auto with a cluster source and
// direct with --config (a file names no API server to go through).
func (f *runFlags) dialVia() (proxy.DialVia, error) {
	if f.dialViaName == "" {
		if f.config != "" {
			return proxy.ViaDirect, nil
		}
		return proxy.ViaAuto, nil
	}
	v, err := proxy.ParseDialVia(f.dialViaName)
	if err != nil {
		return 0, fmt.Errorf("--dial-via: %w", err)
	}
	if v != proxy.ViaDirect && f.config != "" {
		return 0, fmt.Errorf("--dial-via %s needs an API server (--kubeconfig or in cluster), not --config", v)
	}
	return v, nil
}

// newPortForwarder returns the API server's port-forward dialer for a
// policy that may use it, else nil.
func newPortForwarder(f *runFlags, via proxy.DialVia, logger *zap.Logger) (*kube.PortForwarder, error) {
	if via == proxy.ViaDirect {
		return nil, nil
	}
	cfg, err := kube.RESTConfig(f.kubeconfig)
	if err != nil {
		return nil, err // the source's configuration: named as such
	}
	return kube.NewPortForwarder(kube.PortForwardConfig{REST: cfg, Idle: f.tunnelIdle, Logger: logger})
}

// dialView is /debug/dial's content.
func dialView(via proxy.DialVia, px *proxy.Proxy, pf *kube.PortForwarder) func() admin.DialView {
	return func() admin.DialView {
		v := admin.DialView{Via: via.String(), Remembered: px.RememberedWays()}
		if pf != nil {
			v.Tunnels = pf.Tunnels()
		}
		return v
	}
}

var errDialDirectTimeout = errors.New("--dial-via auto: --dial-direct-timeout must be positive and below --dial-timeout")

//go:build !linux

package main

import (
	"errors"
	"net/netip"
)

// noProbe finds nothing: the conflicts it looks for are Linux's.
type noProbe struct{}

func (noProbe) kubeProxyRules() string                         { return "" }
func (noProbe) localClusterIPs([]netip.Prefix) string          { return "" }
func (noProbe) serviceCIDRRoute([]netip.Prefix, string) string { return "" }

func newHostProbe() hostProbe { return noProbe{} }

func cleanupKubeProxy() ([]string, error) {
	return nil, errors.New("kube-proxy's leftovers are Linux's: nothing to clean up here")
}

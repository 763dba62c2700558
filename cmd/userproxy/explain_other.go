//go:build !linux

package main

import "net/netip"

// describeRoute says nothing of the route off Linux (route(8) has no
// programmatic lookup here); the client stays as given.
func describeRoute(_ netip.Addr, _, client string) (string, string) { return "", client }

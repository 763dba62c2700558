//go:build !linux

package integration

import (
	"net"
	"testing"
)

// tunEnv needs Linux network namespaces; elsewhere it skips.
type tunEnv struct{}

func (tunEnv) start(t testing.TB, seed uint64) (*rig, client) {
	t.Skip("TUN scenarios need Linux")
	return nil, nil
}

func kernelPath(b *testing.B, serve func(net.Conn)) func() (net.Conn, error) {
	b.Skip("the kernel path needs Linux network namespaces")
	return nil
}

// removeBuiltBinaries: no binary is built here.
func removeBuiltBinaries() {}

//go:build !linux

package integration

import "testing"

// tunEnv needs Linux network namespaces; elsewhere it skips.
type tunEnv struct{}

func (tunEnv) start(t testing.TB, seed uint64) (*rig, client) {
	t.Skip("TUN scenarios need Linux")
	return nil, nil
}

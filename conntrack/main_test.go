package conntrack

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// seedEnv names the environment variable that overrides the seed of every
// randomised test, to reproduce a failure.
const seedEnv = "CONNTRACK_TEST_SEED"

// testRand returns a generator seeded from $CONNTRACK_TEST_SEED or a fixed
// default, and logs the seed.
func testRand(t testing.TB) *rand.Rand {
	t.Helper()
	seed := uint64(20240601)
	if s := os.Getenv(seedEnv); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		seed = v
	}
	t.Logf("seed %d (set %s to override)", seed, seedEnv)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// newTestTable builds a table on a manual clock; mod adjusts the config.
func newTestTable(t testing.TB, mod func(*Config)) (*Table, *ManualClock) {
	t.Helper()
	clk := NewManualClock(int64(1000 * time.Hour))
	cfg := Config{Clock: clk, Shards: 4}
	if mod != nil {
		mod(&cfg)
	}
	tab, err := NewTable(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tab, clk
}

// newRand returns a generator for a seed drawn from testRand, for goroutines
// that need their own.
func newRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, ^seed))
}

package balancer

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

// testSeed returns the seed for a randomised test: USERPROXY_SEED when set (to
// repeat a failure), else def. It is logged either way.
func testSeed(t testing.TB, def uint64) uint64 {
	t.Helper()
	seed := def
	if s := os.Getenv("USERPROXY_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 0, 64)
		if err != nil {
			t.Fatalf("USERPROXY_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (set USERPROXY_SEED to repeat)", seed)
	return seed
}

// scripted is a Source that returns the given values in order and fails the
// test when it runs out.
type scripted struct {
	t    testing.TB
	vals []uint32
}

func (s *scripted) Uint32() uint32 {
	if len(s.vals) == 0 {
		s.t.Fatal("scripted source exhausted: more rules evaluated than expected")
	}
	v := s.vals[0]
	s.vals = s.vals[1:]
	return v
}

// manualClock is a Clock that moves only when told.
type manualClock struct{ now time.Time }

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time          { return c.now }
func (c *manualClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

// pcg is an unlocked seeded Source for single-goroutine tests, where
// LockedSource's mutex would only slow the race detector down.
type pcg struct{ r *rand.PCG }

func newPCG(seed uint64) pcg { return pcg{rand.NewPCG(seed, seed^0x9E3779B97F4A7C15)} }

func (p pcg) Uint32() uint32 { return uint32(p.r.Uint64() >> 32) }

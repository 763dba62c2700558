package balancer

import (
	"math/rand/v2"
	"sync"
)

// RuntimeSource draws from the Go runtime's per-thread ChaCha8 generator
// (math/rand/v2's top-level functions). It is safe for concurrent use, takes
// no lock, and is the production Source.
type RuntimeSource struct{}

var _ Source64 = RuntimeSource{}

// Uint32 returns a uniformly distributed value.
func (RuntimeSource) Uint32() uint32 { return rand.Uint32() }

// Uint64 returns a uniformly distributed value.
func (RuntimeSource) Uint64() uint64 { return rand.Uint64() }

// LockedSource makes a math/rand/v2 Source safe for concurrent use. Tests use
// it with a fixed seed so that a run can be repeated.
type LockedSource struct {
	mu  sync.Mutex
	src rand.Source
}

var _ Source = (*LockedSource)(nil)

// NewSeededSource returns a deterministic, concurrency-safe Source seeded with
// seed (a PCG generator).
func NewSeededSource(seed uint64) *LockedSource {
	return &LockedSource{src: rand.NewPCG(seed, seed^0x9E3779B97F4A7C15)}
}

// Uint32 returns the high 32 bits of the next 64-bit value.
func (s *LockedSource) Uint32() uint32 {
	s.mu.Lock()
	v := s.src.Uint64()
	s.mu.Unlock()
	return uint32(v >> 32)
}

package conntrack

import (
	"sync/atomic"
	"time"
)

// Clock is the table's only source of time. Now returns nanoseconds on a
// monotonic scale with an arbitrary origin: only differences between readings
// matter. Implementations must be safe for concurrent use and must never go
// backwards.
//
// The table reads the clock once per Classify, Confirm and Sweep call, so the
// cost of Now is on the per-packet path.
type Clock interface {
	Now() int64
}

// SystemClock reads the runtime's monotonic clock. Build it with
// NewSystemClock; the zero value is not usable.
type SystemClock struct {
	origin time.Time
}

var _ Clock = (*SystemClock)(nil)

// NewSystemClock returns a SystemClock whose origin is now.
func NewSystemClock() *SystemClock { return &SystemClock{origin: time.Now()} }

// Now returns the monotonic time since the clock was made.
func (c *SystemClock) Now() int64 { return int64(time.Since(c.origin)) }

// CoarseClock is a cheap clock for the packet path: Now returns the reading
// taken by the last Tick, the way the kernel's conntrack reads jiffies. The
// owner must call Tick periodically (every 10 ms gives kernel HZ=100
// precision, far finer than any conntrack timeout); this package starts no
// goroutine to do it. Build it with NewCoarseClock.
type CoarseClock struct {
	origin time.Time
	now    atomic.Int64
}

var _ Clock = (*CoarseClock)(nil)

// NewCoarseClock returns a CoarseClock reading zero.
func NewCoarseClock() *CoarseClock { return &CoarseClock{origin: time.Now()} }

// Tick reads the monotonic clock, stores the reading and returns the
// clock's value. Concurrent Ticks never move the clock backwards.
func (c *CoarseClock) Tick() int64 {
	v := int64(time.Since(c.origin))
	for {
		old := c.now.Load()
		if v <= old {
			return old
		}
		if c.now.CompareAndSwap(old, v) {
			return v
		}
	}
}

// Now returns the reading of the last Tick.
func (c *CoarseClock) Now() int64 { return c.now.Load() }

// ManualClock is a clock for tests: it moves only when told to. It is safe
// for concurrent use.
type ManualClock struct {
	now atomic.Int64
}

var _ Clock = (*ManualClock)(nil)

// NewManualClock returns a ManualClock reading start nanoseconds.
func NewManualClock(start int64) *ManualClock {
	c := &ManualClock{}
	c.now.Store(start)
	return c
}

// Now returns the current reading.
func (c *ManualClock) Now() int64 { return c.now.Load() }

// Advance moves the clock forward by d; a negative d is ignored, since a
// Clock must never go backwards.
func (c *ManualClock) Advance(d time.Duration) {
	if d > 0 {
		c.now.Add(int64(d))
	}
}

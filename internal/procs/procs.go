package procs

import (
	"context"
	"runtime"
	"runtime/metrics"
	"time"
)

// Config configures Run. Zero fields take the defaults given.
type Config struct {
	// Max is the Ps under load; 0 means runtime.GOMAXPROCS(0) at the call.
	Max int
	// Every is the sampling period (10 ms).
	Every time.Duration
	// Window is the samples per decision at one P (10).
	Window int
	// Busy is the mean count of runnable goroutines, at one P, that calls
	// for Max Ps (4).
	Busy float64
	// Slow and SlowShare: a window in which at least SlowShare of the
	// goroutines that became runnable waited Slow or longer for the P
	// calls for Max Ps too (1 ms, 0.05): one goroutine computing for long
	// (a big table build) makes the others wait out the runtime's 10 ms
	// preemption slices while the queue stays short.
	Slow      time.Duration
	SlowShare float64
	// Hold is how long Max Ps stay before one P is tried again (2 s). A
	// try that goes back to Max at its first window doubles it, up to
	// MaxHold (32 s); a window at one P that stays resets it.
	Hold, MaxHold time.Duration
	// Runnable samples the goroutines queued for a P; nil reads
	// runtime/metrics' /sched/goroutines/runnable:goroutines.
	Runnable func() uint64
	// Waits returns the cumulative counts of goroutines that waited for a
	// P at least slow, and of all that were measured; nil reads
	// /sched/latencies:seconds.
	Waits func(slow time.Duration) (slowCount, all uint64)
	// Set sets the Ps; nil means runtime.GOMAXPROCS, and at the end
	// runtime.SetDefaultGOMAXPROCS.
	Set func(n int)
	// Ticks drives the sampling; nil means a ticker of Every.
	Ticks <-chan time.Time
	// Changed, when set, is called after each change of the Ps.
	Changed func(procs int)

	ticked func() // tests: called when a tick is handled
}

// Run sets the Ps by load until ctx is done (steps 1-4 of doc.go). With
// Max 1 it only waits.
func Run(ctx context.Context, cfg Config) {
	cfg.defaults()
	if cfg.Max == 1 {
		<-ctx.Done()
		return
	}
	restore := func() int { runtime.SetDefaultGOMAXPROCS(); return runtime.GOMAXPROCS(0) }
	if cfg.Set == nil {
		cfg.Set = func(n int) { runtime.GOMAXPROCS(n) }
	} else {
		restore = func() int { cfg.Set(cfg.Max); return cfg.Max }
	}
	if cfg.Ticks == nil {
		t := time.NewTicker(cfg.Every)
		defer t.Stop()
		cfg.Ticks = t.C
	}
	g := governor{cfg: cfg, hold: cfg.Hold}
	g.set(1) // 1
	g.startWindow()
	for {
		select {
		case <-ctx.Done():
			n := restore() // 4
			if cfg.Changed != nil {
				cfg.Changed(n)
			}
			return
		case <-cfg.Ticks:
		}
		g.tick()
		if cfg.ticked != nil {
			cfg.ticked()
		}
	}
}

func (cfg *Config) defaults() {
	if cfg.Max <= 0 {
		cfg.Max = runtime.GOMAXPROCS(0)
	}
	if cfg.Every <= 0 {
		cfg.Every = 10 * time.Millisecond
	}
	if cfg.Window <= 0 {
		cfg.Window = 10
	}
	if cfg.Busy <= 0 {
		cfg.Busy = 4
	}
	if cfg.Slow <= 0 {
		cfg.Slow = time.Millisecond
	}
	if cfg.SlowShare <= 0 {
		cfg.SlowShare = 0.05
	}
	if cfg.Hold <= 0 {
		cfg.Hold = 2 * time.Second
	}
	if cfg.MaxHold < cfg.Hold {
		cfg.MaxHold = max(cfg.Hold, 32*time.Second)
	}
	if cfg.Runnable == nil {
		cfg.Runnable = runnable()
	}
	if cfg.Waits == nil {
		cfg.Waits = waits()
	}
}

// governor is Run's state.
type governor struct {
	cfg     Config
	procs   int
	sum     uint64 // runnable goroutines summed over the window's samples
	samples int
	slow0   uint64 // Waits at the window's start
	all0    uint64
	trying  bool          // this window follows a drop from Max (step 3)
	hold    time.Duration // the current hold at Max
	held    int           // ticks at Max
}

func (g *governor) set(n int) {
	g.procs = n
	g.cfg.Set(n)
	if g.cfg.Changed != nil {
		g.cfg.Changed(n)
	}
}

func (g *governor) startWindow() {
	g.sum, g.samples = 0, 0
	g.slow0, g.all0 = g.cfg.Waits(g.cfg.Slow)
}

func (g *governor) tick() {
	if g.procs != 1 {
		if g.held++; g.held >= max(1, int(g.hold/g.cfg.Every)) { // 3
			g.trying = true
			g.set(1)
			g.startWindow()
		}
		return
	}
	g.sum += g.cfg.Runnable()
	if g.samples++; g.samples < g.cfg.Window {
		return
	}
	slow, all := g.cfg.Waits(g.cfg.Slow)
	slow, all = slow-g.slow0, all-g.all0
	busy := float64(g.sum)/float64(g.samples) >= g.cfg.Busy ||
		(all > 0 && float64(slow) >= g.cfg.SlowShare*float64(all))
	if busy && g.trying {
		g.hold = min(2*g.hold, g.cfg.MaxHold)
	} else {
		g.hold = g.cfg.Hold
	}
	g.trying = false
	if busy { // 2
		g.held = 0
		g.set(g.cfg.Max)
		return
	}
	g.startWindow()
}

// runnable returns a reader of the runtime's count of runnable goroutines.
func runnable() func() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines/runnable:goroutines"}}
	return func() uint64 {
		metrics.Read(s)
		if s[0].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return s[0].Value.Uint64()
	}
}

// waits returns a reader of the runtime's histogram of the time goroutines
// waited for a P: the counts at or above slow (whole buckets from the first
// whose lower bound reaches it), and in all.
func waits() func(slow time.Duration) (uint64, uint64) {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	return func(slow time.Duration) (uint64, uint64) {
		metrics.Read(s)
		if s[0].Value.Kind() != metrics.KindFloat64Histogram {
			return 0, 0
		}
		h := s[0].Value.Float64Histogram()
		var slowCount, all uint64
		for i, c := range h.Counts {
			all += c
			if h.Buckets[i] >= slow.Seconds() {
				slowCount += c
			}
		}
		return slowCount, all
	}
}

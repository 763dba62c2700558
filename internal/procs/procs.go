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
	// Hold is how long Max Ps stay before one P is tried again (2 s).
	Hold time.Duration
	// Runnable samples the goroutines queued for a P; nil reads
	// runtime/metrics' /sched/goroutines/runnable:goroutines.
	Runnable func() uint64
	// Set sets the Ps; nil means runtime.GOMAXPROCS.
	Set func(n int)
	// Ticks drives the sampling; nil means a ticker of Every.
	Ticks <-chan time.Time
	// Changed, when set, is called after each change of the Ps.
	Changed func(procs int)
}

// Run sets the Ps by load until ctx is done (steps 1-4). With Max 1 it
// only waits.
func Run(ctx context.Context, cfg Config) {
	if cfg.Max <= 0 {
		cfg.Max = runtime.GOMAXPROCS(0)
	}
	if cfg.Max == 1 {
		<-ctx.Done()
		return
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
	if cfg.Hold <= 0 {
		cfg.Hold = 2 * time.Second
	}
	if cfg.Runnable == nil {
		cfg.Runnable = runnable()
	}
	if cfg.Set == nil {
		cfg.Set = func(n int) { runtime.GOMAXPROCS(n) }
	}
	if cfg.Ticks == nil {
		t := time.NewTicker(cfg.Every)
		defer t.Stop()
		cfg.Ticks = t.C
	}
	holdTicks := max(1, int(cfg.Hold/cfg.Every))
	set := func(n int) {
		cfg.Set(n)
		if cfg.Changed != nil {
			cfg.Changed(n)
		}
	}
	set(1) // 1
	procs, sum, samples, held := 1, uint64(0), 0, 0
	for {
		select {
		case <-ctx.Done():
			set(cfg.Max) // 4
			return
		case <-cfg.Ticks:
		}
		if procs == 1 {
			sum += cfg.Runnable()
			if samples++; samples < cfg.Window {
				continue
			}
			if float64(sum)/float64(samples) >= cfg.Busy { // 2
				procs, held = cfg.Max, 0
				set(procs)
			}
			sum, samples = 0, 0
			continue
		}
		if held++; held >= holdTicks { // 3
			procs = 1
			set(procs)
		}
	}
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

package procs

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// driver runs Run on fake ticks, a fake queue and fake wait counts, one
// tick at a time: tick returns once Run has handled the tick, so every Set
// it caused is in set.
type driver struct {
	t     *testing.T
	ticks chan time.Time
	mu    sync.Mutex
	queue uint64 // what Runnable returns
	slow  uint64 // what Waits returns: cumulative counts
	all   uint64
	set   chan int
	acks  chan struct{}
	ready chan struct{} // closed at Run's first Waits: its window's start
	stop  func()
}

func start(t *testing.T, cfg Config) *driver {
	d := &driver{t: t, ticks: make(chan time.Time), set: make(chan int, 100), acks: make(chan struct{}), ready: make(chan struct{})}
	cfg.Ticks = d.ticks
	cfg.ticked = func() { d.acks <- struct{}{} }
	cfg.Runnable = func() uint64 { d.mu.Lock(); defer d.mu.Unlock(); return d.queue }
	var once sync.Once
	cfg.Waits = func(time.Duration) (uint64, uint64) {
		d.mu.Lock()
		defer d.mu.Unlock()
		once.Do(func() { close(d.ready) })
		return d.slow, d.all
	}
	cfg.Set = func(n int) { d.set <- n }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Run(ctx, cfg); close(done) }()
	d.stop = func() { cancel(); <-done }
	d.expect(1) // starts at one P
	// The first tick's counts must come after Run read the first window's
	// start (CI once saw them before it: the window then held 300 wake-ups,
	// not 400, and 19 slow were over 5%).
	select {
	case <-d.ready:
	case <-time.After(5 * time.Second):
		t.Fatal("Run never read the wait counts")
	}
	return d
}

// tick sends n ticks with the queue at queue and 100 more wake-ups
// measured, slow of them slow.
func (d *driver) tick(n int, queue, slow uint64) {
	for range n {
		d.mu.Lock()
		d.queue = queue
		d.all += 100
		d.slow += slow
		d.mu.Unlock()
		d.ticks <- time.Time{}
		<-d.acks
	}
}

// expect checks the next change of the Ps.
func (d *driver) expect(procs int) {
	d.t.Helper()
	select {
	case got := <-d.set:
		if got != procs {
			d.t.Fatalf("set %d Ps, want %d", got, procs)
		}
	case <-time.After(5 * time.Second):
		d.t.Fatalf("no change to %d Ps", procs)
	}
}

// none checks that the ticks so far changed nothing more.
func (d *driver) none() {
	d.t.Helper()
	select {
	case got := <-d.set:
		d.t.Fatalf("set %d Ps, want no change", got)
	default:
	}
}

func TestBusyQueueAddsPs(t *testing.T) {
	d := start(t, Config{Max: 4, Every: 10 * time.Millisecond, Window: 5, Busy: 4})
	defer d.stop()
	d.tick(5, 3, 0) // a window at a mean of 3: one P is enough
	d.none()
	d.tick(4, 4, 0) // four samples of the next: not yet a window
	d.none()
	d.tick(1, 4, 0)
	d.expect(4) // the fifth ends it at the mean of Busy
}

func TestSlowWaitsAddPs(t *testing.T) {
	d := start(t, Config{Max: 2, Every: 10 * time.Millisecond, Window: 4, Busy: 4, Slow: time.Millisecond, SlowShare: 0.05})
	defer d.stop()
	d.tick(3, 1, 0)
	d.tick(1, 1, 19) // 19 slow of the window's 400 wake-ups: under 5%
	d.none()
	d.tick(3, 1, 0)
	d.tick(1, 1, 20) // 20 of 400: 5%
	d.expect(2)
}

func TestHoldThenOnePAgain(t *testing.T) {
	d := start(t, Config{Max: 2, Every: 10 * time.Millisecond, Window: 2, Busy: 4, Hold: 50 * time.Millisecond})
	defer d.stop()
	d.tick(2, 8, 0)
	d.expect(2)
	d.tick(4, 0, 0) // four ticks of the five in Hold
	d.none()
	d.tick(1, 0, 0)
	d.expect(1) // one P tried again
	d.tick(2, 8, 0)
	d.expect(2) // still busy: back to Max
}

func TestFailedTryDoublesHold(t *testing.T) {
	d := start(t, Config{Max: 2, Every: 10 * time.Millisecond, Window: 2, Busy: 4, Hold: 30 * time.Millisecond, MaxHold: 60 * time.Millisecond})
	defer d.stop()
	d.tick(2, 8, 0)
	d.expect(2)
	d.tick(2, 0, 0) // Hold: 3 ticks
	d.none()
	d.tick(1, 0, 0)
	d.expect(1)
	d.tick(2, 8, 0) // the try fails at its first window: the hold doubles to 6
	d.expect(2)
	d.tick(5, 0, 0)
	d.none()
	d.tick(1, 0, 0)
	d.expect(1)
	d.tick(2, 8, 0) // fails again: MaxHold keeps it at 6
	d.expect(2)
	d.tick(5, 0, 0)
	d.none()
	d.tick(1, 0, 0)
	d.expect(1)
	d.tick(2, 0, 0) // a window that one P was enough for: the hold is Hold again
	d.tick(2, 8, 0)
	d.expect(2)
	d.tick(2, 0, 0)
	d.none()
	d.tick(1, 0, 0)
	d.expect(1)
}

func TestQuietStaysAtOneP(t *testing.T) {
	d := start(t, Config{Max: 8, Every: 10 * time.Millisecond, Window: 3, Busy: 4})
	defer d.stop()
	d.tick(30, 3, 4) // ten windows below Busy, 4% of the wake-ups slow
	d.none()
}

func TestStopRestoresMax(t *testing.T) {
	d := start(t, Config{Max: 3})
	d.stop()
	d.expect(3)
}

func TestMaxOneOnlyWaits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	sets := 0
	done := make(chan struct{})
	go func() { Run(ctx, Config{Max: 1, Set: func(int) { sets++ }}); close(done) }()
	cancel()
	<-done
	if sets != 0 {
		t.Fatalf("Max 1: %d changes of the Ps, want none", sets)
	}
}

// compute keeps n goroutines computing until stop closes (or 10 s).
func compute(n int, stop chan struct{}, wg *sync.WaitGroup) {
	for range n {
		wg.Add(1)
		go func() { // busy worker
			defer wg.Done()
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) {
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
}

// TestRuntimeMetrics reads the real metrics: at one P, with eight
// goroutines computing, several at a time wait for it, and for long.
func TestRuntimeMetrics(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	read, wait := runnable(), waits()
	slow0, all0 := wait(time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	compute(8, stop, &wg)
	var most uint64
	for range 20 {
		most = max(most, read())
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	slow, all := wait(time.Millisecond)
	if most < 4 {
		t.Errorf("at most %d runnable goroutines seen with eight computing on one P; want at least 4", most)
	}
	if slow-slow0 == 0 || all-all0 == 0 {
		t.Errorf("waits: %d slow of %d measured while eight computed on one P; want some slow", slow-slow0, all-all0)
	}
}

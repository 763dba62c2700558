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

// driver runs Run on fake ticks and a fake queue, one tick at a time.
type driver struct {
	t     *testing.T
	ticks chan time.Time
	mu    sync.Mutex
	queue uint64
	procs []int // every Set, in order
	set   chan int
	stop  func()
	done  chan struct{}
}

func start(t *testing.T, cfg Config) *driver {
	d := &driver{t: t, ticks: make(chan time.Time), set: make(chan int, 100), done: make(chan struct{})}
	cfg.Ticks = d.ticks
	cfg.Runnable = func() uint64 { d.mu.Lock(); defer d.mu.Unlock(); return d.queue }
	cfg.Set = func(n int) { d.set <- n }
	ctx, cancel := context.WithCancel(context.Background())
	go func() { Run(ctx, cfg); close(d.done) }()
	d.stop = func() { cancel(); <-d.done }
	d.expect(1) // starts at one P
	return d
}

func (d *driver) tick(n int, queue uint64) {
	d.mu.Lock()
	d.queue = queue
	d.mu.Unlock()
	for range n {
		d.ticks <- time.Time{} // unbuffered: Run has taken the previous one
	}
}

// expect checks the next Set, after Run has handled the ticks sent.
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

func (d *driver) expectNone() {
	d.t.Helper()
	d.tick(1, 0) // a tick Run takes only after handling the ones before
	select {
	case got := <-d.set:
		d.t.Fatalf("set %d Ps, want no change", got)
	default:
	}
}

func TestBusyQueueAddsPs(t *testing.T) {
	d := start(t, Config{Max: 4, Every: 10 * time.Millisecond, Window: 5, Busy: 4, Hold: 100 * time.Millisecond})
	defer d.stop()
	d.tick(5, 3) // a window below Busy: one P is enough
	d.expectNone()
	// expectNone's tick began the next window with a 0; three samples of
	// 10 do not end it, the fifth does, at a mean of 8.
	d.tick(3, 10)
	select {
	case got := <-d.set:
		t.Fatalf("set %d Ps before the window ended", got)
	default:
	}
	d.tick(1, 10)
	d.expect(4)
}

func TestHoldThenOnePAgain(t *testing.T) {
	d := start(t, Config{Max: 2, Every: 10 * time.Millisecond, Window: 2, Busy: 4, Hold: 50 * time.Millisecond})
	defer d.stop()
	d.tick(2, 8)
	d.expect(2)
	d.tick(4, 0) // held 4 ticks of the 5 in Hold
	select {
	case got := <-d.set:
		t.Fatalf("set %d Ps before Hold passed", got)
	default:
	}
	d.tick(1, 0)
	d.expect(1) // Hold passed: one P tried again
	d.tick(2, 8)
	d.expect(2) // still busy: back to Max
}

func TestQuietStaysAtOneP(t *testing.T) {
	d := start(t, Config{Max: 8, Every: 10 * time.Millisecond, Window: 3, Busy: 4})
	defer d.stop()
	for range 10 {
		d.tick(3, 3) // below Busy, window after window
	}
	d.expectNone()
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

// TestRunnableCountsQueuedGoroutines reads the real metric: at one P, with
// eight goroutines computing, seven at a time wait for it.
func TestRunnableCountsQueuedGoroutines(t *testing.T) {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	read := runnable()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { // busy worker, ends when stop closes
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
	var most uint64
	for range 20 {
		most = max(most, read())
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if most < 4 {
		t.Fatalf("at most %d runnable goroutines seen with eight computing on one P; want at least 4", most)
	}
}

package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// loadResult is what one load run prints, as one JSON line.
type loadResult struct {
	Mode    string  `json:"mode"`
	Ops     int64   `json:"ops"`
	Errors  int64   `json:"errors"`
	Seconds float64 `json:"seconds"`
	Rate    float64 `json:"rate"`   // ops per second
	P50us   float64 `json:"p50_us"` // latency of one op
	P99us   float64 `json:"p99_us"` //
	FirstEr string  `json:"first_error,omitempty"`
	// PerTarget is the p50 connect latency per target (mode lat), in µs.
	PerTarget map[string]float64 `json:"per_target,omitempty"`
}

// maxSamples bounds the latencies kept per worker (memory, not time).
const maxSamples = 1 << 20

// loadMain is the load generator, run inside a client namespace. Modes:
//
//	conn     workers x (connect, write size, read size, close) until duration
//	rr       workers x one connection, (write size, read size) until
//	         duration
//	udp      workers x one connected socket, (send size, await the echo)
//	lat      connect latency to each target in turn, count times each
//	connect  one client, sequential connects (each then echoes size and
//	         closes), at most count, until duration; p50/p99 of the connect
//	         alone (SYN sent to established)
//	hold     open count TCP connections (one echo each), print a line,
//	         hold them until standard input closes
//	holdudp  the same with count UDP sockets
func loadMain(args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	mode := fs.String("mode", "conn", "conn, rr, udp, lat, connect, hold or holdudp")
	target := fs.String("target", "", "ip:port")
	targets := fs.String("targets", "", "comma-separated ip:port (mode lat)")
	duration := fs.Duration("duration", 5*time.Second, "how long to run (conn, rr, udp)")
	workers := fs.Int("workers", 64, "concurrent workers (conn, rr, udp, hold)")
	size := fs.Int("size", 64, "bytes each way per operation")
	count := fs.Int("count", 1000, "connections or flows (hold, holdudp), connects per target (lat), most connects (connect)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var (
		res loadResult
		err error
	)
	switch *mode {
	case "conn":
		res = runWorkers(*workers, *duration, func(w *worker) error { return connOnce(*target, *size, w) })
	case "rr":
		res, err = runRR(*target, *size, *workers, *duration)
	case "udp":
		res, err = runUDP(*target, *size, *workers, *duration)
	case "lat":
		res, err = runLat(strings.Split(*targets, ","), *count)
	case "connect":
		res = runConnect(*target, *size, *count, *duration)
	case "hold", "holdudp":
		return runHold(*mode == "holdudp", *target, *count, *workers)
	default:
		return fmt.Errorf("load: unknown mode %q", *mode)
	}
	if err != nil {
		return err
	}
	res.Mode = *mode
	return json.NewEncoder(os.Stdout).Encode(res)
}

type worker struct {
	id      int
	buf     []byte
	samples []time.Duration
	ops     int64
	errs    int64
	firstEr error
}

func (w *worker) record(d time.Duration) {
	w.ops++
	if len(w.samples) < maxSamples {
		w.samples = append(w.samples, d)
	}
}

// runWorkers runs op on n workers until d has passed, each op timed.
func runWorkers(n int, d time.Duration, op func(*worker) error) loadResult {
	ws := make([]*worker, n)
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i := range ws {
		ws[i] = &worker{id: i, buf: make([]byte, 65536)}
		wg.Add(1)
		go func(w *worker) { // load worker
			defer wg.Done()
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := op(w); err != nil {
					w.errs++
					if w.firstEr == nil {
						w.firstEr = err
					}
					continue
				}
				w.record(time.Since(t0))
			}
		}(ws[i])
	}
	wg.Wait()
	return summarize(ws, time.Since(start))
}

func summarize(ws []*worker, elapsed time.Duration) loadResult {
	var all []time.Duration
	var r loadResult
	for _, w := range ws {
		r.Ops += w.ops
		r.Errors += w.errs
		if r.FirstEr == "" && w.firstEr != nil {
			r.FirstEr = w.firstEr.Error()
		}
		all = append(all, w.samples...)
	}
	r.Seconds = elapsed.Seconds()
	r.Rate = float64(r.Ops) / r.Seconds
	r.P50us, r.P99us = percentile(all, 0.50), percentile(all, 0.99)
	return r
}

// percentile returns the q-quantile of ds in µs (nearest rank); 0 when empty.
func percentile(ds []time.Duration, q float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(q*float64(len(ds))+0.5) - 1
	i = max(0, min(i, len(ds)-1))
	return float64(ds[i].Nanoseconds()) / 1e3
}

func connOnce(target string, size int, w *worker) error {
	c, err := net.DialTimeout("tcp", target, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	return echo(c, w.buf[:size])
}

// echo writes p and reads as many bytes back, within 2 s.
func echo(c net.Conn, p []byte) error {
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write(p); err != nil {
		return err
	}
	_, err := io.ReadFull(c, p)
	return err
}

// runRR opens n connections, then each worker exchanges size bytes each
// way on its own, one exchange at a time, until d has passed.
func runRR(target string, size, n int, d time.Duration) (loadResult, error) {
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err != nil {
			return loadResult{}, err
		}
		defer c.Close()
		conns[i] = c
	}
	return runWorkers(n, d, func(w *worker) error { return echo(conns[w.id], w.buf[:size]) }), nil
}

func runUDP(target string, size, n int, d time.Duration) (loadResult, error) {
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("udp", target)
		if err != nil {
			return loadResult{}, err
		}
		defer c.Close()
		conns[i] = c
	}
	// A lost datagram costs its worker a 500 ms wait and counts as an error.
	return runWorkers(n, d, func(w *worker) error {
		c, p := conns[w.id], w.buf[:size]
		if err := c.SetDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
			return err
		}
		if _, err := c.Write(p); err != nil {
			return err
		}
		_, err := c.Read(w.buf)
		return err
	}), nil
}

// runConnect times count sequential connects, or as many as fit in d.
func runConnect(target string, size, count int, d time.Duration) loadResult {
	w := &worker{buf: make([]byte, size)}
	start := time.Now()
	for i := 0; i < count && time.Since(start) < d; i++ {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err == nil {
			connected := time.Since(t0)
			if err = echo(c, w.buf); err == nil {
				w.record(connected)
			}
			c.Close()
		}
		if err != nil {
			w.errs++
			if w.firstEr == nil {
				w.firstEr = err
			}
		}
	}
	return summarize([]*worker{w}, time.Since(start))
}

func runLat(targets []string, count int) (loadResult, error) {
	per := make([][]time.Duration, len(targets))
	w := &worker{buf: make([]byte, 64)}
	start := time.Now()
	for range count {
		for i, t := range targets {
			t0 := time.Now()
			c, err := net.DialTimeout("tcp", t, 2*time.Second)
			if err != nil {
				return loadResult{}, fmt.Errorf("connect %s: %w", t, err)
			}
			per[i] = append(per[i], time.Since(t0))
			err = echo(c, w.buf)
			c.Close()
			if err != nil {
				return loadResult{}, fmt.Errorf("echo %s: %w", t, err)
			}
		}
	}
	r := loadResult{Ops: int64(count * len(targets)), Seconds: time.Since(start).Seconds(), PerTarget: map[string]float64{}}
	for i, t := range targets {
		r.PerTarget[t] = percentile(per[i], 0.5)
	}
	return r, nil
}

// runHold opens count connections (or UDP flows) with n workers, checks
// each with one echo, prints {"ops": opened, "errors": failed} and holds
// them until standard input closes.
func runHold(udp bool, target string, count, n int) error {
	network := "tcp"
	if udp {
		network = "udp"
	}
	conns := make([]net.Conn, count)
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { // opener
			defer wg.Done()
			buf := make([]byte, 64)
			for {
				i := next.Add(1) - 1
				if i >= int64(count) {
					return
				}
				c, err := net.DialTimeout(network, target, 2*time.Second)
				if err == nil {
					err = echo(c, buf)
					if err != nil {
						c.Close()
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				_ = c.SetDeadline(time.Time{})
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	r := loadResult{Mode: "hold", Ops: int64(count) - failed.Load(), Errors: failed.Load()}
	if s, ok := firstErr.Load().(string); ok {
		r.FirstEr = s
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		if c != nil {
			c.Close()
		}
	}
	return nil
}

// Package procs sets how many Ps run the proxy's Go code (GOMAXPROCS) by
// the load: one while one is enough, all of them while goroutines queue for
// it.
//
// Every hand-off of a packet or of bytes between goroutines (the TUN reader,
// gVisor's TCP processor, a flow's copiers, the poller) wakes a sleeping
// thread on another CPU when a second P is idle; on a small VM that wake-up
// is the largest cost of a request/response exchange or a connect, and with
// one P the goroutines run in turn on the thread that is already awake.
// Measured in interleaved harness runs on the 2-vCPU VM (BENCHMARKS.md):
// with GOMAXPROCS=1, connect p50 266 -> 174 µs, 64-byte request/response p50
// 146 -> 77 µs, one TCP stream down 9.9 -> 12.6 Gbit/s; but 64 concurrent
// connection openers got 13% fewer connections per second, their goroutines
// queueing for the one P. So:
//
//  1. Run starts at one P and samples the runnable goroutines (those queued
//     for a P) every tick.
//  2. When their mean over a window reaches Busy, or a share of the
//     goroutines that became runnable in it waited long for the P (one
//     goroutine computing for long, such as a big table build, keeps the
//     queue short but makes the others wait), it sets Max Ps.
//  3. After Hold at Max, it tries one P again (step 1): with more Ps the
//     queue is short either way, so only one P's queue tells whether one P
//     is enough. A try that fails at once doubles the hold, up to MaxHold,
//     so lasting load pays one window at one P in every 32 s or so.
//  4. When ctx is done it restores the runtime's default.
//
// It runs in `userproxy run` (cmd/userproxy/procs.go, --procs) and imports
// the standard library only.
//
// Kernel work inside system calls (a TUN write delivers the packet to the
// client's socket on the writer's thread) runs on the calling thread; a call
// that blocks hands its P on, a raw one (the TUN write) keeps it.
package procs

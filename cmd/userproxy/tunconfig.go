package main

import "runtime"

// tunConfig is how run opens its TUN device (openTUN).
type tunConfig struct {
	name     string
	mtu      int
	offload  bool // virtio-net headers and TCP offloads (Linux)
	portable bool // water's device and the generic link, as on macOS
	queues   int  // queues of a multi-queue device (Linux); 1: a single-queue one
}

// maxTUNQueues is the most queues a TUN device takes (MAX_TAP_QUEUES in
// the kernel's drivers/net/tun.c).
const maxTUNQueues = 256

// queues is the TUN's queue count: --tun-queues, else one per CPU the
// proxy's Go code may use at once (--procs when it fixes them, else every
// CPU the process may run on), at most the kernel's limit.
func (f *runFlags) queues() int {
	switch {
	case f.tunQueues > 0:
		return f.tunQueues
	case f.procs > 0:
		return min(f.procs, maxTUNQueues)
	}
	return min(runtime.NumCPU(), maxTUNQueues)
}

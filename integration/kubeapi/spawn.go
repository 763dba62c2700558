package kubeapi

import (
	"os/exec"
	"runtime"
	"sync"
)

// The processes of a Cluster must not outlive the test process, even when it
// dies without cleaning up (a panic, a test timeout): on Linux they are
// started with a parent-death signal (procAttr). That signal fires when the
// *thread* that started them exits, and Go ends a thread whenever a goroutine
// that locked it returns — which the namespace helpers of the integration
// tests do all the time. So every process is started from one thread that
// this package keeps locked until the last of its processes has exited.

var spawner struct {
	mu   sync.Mutex
	live int         // processes started and not yet reaped
	work chan func() // served by the spawning thread while live > 0
}

// spawn starts cmd from the spawning thread; a nil error must be followed by
// one call of spawned once cmd has been waited for.
func spawn(cmd *exec.Cmd) error {
	cmd.SysProcAttr = procAttr()
	spawner.mu.Lock()
	if spawner.live == 0 {
		spawner.work = make(chan func())
		go spawnThread(spawner.work)
	}
	spawner.live++
	work := spawner.work
	spawner.mu.Unlock()

	errc := make(chan error, 1)
	work <- func() { errc <- cmd.Start() }
	err := <-errc
	if err != nil {
		spawned()
	}
	return err
}

// spawned records that a process started by spawn is gone; the spawning
// thread ends with the last one.
func spawned() {
	spawner.mu.Lock()
	defer spawner.mu.Unlock()
	spawner.live--
	if spawner.live == 0 {
		close(spawner.work)
	}
}

func spawnThread(work <-chan func()) { // process spawner: the parent thread of every child
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine, after the children
	for f := range work {
		f()
	}
}

package main

// Restarts without an orchestrator (docs/handover.md): SIGHUP, or
// `userproxy restart`, which sends it.
//
//  1. The running proxy gets SIGHUP. It starts its binary again — the file
//     at the path it was started from, so an upgrade that replaced the file
//     starts the new version — with its own arguments and
//     USERPROXY_TAKE_OVER=1 (--take-over's default).
//  2. The new process builds its table and takes over through the handover
//     socket (handover_linux.go); this one exits 0 on the commit, as for
//     any taker.
//  3. A new process that fails before the commit leaves this one serving;
//     its exit is logged here.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/handover"
)

// takeOverEnv sets --take-over's default: a process started by a restart
// takes over from the one that started it.
const takeOverEnv = "USERPROXY_TAKE_OVER"

// restarter answers SIGHUP by starting the next process.
type restarter struct {
	exe     string   // the binary's path, read at start
	args    []string // this process's arguments, given again
	enabled error    // nil when a restart can hand over; else why not
	handed  <-chan struct{}
	logger  *zap.Logger

	mu    sync.Mutex
	child int // pid of a new process that has neither taken over nor exited
}

// newRestarter reads the binary's path now: after an upgrade the path
// names the new file, while /proc/self/exe still names the old one.
func newRestarter(handoverSocket string, handed <-chan struct{}, logger *zap.Logger) *restarter {
	r := &restarter{args: os.Args[1:], handed: handed, logger: logger}
	exe, err := os.Executable()
	switch {
	case runtime.GOOS != "linux":
		r.enabled = errors.New("handovers need Linux")
	case handoverSocket == "":
		r.enabled = errors.New("--handover-socket is none")
	case err != nil:
		r.enabled = fmt.Errorf("the binary's path: %w", err)
	}
	r.exe = exe
	return r
}

// run restarts on each signal from hup until ctx ends.
func (r *restarter) run(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.restart()
		}
	}
}

// restart starts the next process, unless one is already starting.
func (r *restarter) restart() {
	if r.enabled != nil {
		r.logger.Warn("SIGHUP: no restart (a restart hands over, and this proxy cannot): serving on", zap.Error(r.enabled))
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.child != 0 {
		r.logger.Warn("SIGHUP: a restart is already under way", zap.Int("pid", r.child))
		return
	}
	cmd := exec.Command(r.exe, r.args...)
	cmd.Env = append(os.Environ(), takeOverEnv+"=1")
	// The same files, not pipes: the new process's log goes where this
	// one's went, and outlives this process.
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		r.logger.Error("SIGHUP: the restart failed: serving on", zap.String("binary", r.exe), zap.Error(err))
		return
	}
	r.child = cmd.Process.Pid
	r.logger.Info("SIGHUP: restarting: a new process takes over", zap.Int("pid", r.child), zap.String("binary", r.exe))
	go func() { // reaps it if it fails; once it has taken over this process exits first
		err := cmd.Wait()
		select {
		case <-r.handed:
			return
		default:
		}
		r.mu.Lock()
		r.child = 0
		r.mu.Unlock()
		r.logger.Warn("SIGHUP: the new process exited before taking over: serving on", zap.Int("pid", cmd.Process.Pid), zap.Error(err))
	}()
}

// runRestart is `userproxy restart`: SIGHUP to the proxy that serves the
// handover socket, then a wait for it to hand over and exit.
func runRestart(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("restart", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	tunName := fs.String("tun-name", "userproxy0", "TUN device of the proxy to restart")
	socket := fs.String("handover-socket", "", "its handover socket (default: "+defaultHandoverSocket("TUN")+")")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long to wait for the new process to take over")
	if help, err := parseArgs(fs, args, stdout, restartAbout); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fmt.Errorf("restart: unexpected arguments %v", fs.Args()))
	}
	if *socket == "" {
		*socket = defaultHandoverSocket(*tunName)
	}
	if runtime.GOOS != "linux" {
		return errors.New("restart: handovers need Linux")
	}
	old, err := handover.ServerPID(*socket)
	if err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := unix.Kill(old, unix.SIGHUP); err != nil {
		return fmt.Errorf("restart: signalling pid %d: %w", old, err)
	}
	deadline := time.Now().Add(*timeout)
	for processAlive(old) {
		if time.Now().After(deadline) {
			return fmt.Errorf("restart: pid %d still serves after %v: the new process did not take over (the proxy's log says why)", old, *timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		pid, err := handover.ServerPID(*socket)
		if err == nil && pid != old {
			fmt.Fprintf(stdout, "pid %d handed over to pid %d\n", old, pid)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("restart: pid %d exited, and no new process serves %s", old, *socket)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processAlive reports whether pid runs: it exists, and is not a zombie
// waiting for its parent whose every thread has exited. (A killed
// process's main thread is a zombie while its other threads still exit,
// and its files close only with the last of them.)
func processAlive(pid int) bool {
	dir := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) || s[i+2] != 'Z' {
		return true
	}
	threads, err := os.ReadDir(dir + "/task")
	return err == nil && len(threads) > 1
}

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process the harness started; stop ends it by PID.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	done  chan struct{}
	err   error
}

// startProc starts name args... with a pipe on standard input (closing it
// asks our own roles to exit) and one on standard output.
func startProc(label string, name string, args ...string) (*proc, error) {
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", label, err)
	}
	p := &proc{name: label, cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout), done: make(chan struct{})}
	go func() { // reaper
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// line reads one line of the process's output within timeout.
func (p *proc) line(timeout time.Duration) (string, error) {
	type res struct {
		s   string
		err error
	}
	ch := make(chan res, 1)
	go func() { // one line reader
		s, err := p.out.ReadString('\n')
		ch <- res{s, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return r.s, fmt.Errorf("%s: reading its output: %w", p.name, r.err)
		}
		return strings.TrimSpace(r.s), nil
	case <-time.After(timeout):
		return "", fmt.Errorf("%s: no output within %v", p.name, timeout)
	}
}

// stop closes standard input, sends SIGTERM, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) error {
	_ = p.stdin.Close()
	select {
	case <-p.done:
		return p.err
	case <-time.After(200 * time.Millisecond):
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s: killed after %v", p.name, grace)
	}
}

// wait waits for the process to exit by itself, killing it after timeout.
func (p *proc) wait(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s: killed after %v", p.name, timeout)
	}
}

// cpuSeconds is the process's user+system CPU time from /proc/PID/stat.
func cpuSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	// Fields after the command name, which is in parentheses: utime and
	// stime are fields 14 and 15 of the line, 12 and 13 after ")".
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: short line", pid)
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return (ut + st) / 100, nil // USER_HZ is 100 on Linux
}

// memKB returns a field of /proc/PID/status in KiB (VmRSS, VmHWM).
func memKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// resetPeak resets VmHWM to the current RSS (proc(5), clear_refs "5").
func resetPeak(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

package main

// The servers' ports while taking over (handover_linux.go): the running
// proxy holds them until it has handed over and exits. A proxy that died
// instead: a clean start, which answers its clients' segments with RSTs
// for a while.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/userproxy/userproxy/handover"
	"github.com/userproxy/userproxy/proxy"
)

// errOldDied: the process being taken over from went away before it
// handed over (a crash, SIGKILL). This one starts clean.
var errOldDied = errors.New("the running proxy died during the handover")

// strayResetWindow is how long a start after a crashed proxy answers the
// client segments of no flow with a RST (netstack.Options.StrayResets):
// the crashed proxy's clients retransmit for minutes, with backoff, and
// idle ones send when they next write.
const strayResetWindow = 10 * time.Minute

// predecessorCrashed reports whether a proxy left its handover socket at
// path without serving it: it ended without cleaning up (a crash, SIGKILL;
// a proxy that exits removes it), and its clients may still hold flows
// that no longer exist.
func predecessorCrashed(path string) bool {
	if path == "" {
		return false
	}
	if _, err := os.Lstat(path); err != nil {
		return false
	}
	_, err := handover.ServerPID(path)
	return errors.Is(err, handover.ErrNoServer)
}

// takeOverListenWait bounds the wait for a port the old process holds
// until it exits.
const takeOverListenWait = 10 * time.Second

// listenTakingOver listens on addr ("" for none), waiting for the old
// process to release it.
func listenTakingOver(addr string) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	return retryTaken(func() (net.Listener, error) { return net.Listen("tcp", addr) })
}

// retryTaken calls listen until it does not fail with a taken address, for
// takeOverListenWait at most.
func retryTaken(listen func() (net.Listener, error)) (net.Listener, error) {
	deadline := time.Now().Add(takeOverListenWait)
	for {
		ln, err := listen()
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return ln, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// handoverStats are the handover's metrics: what this process took over
// when it started, and the handovers it offered that failed (it serves
// on after those). A handover that succeeds ends the process that offered
// it: the taker's figures tell of it.
type handoverStats struct {
	takenMoved, takenReset atomic.Uint64
	takenPause             atomic.Int64 // nanoseconds
	failed                 atomic.Uint64
}

// register registers the metrics on reg.
func (h *handoverStats) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "userproxy_handover_taken_flows", Help: "Flows (translated TCP and UDP) this process took over from the one it replaced (run --take-over): moved, or reset or dropped because they could not be adopted.",
			ConstLabels: prometheus.Labels{"result": "moved"},
		}, func() float64 { return float64(h.takenMoved.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "userproxy_handover_taken_flows", Help: "Flows (translated TCP and UDP) this process took over from the one it replaced (run --take-over): moved, or reset or dropped because they could not be adopted.",
			ConstLabels: prometheus.Labels{"result": "reset"},
		}, func() float64 { return float64(h.takenReset.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "userproxy_handover_taken_pause_seconds", Help: "The pause of the handover this process started from: from its request for the state to its confirmation (0 after a clean start).",
		}, func() float64 { return time.Duration(h.takenPause.Load()).Seconds() }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "userproxy_handovers_failed_total", Help: "Handovers this process offered that failed before the taker's confirmation; it served on after each.",
		}, func() float64 { return float64(h.failed.Load()) }),
	} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("admin: registering the handover metrics: %w", err)
		}
	}
	return nil
}

// listenerLender lends this process's TCP listeners to the next process in
// a handover: the NodePorts' (their accept loops wait meanwhile) and the
// health server's (it serves on until this process stops: a connection
// either accepts is answered). Each goes by a name the next process knows
// it by.
type listenerLender struct {
	nodePorts  *proxy.NodePorts
	health     net.Listener
	healthAddr string
}

// healthListenerName names the health server's listener among those lent.
func healthListenerName(addr string) string { return "healthz " + addr }

func (l listenerLender) lend() (names []string, fds []int) {
	if l.nodePorts != nil {
		for _, ln := range l.nodePorts.Lend() {
			names, fds = append(names, ln.Name), append(fds, ln.FD)
		}
	}
	if tl, ok := l.health.(*net.TCPListener); ok {
		if rc, err := tl.SyscallConn(); err == nil {
			fd := -1
			if rc.Control(func(raw uintptr) { fd = int(raw) }) == nil && fd >= 0 {
				names, fds = append(names, healthListenerName(l.healthAddr)), append(fds, fd)
			}
		}
	}
	return names, fds
}

func (l listenerLender) unlend() {
	if l.nodePorts != nil {
		l.nodePorts.Unlend()
	}
}

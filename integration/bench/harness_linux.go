package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

type options struct {
	short      bool
	reps       int
	duration   time.Duration
	userproxy  string
	pasta      string // the peers' binaries (default: from PATH)
	tun2socks  string
	profile    string // directory for CPU profiles of userproxy, one per cell
	cells      string // only the datapath cells whose names contain one of these words
	datapath   bool   // only the datapath table
	noData     bool   // skip the datapath table
	memoryOnly bool   // only the memory table
	keep       time.Duration
	proxyEnv   string // extra environment of userproxy (experiments: GOMAXPROCS, GOGC)
	proxyFlags string // extra flags of userproxy run (experiments: --tun-queues 1)
	pin        string // "LOAD:BACKENDS": CPU lists for taskset, or "" for none
	services   []int  // control plane sizes
	hold       int    // idle connections and UDP flows for the memory table
	out        io.Writer
}

func harnessMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	o := options{out: os.Stdout}
	fs.BoolVar(&o.short, "short", false, "a few seconds per cell, small control-plane and memory sizes (CI)")
	fs.IntVar(&o.reps, "reps", 3, "interleaved repetitions per cell (the median is reported)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "length of each datapath cell")
	fs.StringVar(&o.userproxy, "userproxy", "", "the userproxy binary (default: go build ./cmd/userproxy)")
	fs.StringVar(&o.pasta, "pasta", "", "the pasta binary of the pasta row (default: pasta from PATH; apt-get install passt)")
	fs.StringVar(&o.tun2socks, "tun2socks", "", "the tun2socks binary of the tun2socks row (default: tun2socks from PATH)")
	fs.StringVar(&o.profile, "profile", "", "save a CPU profile of userproxy per datapath cell (first repetition) in this directory")
	fs.StringVar(&o.cells, "cells", "", "comma-separated: only the datapath cells whose names contain one of these (e.g. conn,UDP)")
	fs.StringVar(&o.proxyEnv, "proxy-env", "", "comma-separated KEY=VALUE added to userproxy's environment (e.g. GOGC=400)")
	fs.StringVar(&o.pin, "pin", "", "LOAD:BACKENDS, two CPU lists (e.g. 0:1): the load generator and iperf3's client run on the first, the backends and iperf3's server on the second, for every row alike; the path's own process (userproxy, a peer) and the kernel's work are not pinned. Default: nothing pinned")
	fs.StringVar(&o.proxyFlags, "proxy-flags", "", "space-separated flags added to userproxy run's (e.g. --tun-queues=1)")
	fs.DurationVar(&o.keep, "keep", 0, "after setting up, keep the topology this long for inspection, then go on")
	fs.BoolVar(&o.noData, "skip-datapath", false, "skip the datapath table (memory and control plane only)")
	fs.BoolVar(&o.datapath, "datapath-only", false, "only the datapath table (no memory, no control plane)")
	fs.BoolVar(&o.memoryOnly, "memory-only", false, "only the memory table (no datapath, no control plane)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if l, b, ok := strings.Cut(o.pin, ":"); o.pin != "" && (!ok || l == "" || b == "") {
		return fmt.Errorf("-pin %q: want LOAD:BACKENDS, two CPU lists such as 0:1", o.pin)
	}
	o.services, o.hold = []int{1000, 5000, 10000}, 10000
	if o.short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		o.services, o.hold = []int{1000}, 500
		if !set["reps"] {
			o.reps = 1
		}
		if !set["duration"] {
			o.duration = time.Second
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("the harness needs root (namespaces, a TUN device, iptables)")
	}
	tools := []string{"ip", "iptables-restore", "iperf3", "sysctl"}
	if o.pin != "" {
		tools = append(tools, "taskset")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("the harness needs %s (apt-get install iproute2 iptables iperf3 procps): %w", tool, err)
		}
	}
	dir, err := os.MkdirTemp("", "userproxy-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if o.userproxy == "" {
		o.userproxy = filepath.Join(dir, "userproxy")
		if out, err := exec.Command("go", "build", "-o", o.userproxy, "github.com/userproxy/userproxy/cmd/userproxy").CombinedOutput(); err != nil {
			return fmt.Errorf("building userproxy: %w: %s", err, out)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	h := &harness{o: o, self: self, dir: dir, iperfRetried: map[string]int{}}
	defer h.close()
	if err := h.setUp(); err != nil {
		return err
	}
	h.machine()
	if o.keep > 0 {
		fmt.Fprintf(os.Stderr, "bench: topology up: namespaces %s (endpoints), %s (kernel), %s (userproxy, PID %d); keeping it %v\n",
			h.topo.b, h.topo.k, h.topo.u, h.proxy.cmd.Process.Pid, o.keep)
		time.Sleep(o.keep)
	}
	if !o.noData && !o.memoryOnly {
		if err := h.datapath(); err != nil {
			return err
		}
	}
	if !o.datapath {
		if err := h.memory(); err != nil {
			return err
		}
		if o.memoryOnly {
			return h.failed()
		}
		if err := h.controlPlane(); err != nil {
			return err
		}
	}
	return h.failed()
}

// failed returns an error naming the cells that failed, if any did.
func (h *harness) failed() error {
	if len(h.failures) > 0 {
		return fmt.Errorf("%d cell(s) failed: %s", len(h.failures), strings.Join(h.failures, "; "))
	}
	return nil
}

type harness struct {
	o        options
	self     string
	dir      string
	cfg      string
	topo     *topology
	backends *proc
	iperf    *proc
	proxy    *proc
	peers    []*peer
	failures []string
	// iperfRetried counts the iperf3 runs the server was not ready for and
	// the harness retried, by reason (iperfNotReady; printed under the
	// datapath table).
	iperfRetried map[string]int
}

// The services of the datapath cells.
const (
	tcpService   = "10.96.1.1:80"
	udpService   = "10.96.1.2:53"
	iperfService = "10.96.1.3:5201"
	adminAddr    = "127.0.0.1:10249" // in U, with -profile only
)

func (h *harness) setUp() error {
	var err error
	if h.topo, err = newTopology(); err != nil {
		return err
	}
	addrs := make([]string, endpoints)
	for i := range addrs {
		addrs[i] = endpointAddr(i)
	}
	if h.backends, err = startProc("backends", "ip", pinned(h.o.backendCPUs(), "netns", "exec", h.topo.b, h.self, "serve", "-addrs", strings.Join(addrs, ","))...); err != nil {
		return err
	}
	if l, err := h.backends.line(10 * time.Second); err != nil || l != "ready" {
		return fmt.Errorf("backends did not start: %q %v", l, err)
	}
	if h.iperf, err = startProc("iperf3 server", "ip", pinned(h.o.backendCPUs(), "netns", "exec", h.topo.b, "iperf3", "-s", "-B", endpointAddr(0), "-p", "5201", "--logfile", filepath.Join(h.dir, "iperf3.log"))...); err != nil {
		return err
	}
	h.cfg = filepath.Join(h.dir, "services.yaml")
	if err := os.WriteFile(h.cfg, []byte(benchConfig(0)), 0o644); err != nil {
		return err
	}
	if _, err := h.loadKernelRules(time.Minute); err != nil {
		return err
	}
	if _, err := h.loadRules(h.topo.p, time.Minute); err != nil {
		return err
	}
	adminFlags := []string{"--admin-addr", ""}
	if h.o.profile != "" {
		adminFlags = []string{"--admin-addr", adminAddr, "--profiling"}
	}
	env := []string{}
	if h.o.proxyEnv != "" {
		env = append([]string{"env"}, strings.Split(h.o.proxyEnv, ",")...)
	}
	argv := append([]string{"netns", "exec", h.topo.u}, env...)
	argv = append(argv, h.o.userproxy, "run", "--config", h.cfg,
		"--tun-name", tunName, "--service-cidr", serviceCIDR, "--min-sync-period", "0",
		"--log-format", "json", "--log-level", "warn")
	argv = append(argv, strings.Fields(h.o.proxyFlags)...)
	h.proxy, err = startProc("userproxy", "ip", append(argv, adminFlags...)...)
	if err != nil {
		return err
	}
	// Ready when a connection through the TUN gets its echo.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := h.load(h.topo.u, 10*time.Second, "-mode", "lat", "-targets", tcpService, "-count", "1")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("userproxy not answering within 30 s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.startPeers()
	return nil
}

func (h *harness) close() {
	h.stopPeers()
	for _, p := range []*proc{h.proxy, h.iperf, h.backends} {
		if p != nil {
			if err := p.stop(10 * time.Second); err != nil && p == h.proxy {
				fmt.Fprintf(os.Stderr, "bench: userproxy exit: %v\n", err)
			}
		}
	}
	if h.topo != nil {
		h.topo.remove()
	}
}

// loadKernelRules loads what `userproxy rules` prints for the current config
// into K, as kube-proxy's sync does, and returns how long the restore took.
func (h *harness) loadKernelRules(timeout time.Duration) (time.Duration, error) {
	return h.loadRules(h.topo.k, timeout)
}

// loadRules loads what `userproxy rules` prints for the current config into
// namespace ns and returns how long the restore took.
func (h *harness) loadRules(ns string, timeout time.Duration) (time.Duration, error) {
	rules, err := exec.Command(h.o.userproxy, "rules", "--config", h.cfg, "--format", "restore", "--jump-rules").Output()
	if err != nil {
		return 0, fmt.Errorf("userproxy rules: %w", err)
	}
	rulesFile := filepath.Join(h.dir, "rules")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		return 0, err
	}
	start := time.Now()
	_, err = inNS(ns, timeout, "iptables-restore", rulesFile)
	return time.Since(start), err
}

// loadCPUs and backendCPUs are -pin's two CPU lists ("" for none).
func (o options) loadCPUs() string {
	l, _, _ := strings.Cut(o.pin, ":")
	return l
}

func (o options) backendCPUs() string {
	_, b, _ := strings.Cut(o.pin, ":")
	return b
}

// pinned puts taskset -c cpus before the command after "netns exec NS"
// in args (an ip(8) argument list), when cpus is set.
func pinned(cpus string, args ...string) []string {
	if cpus == "" || len(args) < 4 {
		return args
	}
	return append(append(append([]string(nil), args[:3]...), "taskset", "-c", cpus), args[3:]...)
}

// inLoadNS runs name in namespace ns on the load generator's CPUs (-pin).
func (h *harness) inLoadNS(ns string, timeout time.Duration, name string, args ...string) ([]byte, error) {
	if cpus := h.o.loadCPUs(); cpus != "" {
		return inNS(ns, timeout, "taskset", append([]string{"-c", cpus, name}, args...)...)
	}
	return inNS(ns, timeout, name, args...)
}

// load runs the load generator in namespace ns and decodes its result.
func (h *harness) load(ns string, timeout time.Duration, args ...string) (loadResult, error) {
	out, err := h.inLoadNS(ns, timeout, h.self, append([]string{"load"}, args...)...)
	var r loadResult
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("load output %q: %w", out, err)
	}
	return r, nil
}

// machine prints the facts the figures depend on.
func (h *harness) machine() {
	uname, _ := exec.Command("uname", "-sr").Output()
	ipt, _ := exec.Command("iptables", "--version").Output()
	iperf, _ := exec.Command("iperf3", "--version").Output()
	first, _, _ := strings.Cut(string(iperf), "\n")
	fmt.Fprintf(h.o.out, "# userproxy benchmark harness, %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(h.o.out, "- machine: %s, %d CPUs, %s; %s; %s\n", strings.TrimSpace(string(uname)), runtime.NumCPU(),
		runtime.Version(), strings.TrimSpace(string(ipt)), strings.TrimSpace(first))
	for _, pr := range h.peers {
		if pr.why != "" {
			fmt.Fprintf(h.o.out, "- peer %s: not run: %s\n", pr.name, pr.why)
		} else {
			fmt.Fprintf(h.o.out, "- peer %s: %s\n", pr.name, strings.TrimSpace(pr.version))
		}
	}
	pin := "nothing pinned: the load generator, the backends, iperf3 and the path's process float over every CPU, for every row alike"
	if h.o.pin != "" {
		pin = fmt.Sprintf("the load generator and iperf3's client on CPUs %s, the backends and iperf3's server on CPUs %s, for every row alike; the path's process and the kernel's work not pinned",
			h.o.loadCPUs(), h.o.backendCPUs())
	}
	fmt.Fprintf(h.o.out, "- topology: client namespace -> veth -> endpoints namespace; %d repetition(s), interleaved, %v per datapath cell; %s\n\n",
		h.o.reps, h.o.duration, pin)
}

func (h *harness) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.failures = append(h.failures, msg)
	fmt.Fprintln(os.Stderr, "bench: FAIL:", msg)
}

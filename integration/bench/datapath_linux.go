package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// A path is one way for the client to reach the endpoints.
type path struct {
	name            string
	ns              string
	pod             string // the namespace of its pod-like client; "" for none
	tcp, udp, iperf string // targets
	pid             int    // the process doing the work (userproxy, a peer); 0: the kernel alone
	ours            bool   // a userproxy row: ratios to the best peer too, profiles
	peer            bool   // a userspace peer's row
	why             string // not empty: the row is not run, and this says why
}

// A sample is one cell's figures of one repetition.
type sample struct {
	value, p99 float64 // the cell's figure; p99 latency for the latency cells
	rate       float64 // operations per second, for the latency cells over many connections
	cpu        float64 // the path's process's CPU seconds during the cell
	hwm        int64   // its peak RSS during the cell, KiB
	errors     int64
	ops        float64 // operations (bytes for the bulk cells) in the cell, for CPU per op
}

type cell struct {
	name, unit string
	run        func(h *harness, p path) (sample, error)
}

// podCell starts the names of the cells run from a path's pod-like client:
// they are not run on paths without one.
const podCell = "pod-like client (MTU 1500): "

func (c cell) fromPod() bool { return strings.HasPrefix(c.name, podCell) }

// kernelPath is the index of the kernel row in paths(), the ratios' base.
const kernelPath = 1

func (h *harness) paths() []path {
	ps := []path{
		{name: "veth, no NAT (direct)", ns: h.topo.k, tcp: endpointAddr(0) + ":8080", udp: endpointAddr(0) + ":5353", iperf: endpointAddr(0) + ":5201"},
		{name: "kernel iptables (kube-proxy rules)", ns: h.topo.k, pod: h.topo.pods[h.topo.k], tcp: tcpService, udp: udpService, iperf: iperfService},
	}
	for _, pr := range h.peers {
		p := path{name: pr.name, ns: pr.ns, pod: h.topo.pods[pr.ns], tcp: tcpService, udp: udpService, iperf: iperfService, peer: true, why: pr.why}
		if pr.why == "" {
			p.pid = pr.proc.cmd.Process.Pid
		}
		ps = append(ps, p)
	}
	pid := h.proxy.cmd.Process.Pid
	return append(ps,
		path{name: "userproxy (TUN)", ns: h.topo.u, pod: h.topo.pods[h.topo.u], tcp: tcpService, udp: udpService, iperf: iperfService, pid: pid, ours: true},
		path{name: "userproxy (NodePort on 127.0.0.1)", ns: h.topo.u, tcp: fmt.Sprintf("127.0.0.1:%d", nodePortTCP),
			udp: fmt.Sprintf("127.0.0.1:%d", nodePortUDP), iperf: fmt.Sprintf("127.0.0.1:%d", nodePortIperf), pid: pid, ours: true})
}

func (h *harness) cells() []cell {
	all := h.allCells()
	if h.o.cells == "" {
		return all
	}
	var cs []cell
	for _, c := range all {
		for _, w := range strings.Split(h.o.cells, ",") {
			if strings.Contains(c.name, w) {
				cs = append(cs, c)
				break
			}
		}
	}
	return cs
}

func (h *harness) allCells() []cell {
	d := h.o.duration
	limit := d + 30*time.Second
	all := []cell{
		{"connect p50 / p99 (sequential)", "µs", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "connect", "-target", p.tcp, "-count", "20000", "-duration", d.String())
			return sample{value: r.P50us, p99: r.P99us, errors: r.Errors, ops: float64(r.Ops)}, err
		}},
		{"TCP 1 stream up", "Gbit/s", func(h *harness, p path) (sample, error) { return h.iperf3(p, false, 1) }},
		{"TCP 1 stream down", "Gbit/s", func(h *harness, p path) (sample, error) { return h.iperf3(p, true, 1) }},
		{podCell + "TCP 1 stream up", "Gbit/s", func(h *harness, p path) (sample, error) { return h.podIperf3(p, false) }},
		{podCell + "TCP 1 stream down", "Gbit/s", func(h *harness, p path) (sample, error) { return h.podIperf3(p, true) }},
	}
	for _, n := range []int{4, 16} {
		all = append(all,
			cell{fmt.Sprintf("TCP %d streams up", n), "Gbit/s", func(h *harness, p path) (sample, error) { return h.iperf3(p, false, n) }},
			cell{fmt.Sprintf("TCP %d streams down", n), "Gbit/s", func(h *harness, p path) (sample, error) { return h.iperf3(p, true, n) }})
	}
	for _, n := range []string{"64", "256"} {
		all = append(all, cell{"TCP conn/s (" + n + " workers)", "conn/s", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "conn", "-target", p.tcp, "-workers", n, "-duration", d.String())
			return sample{value: r.Rate, errors: r.Errors, ops: float64(r.Ops)}, err
		}})
	}
	for _, n := range []string{"1", "64", "256"} {
		name := "RR p50 / p99 (one conn)"
		if n != "1" {
			name = "RR p50 / p99 (" + n + " conns)"
		}
		all = append(all, cell{name, "µs", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "rr", "-target", p.tcp, "-workers", n, "-duration", d.String())
			return sample{value: r.P50us, p99: r.P99us, rate: r.Rate, errors: r.Errors, ops: float64(r.Ops)}, err
		}})
	}
	for _, n := range []string{"16", "64"} {
		all = append(all, cell{"UDP RR/s (" + n + " flows)", "RR/s", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "udp", "-target", p.udp, "-workers", n, "-duration", d.String())
			return sample{value: r.Rate, errors: r.Errors, ops: float64(r.Ops)}, err
		}})
	}
	return all
}

// iperfResult is the part of iperf3's JSON report the harness reads.
type iperfResult struct {
	Start struct {
		// ConnectingTo is reported once the server has answered the
		// client's cookie; Connected lists the test streams.
		ConnectingTo json.RawMessage   `json:"connecting_to"`
		Connected    []json.RawMessage `json:"connected"`
	} `json:"start"`
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Bytes         float64 `json:"bytes"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

// iperfNotReady says why iperf3's report shows its server was not ready
// for the client, or "" if it does not. Each case ends the client before
// the server answered it:
//   - busy: the server is in another test (it answers ACCESS_DENIED and
//     closes);
//   - refused: between two tests it has no listening socket;
//   - reset in the accept queue: at a test's end the server leaves its
//     loop on the client's IPERF_DONE and closes its listener
//     (cleanup_server in iperf_server_api.c), and the kernel resets every
//     connection queued on it; the client reads the reset as it sends its
//     cookie or waits for the first control message. Through a proxy the
//     dial of the endpoint completes against that queue and the reset
//     comes back through the proxy.
//
// A reset after the server answered, or after a test stream connected, is
// a failure of the path and is not retried. The messages are matched by
// their start and their errno, which later iperf3 versions keep while
// they add hints between the two.
func iperfNotReady(r iperfResult) string {
	if len(r.Start.Connected) > 0 || len(r.Start.ConnectingTo) > 0 {
		return ""
	}
	e := r.Error
	switch {
	case strings.HasPrefix(e, "the server is busy"):
		return "busy with another test"
	case strings.HasPrefix(e, "unable to connect to server") && strings.HasSuffix(e, "Connection refused"):
		return "not listening (between two tests)"
	case (strings.HasPrefix(e, "unable to receive control message") || strings.HasPrefix(e, "unable to send cookie to server")) &&
		(strings.HasSuffix(e, "Connection reset by peer") || strings.HasSuffix(e, "Broken pipe") ||
			// 3.21 and later shut the reset socket down before they
			// word the error, and report that call's errno.
			strings.HasSuffix(e, "Transport endpoint is not connected")):
		return "reset in its accept queue as it closed its listener"
	}
	return ""
}

// podIperf3 is iperf3 from p's pod-like client, forwarded into p by its
// namespace.
func (h *harness) podIperf3(p path, down bool) (sample, error) {
	p.ns = p.pod
	return h.iperf3(p, down, 1)
}

// iperf3 runs iperf3 with streams parallel streams over p: client to
// endpoint (up), or with -R endpoint to client (down); the figure is what
// the receiver counted, all streams together.
func (h *harness) iperf3(p path, down bool, streams int) (sample, error) {
	host, port, _ := strings.Cut(p.iperf, ":")
	args := []string{"-c", host, "-p", port, "-t", fmt.Sprint(max(1, int(h.o.duration.Seconds()+0.5))), "-J", "-P", fmt.Sprint(streams)}
	if down {
		args = append(args, "-R")
	}
	// The one iperf3 server takes one test at a time, and the previous test's
	// connections can still be closing through a userspace path when the
	// next client starts: iperf3 then refuses it as busy. Between two tests
	// it has no listening socket at all (cleanup_server in iperf3's
	// iperf_server_api.c closes it; the next test's start opens it again),
	// and a client that comes then is refused, through a proxy as its dial
	// of the endpoint is. A client can also be reset in the server's accept
	// queue as it closes its listener at a test's end (iperfNotReady). Each
	// is retried, a bounded few times, before the cell counts as failed.
	var r iperfResult
	var err error
	var retried []string
	for try := 0; ; try++ {
		// iperf3 reports its own errors in its JSON (3.12 exits 0 even
		// then, later versions 1): the report decides, the exit status
		// only when there is no report.
		var out []byte
		out, err = h.inLoadNS(p.ns, h.o.duration+30*time.Second, "iperf3", args...)
		r = iperfResult{}
		if jerr := json.Unmarshal(out, &r); jerr != nil {
			if err != nil {
				return sample{}, err
			}
			return sample{}, fmt.Errorf("iperf3 %s in %s: its report: %w", strings.Join(args, " "), p.ns, jerr)
		}
		why := iperfNotReady(r)
		if try == 9 || why == "" {
			break
		}
		h.iperfRetried[why]++
		retried = append(retried, why)
		time.Sleep(300 * time.Millisecond)
	}
	if r.Error != "" {
		if len(retried) > 0 {
			return sample{}, fmt.Errorf("iperf3 %s in %s: %s (after %d retries: %s)", strings.Join(args, " "), p.ns, r.Error, len(retried), strings.Join(retried, "; "))
		}
		return sample{}, fmt.Errorf("iperf3 %s in %s: %s", strings.Join(args, " "), p.ns, r.Error)
	}
	if err != nil {
		return sample{}, err
	}
	return sample{value: r.End.SumReceived.BitsPerSecond / 1e9, ops: r.End.SumReceived.Bytes}, nil
}

// datapath runs every cell on every path, repetition by repetition
// (interleaved, so a slow minute of the machine touches all paths alike),
// and prints the medians with their ratios to the kernel path and, for
// userproxy, to the best peer.
func (h *harness) datapath() error {
	paths, cells := h.paths(), h.cells()
	samples := make([][][]sample, len(cells)) // [cell][path][rep]
	for c := range cells {
		samples[c] = make([][]sample, len(paths))
	}
	for rep := range h.o.reps {
		for c, cl := range cells {
			for pi, p := range paths {
				if p.why != "" {
					continue
				}
				s, err := h.runCell(cl, p, rep)
				if err != nil {
					h.fail("%s over %s (repetition %d): %v", cl.name, p.name, rep+1, err)
					continue
				}
				if s.errors > 0 {
					fmt.Fprintf(h.o.out, "  (%s over %s, repetition %d: %d failed operations)\n", cl.name, p.name, rep+1, s.errors)
				}
				samples[c][pi] = append(samples[c][pi], s)
			}
		}
	}
	h.printDatapath(paths, cells, samples)
	if len(h.iperfRetried) > 0 {
		whys := slices.Sorted(maps.Keys(h.iperfRetried))
		for i, why := range whys {
			whys[i] = fmt.Sprintf("%d %s", h.iperfRetried[why], why)
		}
		fmt.Fprintf(h.o.out, "\niperf3's server was not ready for some clients (%s); each was retried after 300 ms.\n", strings.Join(whys, "; "))
	}
	return nil
}

// runCell runs one cell over one path, with the CPU and peak RSS of the
// path's process.
func (h *harness) runCell(cl cell, p path, rep int) (sample, error) {
	if cl.fromPod() && p.pod == "" {
		return sample{}, nil // no figure ("–")
	}
	if p.pid != 0 {
		_ = resetPeak(p.pid)
	}
	var prof *proc
	if p.ours && rep == 0 && h.o.profile != "" {
		prof = h.startProfile(p.name + " " + cl.name) // each of our rows has its own
	}
	var cpu0 float64
	if p.pid != 0 {
		cpu0, _ = cpuSeconds(p.pid)
	}
	s, err := cl.run(h, p)
	if prof != nil {
		if perr := prof.wait(h.o.duration + 30*time.Second); perr != nil {
			h.fail("profile of %s: %v", cl.name, perr)
		}
	}
	if err == nil && p.pid != 0 {
		cpu1, _ := cpuSeconds(p.pid)
		s.cpu = cpu1 - cpu0
		s.hwm, _ = memKB(p.pid, "VmHWM")
	}
	return s, err
}

func (h *harness) printDatapath(paths []path, cells []cell, samples [][][]sample) {
	fmt.Fprintf(h.o.out, "## Datapath (medians; in brackets the ratio to the kernel path and, for userproxy, to the best peer: above 1 is more for rates, slower for latencies)\n\n")
	fmt.Fprintf(h.o.out, "| path |")
	for _, cl := range cells {
		fmt.Fprintf(h.o.out, " %s |", cl.name)
	}
	fmt.Fprintf(h.o.out, "\n|---|%s\n", strings.Repeat("---|", len(cells)))
	for pi, p := range paths {
		fmt.Fprintf(h.o.out, "| %s |", p.name)
		if p.why != "" {
			fmt.Fprintf(h.o.out, " not run: %s |%s\n", strings.ReplaceAll(p.why, "|", "/"), strings.Repeat(" – |", len(cells)-1))
			continue
		}
		for c, cl := range cells {
			fmt.Fprintf(h.o.out, " %s |", formatCell(cl, paths, samples[c], pi))
		}
		fmt.Fprintln(h.o.out)
	}
	for pi, p := range paths {
		if p.pid == 0 || p.why != "" {
			continue
		}
		fmt.Fprintf(h.o.out, "| %s: CPU per cell (per operation) / peak RSS |", p.name)
		for c, cl := range cells {
			ss := samples[c][pi]
			if cl.fromPod() && p.pod == "" {
				fmt.Fprintf(h.o.out, " – |")
				continue
			}
			cpu, per := make([]float64, len(ss)), make([]float64, len(ss))
			var hwm int64
			for i, s := range ss {
				cpu[i] = s.cpu
				per[i] = s.cpu / max(s.ops, 1)
				hwm = max(hwm, s.hwm)
			}
			unit, scale := "µs/op", 1e6
			if cl.unit == "Gbit/s" {
				unit, scale = "s/GB", 1e9
			}
			fmt.Fprintf(h.o.out, " %.2f s (%.1f %s) / %.1f MiB |", medianOf(cpu), medianOf(per)*scale, unit, float64(hwm)/1024)
		}
		fmt.Fprintln(h.o.out)
	}
	fmt.Fprintln(h.o.out)
}

// formatCell prints path pi's median of one cell with its ratios: to the
// kernel path, and for userproxy's rows to the best peer (the highest rate,
// the lowest latency) when a peer ran.
func formatCell(cl cell, paths []path, ss [][]sample, pi int) string {
	m := median(ss[pi], false)
	if m == 0 {
		return "–"
	}
	k := median(ss[kernelPath], false)
	latency := cl.unit == "µs"
	best := func(p99 bool) float64 {
		var b float64
		for i, p := range paths {
			v := median(ss[i], p99)
			if !p.peer || v == 0 {
				continue
			}
			if b == 0 || latency && v < b || !latency && v > b {
				b = v
			}
		}
		return b
	}
	ratio := func(a, b float64) string {
		if b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	peer := ""
	switch {
	case latency:
		m99 := median(ss[pi], true)
		if paths[pi].ours && best(false) != 0 {
			peer = fmt.Sprintf("; %s / %s best peer", ratio(m, best(false)), ratio(m99, best(true)))
		}
		out := fmt.Sprintf("%.0f / %.0f µs (%s / %s%s)", m, m99, ratio(m, k), ratio(m99, median(ss[kernelPath], true)), peer)
		if strings.HasSuffix(cl.name, "conns)") {
			// Over many connections, the exchanges per second too.
			rates := make([]float64, len(ss[pi]))
			for i, s := range ss[pi] {
				rates[i] = s.rate
			}
			out += fmt.Sprintf("; %.0f/s", medianOf(rates))
		}
		return out
	case paths[pi].ours && best(false) != 0:
		peer = fmt.Sprintf("; %s best peer", ratio(m, best(false)))
	}
	if cl.unit == "Gbit/s" {
		return fmt.Sprintf("%.2f Gbit/s (%s%s)", m, ratio(m, k), peer)
	}
	return fmt.Sprintf("%.0f (%s%s)", m, ratio(m, k), peer)
}

func median(ss []sample, p99 bool) float64 {
	v := make([]float64, len(ss))
	for i, s := range ss {
		v[i] = s.value
		if p99 {
			v[i] = s.p99
		}
	}
	return medianOf(v)
}

// startProfile asks userproxy for a CPU profile as long as a cell, saved
// as <profile dir>/<row and cell>.pprof.
func (h *harness) startProfile(cell string) *proc {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, cell)
	secs := max(1, int(h.o.duration.Seconds()))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", adminAddr, secs)
	p, err := startProc("profile", "ip", "netns", "exec", h.topo.u, h.self, "fetch", url, filepath.Join(h.o.profile, name+".pprof"))
	if err != nil {
		h.fail("profile of %s: %v", cell, err)
		return nil
	}
	return p
}

package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// A path is one way for the client to reach the endpoints.
type path struct {
	name            string
	ns              string
	tcp, udp, iperf string // targets
	proxied         bool   // userproxy's CPU and RSS are read for it
}

// A sample is one cell's figures of one repetition.
type sample struct {
	value, p99 float64 // the cell's figure; p99 latency for the RR cell
	cpu        float64 // userproxy CPU seconds during the cell
	hwm        int64   // userproxy peak RSS during the cell, KiB
	errors     int64
	ops        float64 // operations (bits for the bulk cell) in the cell, for CPU per op
}

type cell struct {
	name, unit string
	run        func(h *harness, p path) (sample, error)
}

func (h *harness) paths() []path {
	return []path{
		{name: "veth, no NAT (direct)", ns: h.topo.k, tcp: endpointAddr(0) + ":8080", udp: endpointAddr(0) + ":5353", iperf: endpointAddr(0) + ":5201"},
		{name: "kernel iptables (kube-proxy rules)", ns: h.topo.k, tcp: tcpService, udp: udpService, iperf: iperfService},
		{name: "userproxy (TUN)", ns: h.topo.u, tcp: tcpService, udp: udpService, iperf: iperfService, proxied: true},
		{name: "userproxy (NodePort on 127.0.0.1)", ns: h.topo.u, tcp: fmt.Sprintf("127.0.0.1:%d", nodePortTCP),
			udp: fmt.Sprintf("127.0.0.1:%d", nodePortUDP), iperf: fmt.Sprintf("127.0.0.1:%d", nodePortIperf), proxied: true},
	}
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
	secs := fmt.Sprintf("%d", max(1, int(d.Seconds()+0.5)))
	limit := d + 30*time.Second
	return []cell{
		{"TCP 1 stream", "Gbit/s", func(h *harness, p path) (sample, error) {
			host, port, _ := strings.Cut(p.iperf, ":")
			out, err := inNS(p.ns, limit, "iperf3", "-c", host, "-p", port, "-t", secs, "-J")
			if err != nil {
				return sample{}, err
			}
			var r struct {
				End struct {
					SumReceived struct {
						BitsPerSecond float64 `json:"bits_per_second"`
						Bytes         float64 `json:"bytes"`
					} `json:"sum_received"`
				} `json:"end"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal(out, &r); err != nil {
				return sample{}, fmt.Errorf("iperf3 output: %w", err)
			}
			if r.Error != "" {
				return sample{}, fmt.Errorf("iperf3: %s", r.Error)
			}
			return sample{value: r.End.SumReceived.BitsPerSecond / 1e9, ops: r.End.SumReceived.Bytes}, nil
		}},
		{"TCP conn/s (64 workers)", "conn/s", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "conn", "-target", p.tcp, "-workers", "64", "-duration", d.String())
			return sample{value: r.Rate, errors: r.Errors, ops: float64(r.Ops)}, err
		}},
		{"RR p50 / p99 (one conn)", "µs", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "rr", "-target", p.tcp, "-duration", d.String())
			return sample{value: r.P50us, p99: r.P99us, errors: r.Errors, ops: float64(r.Ops)}, err
		}},
		{"UDP RR/s (16 in flight)", "RR/s", func(h *harness, p path) (sample, error) {
			r, err := h.load(p.ns, limit, "-mode", "udp", "-target", p.udp, "-workers", "16", "-duration", d.String())
			return sample{value: r.Rate, errors: r.Errors, ops: float64(r.Ops)}, err
		}},
	}
}

// datapath runs every cell on every path, repetition by repetition
// (interleaved, so a slow minute of the machine touches all paths alike),
// and prints the medians with their ratio to the kernel path.
func (h *harness) datapath() error {
	paths, cells := h.paths(), h.cells()
	samples := make([][][]sample, len(cells)) // [cell][path][rep]
	for c := range cells {
		samples[c] = make([][]sample, len(paths))
	}
	pid := h.proxy.cmd.Process.Pid
	for rep := range h.o.reps {
		for c, cl := range cells {
			for pi, p := range paths {
				if p.proxied {
					_ = resetPeak(pid)
				}
				var prof *proc
				if p.proxied && rep == 0 && h.o.profile != "" {
					prof = h.startProfile(cl.name)
				}
				cpu0, _ := cpuSeconds(pid)
				s, err := cl.run(h, p)
				if prof != nil {
					if perr := prof.wait(h.o.duration + 30*time.Second); perr != nil {
						h.fail("profile of %s: %v", cl.name, perr)
					}
				}
				if err != nil {
					h.fail("%s over %s (repetition %d): %v", cl.name, p.name, rep+1, err)
					continue
				}
				if p.proxied {
					cpu1, _ := cpuSeconds(pid)
					s.cpu = cpu1 - cpu0
					s.hwm, _ = memKB(pid, "VmHWM")
				}
				if s.errors > 0 {
					fmt.Fprintf(h.o.out, "  (%s over %s, repetition %d: %d failed operations)\n", cl.name, p.name, rep+1, s.errors)
				}
				samples[c][pi] = append(samples[c][pi], s)
			}
		}
	}

	fmt.Fprintf(h.o.out, "## Datapath (medians; in brackets the ratio to the kernel path)\n\n")
	fmt.Fprintf(h.o.out, "| path |")
	for _, cl := range cells {
		fmt.Fprintf(h.o.out, " %s |", cl.name)
	}
	fmt.Fprintf(h.o.out, "\n|---|%s\n", strings.Repeat("---|", len(cells)))
	const kernel = 1
	for pi, p := range paths {
		fmt.Fprintf(h.o.out, "| %s |", p.name)
		for c, cl := range cells {
			m, k := median(samples[c][pi], false), median(samples[c][kernel], false)
			switch {
			case m == 0:
				fmt.Fprintf(h.o.out, " – |")
			case cl.unit == "µs":
				fmt.Fprintf(h.o.out, " %.0f / %.0f µs (%.2fx / %.2fx) |", m, median(samples[c][pi], true),
					m/k, median(samples[c][pi], true)/median(samples[c][kernel], true))
			case cl.unit == "Gbit/s":
				fmt.Fprintf(h.o.out, " %.2f Gbit/s (%.2fx) |", m, m/k)
			default:
				fmt.Fprintf(h.o.out, " %.0f (%.2fx) |", m, m/k)
			}
		}
		fmt.Fprintln(h.o.out)
	}
	for pi, p := range paths {
		if !p.proxied {
			continue
		}
		fmt.Fprintf(h.o.out, "| %s: CPU per cell (per operation) / peak RSS |", p.name)
		for c, cl := range cells {
			ss := samples[c][pi]
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
	return nil
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
// as <profile dir>/<cell>.pprof.
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

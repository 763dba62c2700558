package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// memory holds o.hold UDP flows, then as many idle proxied TCP
// connections, and reports userproxy's RSS growth per flow and per
// connection;
// then the bytes one conntrack entry costs (measured in this process).
func (h *harness) memory() error {
	pid := h.proxy.cmd.Process.Pid
	fmt.Fprintf(h.o.out, "## Memory\n\n| what | userproxy RSS before | with them | per item |\n|---|---|---|---|\n")
	for _, m := range []struct{ what, mode, target string }{
		// UDP first: the Go heap keeps what the TCP connections freed, and
		// the flows would fit in it unmeasured.
		{fmt.Sprintf("%d UDP flows", h.o.hold), "holdudp", udpService},
		{fmt.Sprintf("%d idle proxied TCP connections", h.o.hold), "hold", tcpService},
	} {
		before, err := memKB(pid, "VmRSS")
		if err != nil {
			return err
		}
		p, err := startProc("load "+m.mode, "ip", "netns", "exec", h.topo.u, h.self, "load", "-mode", m.mode,
			"-target", m.target, "-count", strconv.Itoa(h.o.hold), "-workers", "32")
		if err != nil {
			return err
		}
		l, err := p.line(2 * time.Minute)
		if err != nil {
			_ = p.stop(5 * time.Second)
			return err
		}
		var r loadResult
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			_ = p.stop(5 * time.Second)
			return fmt.Errorf("%s: %q: %w", m.mode, l, err)
		}
		time.Sleep(time.Second) // let the proxy settle (splice buffers, GC)
		with, err := memKB(pid, "VmRSS")
		_ = p.stop(10 * time.Second)
		if err != nil {
			return err
		}
		if r.Errors > 0 {
			h.fail("%s: %d of %d failed (first: %s)", m.what, r.Errors, h.o.hold, r.FirstEr)
		}
		per := float64(with-before) * 1024 / float64(max(r.Ops, 1))
		fmt.Fprintf(h.o.out, "| %s | %.1f MiB | %.1f MiB | %.1f KiB |\n", m.what, float64(before)/1024, float64(with)/1024, per/1024)
		time.Sleep(2 * time.Second) // the connections drain before the next row
	}
	per, err := conntrackEntryBytes(100000)
	if err != nil {
		return err
	}
	fmt.Fprintf(h.o.out, "| 100000 conntrack entries (UDP, in process: Go heap) | | | %.0f B |\n\n", per)
	return nil
}

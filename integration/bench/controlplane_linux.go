package main

import (
	"fmt"
	"os"
	"time"
)

// controlPlane prints, per table size, userproxy's build time (in this
// process) beside the kernel's iptables-restore of the same rules into K,
// one endpoint change, and then the first-packet (connect) latency to the
// first and to the last of the largest set of services on both paths.
func (h *harness) controlPlane() error {
	fmt.Fprintf(h.o.out, "## Control plane\n\n| services x 10 endpoints | userproxy: build and swap the table | userproxy: objects converted + build | userproxy: one endpoint change | kernel: iptables-restore of the same rules |\n|---|---|---|---|---|\n")
	restoreLimit := 5 * time.Minute
	if h.o.short {
		restoreLimit = time.Minute
	}
	kernelOK := true
	for _, n := range h.o.services {
		build, total, change, err := tableBuild(n, 3)
		if err != nil {
			return err
		}
		if err := os.WriteFile(h.cfg, []byte(benchConfig(n)), 0o644); err != nil {
			return err
		}
		restore := "not run (an earlier size timed out)"
		if kernelOK {
			d, err := h.loadKernelRules(restoreLimit)
			if err != nil {
				kernelOK = false
				restore = fmt.Sprintf("over %v (stopped)", restoreLimit)
			} else {
				restore = d.Round(time.Millisecond).String()
			}
		}
		fmt.Fprintf(h.o.out, "| %d | %v | %v | %v | %s |\n", n, build.Round(10*time.Microsecond), total.Round(10*time.Microsecond), change.Round(time.Microsecond), restore)
	}
	n := h.o.services[len(h.o.services)-1]
	first, last := manyIP(0)+":80", manyIP(n-1)+":80"
	// userproxy reloads the file by itself; wait until the last service answers.
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := h.load(h.topo.u, 10*time.Second, "-mode", "lat", "-targets", last, "-count", "1"); err == nil {
			break
		} else if time.Now().After(deadline) {
			return fmt.Errorf("userproxy did not serve the last of %d services within a minute: %w", n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	count := "300"
	if h.o.short {
		count = "50"
	}
	fmt.Fprintf(h.o.out, "\nFirst-packet cost with %d services: connect latency (SYN to established, through the proxy's endpoint dial), p50 of %s:\n\n| path | first service | last service |\n|---|---|---|\n", n, count)
	for _, p := range []struct {
		name, ns string
		ok       bool
	}{{"kernel iptables", h.topo.k, kernelOK}, {"userproxy (TUN)", h.topo.u, true}} {
		if !p.ok {
			fmt.Fprintf(h.o.out, "| %s | – | – |\n", p.name)
			continue
		}
		r, err := h.load(p.ns, 5*time.Minute, "-mode", "lat", "-targets", first+","+last, "-count", count)
		if err != nil {
			h.fail("first-packet latency over %s: %v", p.name, err)
			continue
		}
		fmt.Fprintf(h.o.out, "| %s | %.0f µs | %.0f µs |\n", p.name, r.PerTarget[first], r.PerTarget[last])
	}
	fmt.Fprintln(h.o.out)
	return nil
}

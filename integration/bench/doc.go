// Command bench is the side-by-side benchmark harness: it builds a client
// namespace -> veth -> backends namespace topology (no route out), and
// measures the same work over three paths in one run, interleaved:
//
//   - direct: the client dials an endpoint itself (no service, no NAT);
//   - kernel: the client dials the ClusterIP and the kernel's iptables
//     rules, exactly what `userproxy rules` prints for the config, DNAT it
//     (kube-proxy's iptables mode);
//   - userproxy: the client dials the ClusterIP and the real binary on a
//     TUN proxies it.
//
// Cells: TCP single-stream throughput (iperf3), TCP connections per second
// (connect, 64 B each way, close; 64 workers), request/response latency on
// one connection (64 B), UDP request/response per second (16 in flight).
// Each cell reports the median of its repetitions and the ratio to the
// kernel path; userproxy's CPU seconds and peak RSS are read from /proc.
// Then the control plane (table build for 1k/5k/10k services x 10
// endpoints, one endpoint change, first-packet latency to the first and the
// last of many services) and memory (RSS per idle proxied TCP connection
// and per UDP flow, bytes per conntrack entry).
//
// Usage (root, from the repository root): go run ./integration/bench
// [-short] [-reps N] [-duration D]. `make bench-harness` runs it; the test
// in this package runs it in short mode in CI.
//
// The same executable plays every role: run as "bench serve" it is the
// backends, as "bench load" the load generator inside a client namespace.
// Every loop is bounded by a deadline; namespaces and processes it made are
// removed by name and PID when it ends.
package main

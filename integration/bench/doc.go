// Command bench is the side-by-side benchmark harness: it builds a client
// namespace -> veth -> backends namespace topology (no route out), and
// measures the same work over these paths in one run, interleaved:
//
//   - direct: the client dials an endpoint itself (no service, no NAT);
//   - kernel: the client dials the ClusterIP and the kernel's iptables
//     rules, exactly what `userproxy rules` prints for the config, DNAT it
//     (kube-proxy's iptables mode);
//   - the userspace peers, where installed: pasta (Debian's passt: a tap
//     device in the client's namespace, its sockets in another) and
//     tun2socks (gVisor over a TUN, its "direct" proxy); their sockets meet
//     the same kernel rules, so their client dials the same ClusterIPs;
//   - userproxy: the client dials the ClusterIP and the real binary on a
//     TUN proxies it (and its NodePort on 127.0.0.1).
//
// Cells: connect latency (one client, sequential connects, p50/p99 of SYN
// to established), TCP single-stream throughput up (client to endpoint)
// and down (iperf3 -R), TCP connections per second (connect, 64 B each
// way, close; 64 workers), request/response latency on one connection
// (64 B), UDP request/response per second (16 in flight). Each cell
// reports the median of its repetitions, the ratio to the kernel path and,
// for userproxy, the ratio to the best peer; the CPU seconds (per cell and
// per operation) and peak RSS of every path's process (pasta, tun2socks,
// userproxy) are read from /proc. A peer not installed, or not answering,
// is named in the output with the reason, and its row says so. Then the
// control plane (table build for 1k/5k/10k services x 10
// endpoints, one endpoint change, first-packet latency to the first and the
// last of many services) and memory (RSS per idle proxied TCP connection
// and per UDP flow, bytes per conntrack entry).
//
// The peers: `apt-get install passt` (pasta); tun2socks v2.7.0 from the Go
// module proxy, as .ci/run builds it into GOPATH/bin; or -pasta and
// -tun2socks name the binaries.
//
// Usage (root, from the repository root): go run ./integration/bench
// [-short] [-reps N] [-duration D]. `make bench-harness` runs it; the test
// in this package runs it in short mode in CI.
//
// The same executable plays every role: run as "bench serve" it is the
// backends, as "bench load" the load generator inside a client namespace,
// as "bench tunexec" the opener of tun2socks' TUN.
// Every loop is bounded by a deadline; namespaces and processes it made are
// removed by name and PID when it ends.
package main

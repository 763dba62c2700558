// Package balancer chooses an endpoint for a new connection the way
// kube-proxy's iptables rules and the Linux kernel do: the telescoping
// 1/(n-i) cascade of `-m statistic --mode random` rules (Lottery), and
// ClientIP session affinity modelled on xt_recent (Affinity), tied together
// per service port by Picker.
//
// A Service may instead ask for one of IPVS's schedulers (Scheduler, named
// by ParseScheduler), each with the semantics of the kernel's
// net/netfilter/ipvs/ip_vs_<name>.c over the endpoints in kube-proxy order:
//
//   - rr: round robin; the cursor stays on the endpoint picked last, also
//     across list changes (ip_vs_rr.c).
//   - wrr: weighted round robin, passes of falling current weight stepped
//     by the weights' gcd; a list change restarts at the head (ip_vs_wrr.c).
//   - lc, wlc: the least connection overhead, active*256 + inactive, the
//     second divided by weight (ip_vs_lc.c, ip_vs_wlc.c).
//   - sed, nq: the shortest expected delay, (active+1)/weight; nq first
//     takes any endpoint with no active connection (ip_vs_sed.c,
//     ip_vs_nq.c).
//   - sh, dh: a 256-bucket table by the client's (sh) or the service's
//     (dh) address, the golden-ratio multiplicative hash; sh-port and
//     sh-fallback as ipvsadm's flags (ip_vs_sh.c, ip_vs_dh.c).
//   - mh: Maglev, a 4093-slot lookup table filled from per-endpoint
//     permutations by the kernel's hsiphash with its fixed keys; mh-port
//     and mh-fallback (ip_vs_mh.c).
//
// Weights are 1 (EndpointSlices carry none) but work as the kernel's. Ties
// go to the endpoint first in the list, as the kernel's loops leave them.
// The connection counts the least-connection schedulers read are Conns, one
// per endpoint, which the proxy moves at O(1) per flow event: a flow opens
// inactive, is active while its TCP state is ESTABLISHED, and UDP flows
// stay inactive.
//
// Callers: proxy (per new flow) and cmd (the demo and `userproxy rules`).
//
// It is pure: plain Go over plain values, no sockets, no logging, no
// goroutines. Randomness (a 31-bit source) and time (a Clock) are injected.
// It must import no other userproxy package and no third-party module.
package balancer

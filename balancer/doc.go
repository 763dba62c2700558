// Package balancer chooses an endpoint for a new connection the way
// kube-proxy's iptables rules and the Linux kernel do: the telescoping
// 1/(n-i) cascade of `-m statistic --mode random` rules (Lottery), and
// ClientIP session affinity modelled on xt_recent (Affinity), tied together
// per service port by Picker.
//
// Callers: proxy (per new flow) and cmd (the demo and `userproxy rules`).
//
// It is pure: plain Go over plain values, no sockets, no logging, no
// goroutines. Randomness (a 31-bit source) and time (a Clock) are injected.
// It must import no other userproxy package and no third-party module.
package balancer

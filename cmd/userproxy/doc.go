// Command userproxy is the userspace Kubernetes Service proxy's binary: flag
// parsing, the logger, the wiring of the packages, and the subcommands.
//
// Today it has `demo` (the balancer on simulated connections, until the
// datapath lands) and `version`; `run`, `setup`, `conntrack` and `rules`
// follow DESIGN.md section 5. It may import any userproxy package.
package main

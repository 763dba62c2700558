// Package conntrack is an in-process connection tracking table with the
// Linux kernel's semantics: packet parsing, tuples, the TCP state machine with
// window tracking, UDP timeouts, INVALID classification, and a sharded,
// bounded table whose expiry is driven by an injected clock.
//
// Callers: the gate in netstack (every packet, both directions, concurrently),
// proxy (binding flows to endpoints, deleting entries on endpoint removal) and
// admin (listing).
//
// It is pure: bytes and tuples in, verdicts and entries out. It must import no
// other userproxy package and no third-party module; it never logs.
package conntrack

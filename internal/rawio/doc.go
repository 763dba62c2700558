// Package rawio makes system calls on non-blocking descriptors without
// telling the Go scheduler: the packet path's reads and writes, shared by
// netstack (the TUN) and proxy (the endpoint sockets). Linux only.
//
// A read, write or zero-timeout epoll_wait on a non-blocking descriptor
// does not wait for a peer, so it needs none of what syscall.Syscall does
// around a call that may (entersyscall, exitsyscall). And one part of that
// costs: while every P is idle, the runtime's sysmon thread sleeps until it
// is woken, and the first entersyscall after such an idle spell wakes it
// with a futex (entersyscallWakeSysmon, runtime/proc.go); it then sleeps
// 20 µs and goes back to its deep sleep. A proxy on a request/response flow
// is idle between every two packets, so each exchange of the harness's RR
// cell paid 1.3 futex wake-ups and 1.25 sysmon nanosleeps (BENCHMARKS.md).
// The callers still wait in the runtime's poller.
//
// A raw call keeps its P for its whole length, out of sysmon's reach: use it
// for a packet's worth, not for a bulk copy (proxy's maxRawIO).
package rawio

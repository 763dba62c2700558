package proxy

// System calls on non-blocking sockets, made without telling the scheduler.
//
// A read, write, recvmmsg or zero-timeout epoll_wait on a non-blocking
// descriptor does not wait for a peer, so it needs none of what
// syscall.Syscall does around a call that may (entersyscall, exitsyscall).
// And one part of that costs: while every P is idle, the runtime's sysmon
// thread sleeps until it is woken, and the first entersyscall after such an
// idle spell wakes it with a futex (entersyscallWakeSysmon, runtime/proc.go);
// it then sleeps 20 µs and goes back to its deep sleep. A proxy on a
// request/response flow is idle between every two packets, so each exchange
// of the harness's RR cell paid 1.3 futex wake-ups and 1.25 sysmon
// nanosleeps (BENCHMARKS.md). The callers still wait in the runtime's poller.
//
// A raw call keeps its P for its whole length, out of sysmon's reach, and the
// length of a socket call is its copy and the kernel's work on the packet
// (on a veth or loopback, the peer's receive too). So only calls of at most
// maxRawIO bytes are raw: a packet's worth, which is what an idle spell is
// followed by; a bulk copy of up to 1 MiB (the splice's large buffer) is made
// with a plain call, whose P sysmon can hand to other work meanwhile.

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxRawIO is the largest read or write made raw: a TUN packet or a TCP
// super-segment.
const maxRawIO = 64 << 10

// readRaw is read(2) on a non-blocking descriptor.
func readRaw(fd uintptr, b []byte) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// writeRaw is write(2) on a non-blocking descriptor.
func writeRaw(fd uintptr, b []byte) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// writeNoWait writes b to a non-blocking socket once (udpSender).
func writeNoWait(fd uintptr, b []byte) (int, error) {
	n, errno := writeRaw(fd, b)
	if errno != 0 {
		return 0, errno
	}
	return n, nil
}

// epollWaitNoWait is epoll_wait(2) with a zero timeout (replyPoller), made
// as epoll_pwait with no signal mask: arm64 and riscv64 have no epoll_wait.
func epollWaitNoWait(epfd uintptr, events []syscall.EpollEvent) (int, error) {
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, epfd, uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

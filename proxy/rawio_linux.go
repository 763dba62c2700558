package proxy

// System calls on non-blocking sockets, made without telling the scheduler.
//
// A read, write, recvmmsg or zero-timeout epoll_wait on a non-blocking
// descriptor never sleeps, so it needs none of what syscall.Syscall does
// around a call that might (entersyscall, exitsyscall). And one part of that
// costs: while every P is idle, the runtime's sysmon thread sleeps until it is
// woken, and the first entersyscall after such an idle spell wakes it with a
// futex (entersyscallWakeSysmon, runtime/proc.go); it then sleeps 20 µs and
// goes back to its deep sleep. A proxy on a request/response flow is idle
// between every two packets, so each exchange of the harness's RR cell paid
// 1.3 futex wake-ups and 1.25 sysmon nanosleeps (BENCHMARKS.md). A raw call
// keeps the P for its length, which for these is the kernel's own work on
// the packet; the runtime's poller is still where the callers wait.

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawRead is read(2) on a non-blocking descriptor.
func rawRead(fd uintptr, b []byte) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// rawWrite is write(2) on a non-blocking descriptor.
func rawWrite(fd uintptr, b []byte) (int, unix.Errno) {
	n, _, errno := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// writeNoWait writes b to a non-blocking socket once (udpSender).
func writeNoWait(fd uintptr, b []byte) (int, error) {
	n, errno := rawWrite(fd, b)
	if errno != 0 {
		return 0, errno
	}
	return n, nil
}

// epollWaitNoWait is epoll_wait(2) with a zero timeout (replyPoller).
func epollWaitNoWait(epfd uintptr, events []syscall.EpollEvent) (int, error) {
	n, _, errno := unix.RawSyscall6(unix.SYS_EPOLL_WAIT, epfd, uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

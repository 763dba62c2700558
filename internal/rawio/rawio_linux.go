package rawio

import (
	"syscall"
	"unsafe"
)

// Read is read(2) on a non-blocking descriptor.
func Read(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// Write is write(2) on a non-blocking descriptor.
func Write(fd uintptr, b []byte) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	return int(n), errno
}

// EpollWaitNoWait is epoll_wait(2) with a zero timeout, made as epoll_pwait
// with no signal mask: arm64 and riscv64 have no epoll_wait.
func EpollWaitNoWait(epfd uintptr, events []syscall.EpollEvent) (int, syscall.Errno) {
	n, _, errno := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, epfd, uintptr(unsafe.Pointer(unsafe.SliceData(events))), uintptr(len(events)), 0, 0, 0)
	return int(n), errno
}

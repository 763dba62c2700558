//go:build !linux

package proxy

import "syscall"

// writeNoWait writes b to a non-blocking socket once (udpSender); on Linux
// without telling the scheduler (rawio_linux.go).
func writeNoWait(fd uintptr, b []byte) (int, error) {
	return syscall.Write(int(fd), b)
}

package proxy

// The endpoint sockets' system calls on the packet path are raw
// (internal/rawio): they do not wake the runtime's sysmon thread after an
// idle spell.
//
// A raw call keeps its P for its whole length, out of sysmon's reach, and the
// length of a socket call is its copy and the kernel's work on the packet
// (on a veth or loopback, the peer's receive too). So only calls of at most
// maxRawIO bytes are raw: a packet's worth, which is what an idle spell is
// followed by; a bulk copy of up to 1 MiB (the splice's large buffer) is made
// with a plain call, whose P sysmon can hand to other work meanwhile.

import "github.com/userproxy/userproxy/internal/rawio"

// maxRawIO is the largest read or write made raw: a TUN packet or a TCP
// super-segment.
const maxRawIO = 64 << 10

// writeNoWait writes b to a non-blocking socket once (udpSender).
func writeNoWait(fd uintptr, b []byte) (int, error) {
	n, errno := rawio.Write(fd, b)
	if errno != 0 {
		return 0, errno
	}
	return n, nil
}

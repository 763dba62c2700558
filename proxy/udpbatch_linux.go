package proxy

// The reply poller's batch reads (Linux): one recvmmsg(2) takes what a
// readable endpoint socket holds, up to replyBatchLen datagrams, where a
// read(2) per datagram would end with one more read that fails with EAGAIN:
// in the UDP RR cell, a sixth of the system calls of an exchange.

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// replyBatchLen is the most datagrams one recvmmsg takes.
const replyBatchLen = 8

// mmsghdr is struct mmsghdr (include/linux/socket.h): Go pads it as C does.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

// replyBatch is the poller goroutine's own: replyBatchLen buffers of
// maxDatagram, taken when the poller starts and returned when it ends.
type replyBatch struct {
	bufs [replyBatchLen]*[]byte
	iovs [replyBatchLen]unix.Iovec
	msgs [replyBatchLen]mmsghdr
}

func newReplyBatch() *replyBatch {
	b := &replyBatch{}
	for i := range b.bufs {
		b.bufs[i] = udpPool.Get().(*[]byte)
		b.iovs[i].Base = &(*b.bufs[i])[0]
		b.iovs[i].SetLen(len(*b.bufs[i]))
		b.msgs[i].hdr.Iov = &b.iovs[i]
		b.msgs[i].hdr.SetIovlen(1)
	}
	return b
}

func (b *replyBatch) release() {
	for i, bp := range b.bufs {
		udpPool.Put(bp)
		b.bufs[i] = nil
	}
}

// recvmmsg reads up to len(b.msgs) datagrams from fd without waiting (a
// raw system call: rawio_linux.go).
func (b *replyBatch) recvmmsg(fd uintptr) (int, syscall.Errno) {
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.msgs[0])), uintptr(len(b.msgs)),
		unix.MSG_DONTWAIT, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), 0
}

// relayBatch is relayOnce without waiting, on the poller's goroutine, with
// its batch: it returns when the socket is empty or after pollBatch
// datagrams, and reports false once the socket or the client's side was
// closed. Errors are taken as relayOnce takes them.
func (u *udpFlow) relayBatch(b *replyBatch) bool {
	u.relayMu.Lock()
	defer u.relayMu.Unlock()
	if u.paused { // handed over (an event fetched before it left the poller)
		return true
	}
	ok := true
	err := u.rc.Read(func(fd uintptr) bool {
		for relayed := 0; relayed < pollBatch; {
			n, errno := b.recvmmsg(fd)
			switch {
			case errno == syscall.EINTR, errno == syscall.ECONNREFUSED:
				continue
			case errno == syscall.EAGAIN:
				return true
			case errno != 0:
				ok = false
				return true
			}
			for i := range n {
				if !u.reply((*b.bufs[i])[:b.msgs[i].len]) {
					ok = false
					return true
				}
			}
			relayed += n
			if n < len(b.msgs) { // taken without waiting: the socket had no more
				return true
			}
		}
		return true
	})
	return ok && err == nil
}

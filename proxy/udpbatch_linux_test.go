package proxy

import (
	"bytes"
	"os"
	"syscall"
	"testing"
)

// TestReplyBatchTakesWhatTheSocketHolds: one recvmmsg takes up to
// replyBatchLen datagrams, whole and in order (empty to 65,507 bytes), the
// next takes the rest, and the one after finds the socket empty.
func TestReplyBatchTakesWhatTheSocketHolds(t *testing.T) {
	// A datagram socket pair: a send is queued on the peer before it
	// returns (no softirq that could defer it, as loopback UDP's can).
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_DGRAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	rx, tx := os.NewFile(uintptr(fds[0]), "rx"), os.NewFile(uintptr(fds[1]), "tx")
	defer rx.Close()
	defer tx.Close()
	for _, fd := range fds {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4<<20); err != nil {
			t.Fatal(err)
		}
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<20); err != nil {
			t.Fatal(err)
		}
	}
	sizes := []int{0, 1, 100, 1472, 9000, 65507, 2, 3, 4, 5, 6}
	datagram := func(i int) []byte {
		b := make([]byte, sizes[i])
		for j := range b {
			b[j] = byte(i + j)
		}
		return b
	}
	for i := range sizes {
		if _, err := syscall.Write(fds[1], datagram(i)); err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
	b := newReplyBatch()
	defer b.release()
	rc, err := rx.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var calls []int
	next := 0
	err = rc.Read(func(fd uintptr) bool {
		for range 4 {
			n, errno := b.recvmmsg(fd)
			if errno == syscall.EAGAIN {
				calls = append(calls, -1)
				return true
			}
			if errno != 0 {
				t.Fatalf("recvmmsg: %v", errno)
			}
			calls = append(calls, n)
			for i := range n {
				if got := (*b.bufs[i])[:b.msgs[i].len]; !bytes.Equal(got, datagram(next)) {
					t.Fatalf("datagram %d: %d bytes, want %d, or different bytes", next, len(got), sizes[next])
				}
				next++
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 3 || calls[0] != replyBatchLen || calls[1] != len(sizes)-replyBatchLen || calls[2] != -1 {
		t.Fatalf("recvmmsg calls took %v datagrams (-1: EAGAIN), want [%d %d -1]", calls, replyBatchLen, len(sizes)-replyBatchLen)
	}
}

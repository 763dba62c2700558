package proxy

import (
	"bytes"
	"net"
	"syscall"
	"testing"
)

// TestReplyBatchTakesWhatTheSocketHolds: one recvmmsg takes up to
// replyBatchLen datagrams, whole and in order (empty to 65,507 bytes), the
// next takes the rest, and the one after finds the socket empty.
func TestReplyBatchTakesWhatTheSocketHolds(t *testing.T) {
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	if err := rx.SetReadBuffer(4 << 20); err != nil {
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	sizes := []int{0, 1, 100, 1472, 9000, 65507, 2, 3, 4, 5, 6}
	datagram := func(i int) []byte {
		b := make([]byte, sizes[i])
		for j := range b {
			b[j] = byte(i + j)
		}
		return b
	}
	for i := range sizes {
		if _, err := tx.Write(datagram(i)); err != nil {
			t.Fatal(err)
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

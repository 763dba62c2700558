package proxy

// The reply poller (Linux): the endpoint sockets of every UDP flow wait for
// datagrams in one epoll set, on one goroutine, so that an idle UDP flow
// costs neither a goroutine nor a buffer.
//
//  1. add registers a flow's endpoint socket (level-triggered EPOLLIN, the
//     flow's id as the event's data); the socket stays in Go's own poller
//     too, where nothing waits on it.
//  2. The poller goroutine waits for the epoll set in the runtime's own
//     poller (the set's descriptor is readable while it has events), takes
//     the events with a non-blocking epoll_wait; for each readable socket it
//     drains the socket through its syscall.RawConn (so a socket closed
//     meanwhile fails cleanly instead of reading a reused descriptor), a
//     batch of datagrams per recvmmsg (udpbatch_linux.go), and writes each
//     datagram to the client; a failed socket ends the flow.
//  3. remove takes the socket out before the flow closes it; ids are never
//     reused, so an event already fetched for a removed flow finds nothing.
//  4. Run's end wakes the poller through a pipe; it ends the flows it still
//     holds (nothing would relay their replies), closes its descriptors,
//     and later flows fall back to a goroutine of their own.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/userproxy/userproxy/internal/rawio"
)

type replyPoller struct {
	epfd int
	epf  *os.File        // epfd in the runtime's poller: the goroutine waits there
	eprc syscall.RawConn // of epf
	wake [2]int          // pipe: a byte on wake[1] stops the loop

	mu      sync.Mutex
	running bool
	flows   map[uint64]*udpFlow
	next    uint64 // ids start at 1; 0 is the wake pipe

	err error // why run stopped before Run's end, if it did; read after run returns
}

func newReplyPoller() (*replyPoller, error) {
	epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("proxy: epoll_create1: %w", err)
	}
	rp := &replyPoller{epfd: epfd, flows: make(map[uint64]*udpFlow), running: true}
	// The epoll descriptor is readable while it has events: the runtime's
	// poller waits for that, and the goroutine parks instead of holding a
	// thread in epoll_wait.
	if err := syscall.SetNonblock(epfd, true); err != nil {
		syscall.Close(epfd)
		return nil, fmt.Errorf("proxy: epoll descriptor: %w", err)
	}
	rp.epf = os.NewFile(uintptr(epfd), "udp-reply-epoll")
	rc, err := rp.epf.SyscallConn()
	if err != nil {
		rp.epf.Close()
		return nil, fmt.Errorf("proxy: epoll descriptor: %w", err)
	}
	rp.eprc = rc
	if err := syscall.Pipe2(rp.wake[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		rp.epf.Close()
		return nil, fmt.Errorf("proxy: pipe2: %w", err)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN}
	if err := syscall.EpollCtl(epfd, syscall.EPOLL_CTL_ADD, rp.wake[0], &ev); err != nil {
		rp.closeFDs()
		return nil, fmt.Errorf("proxy: epoll_ctl: %w", err)
	}
	return rp, nil
}

func (rp *replyPoller) closeFDs() {
	rp.epf.Close()
	syscall.Close(rp.wake[0])
	syscall.Close(rp.wake[1])
}

var errPollerStopped = errors.New("proxy: the reply poller is not running")

// add registers u's endpoint socket (step 1). It fails when the poller is
// not running; the flow then relays on a goroutine of its own.
func (rp *replyPoller) add(u *udpFlow, rc syscall.RawConn) (remove func(), err error) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if !rp.running {
		return nil, errPollerStopped
	}
	rp.next++
	id := rp.next
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(uint32(id)), Pad: int32(uint32(id >> 32))}
	var ctlErr error
	if err := rc.Control(func(fd uintptr) { ctlErr = syscall.EpollCtl(rp.epfd, syscall.EPOLL_CTL_ADD, int(fd), &ev) }); err != nil {
		return nil, err
	}
	if ctlErr != nil {
		return nil, fmt.Errorf("proxy: epoll_ctl: %w", ctlErr)
	}
	rp.flows[id] = u
	return func() { rp.remove(id, rc) }, nil
}

// remove takes flow id out (step 3).
func (rp *replyPoller) remove(id uint64, rc syscall.RawConn) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if _, ok := rp.flows[id]; !ok {
		return
	}
	delete(rp.flows, id)
	if rp.running {
		_ = rc.Control(func(fd uintptr) { _ = syscall.EpollCtl(rp.epfd, syscall.EPOLL_CTL_DEL, int(fd), nil) })
	}
}

// run is the poller goroutine (steps 2 and 4); call it once.
func (rp *replyPoller) run(ctx context.Context) { // UDP reply poller
	woke := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_, _ = syscall.Write(rp.wake[1], []byte{0})
		close(woke)
	})
	events := make([]syscall.EpollEvent, 128)
	batch := newReplyBatch()
	defer batch.release()
	var n int
	var werr error
	wait := func(fd uintptr) bool {
		for {
			var errno syscall.Errno
			n, errno = rawio.EpollWaitNoWait(fd, events) // raw: rawio's doc
			switch errno {
			case syscall.EINTR:
				continue
			case 0:
				return n > 0 // none yet: park until epfd is readable
			}
			werr = errno
			return true
		}
	}
	for {
		if err := rp.eprc.Read(wait); err != nil || werr != nil {
			rp.err = errors.Join(err, werr) // Run logs it
			break
		}
		woken := false
		for i := range n {
			id := uint64(uint32(events[i].Fd)) | uint64(uint32(events[i].Pad))<<32
			if id == 0 {
				woken = true
				continue
			}
			rp.mu.Lock()
			u := rp.flows[id]
			rp.mu.Unlock()
			if u != nil && !u.relayBatch(batch) {
				u.finish(false)
			}
		}
		if woken {
			break
		}
	}
	if !stop() {
		<-woke // no wake-up may be written once the pipe is closed
	}
	rp.mu.Lock()
	rp.running = false
	left := make([]*udpFlow, 0, len(rp.flows))
	for _, u := range rp.flows {
		left = append(left, u)
	}
	clear(rp.flows)
	rp.mu.Unlock()
	// Nothing would relay their replies any more: end them.
	for _, u := range left {
		u.finish(false)
	}
	rp.mu.Lock()
	rp.closeFDs()
	rp.mu.Unlock()
}

//go:build !linux

package proxy

import (
	"context"
	"errors"
	"syscall"
)

// replyPoller exists on Linux only (udppoll_linux.go); elsewhere every UDP
// flow relays its replies on a goroutine of its own.
type replyPoller struct{ err error }

func newReplyPoller() (*replyPoller, error) {
	return nil, errors.New("proxy: no reply poller on this system")
}

func (*replyPoller) add(*udpFlow, syscall.RawConn) (func(), error) {
	return nil, errors.New("proxy: no reply poller on this system")
}

func (*replyPoller) run(context.Context) {}

package translate

// The endpoint socket: the flow's byte queues both ways.

import "errors"

// EndpointSocket is what a flow does with its endpoint socket: a host TCP
// socket with SO_PEEK_OFF enabled (the proxy's); a fake in tests.
type EndpointSocket interface {
	// Write writes b without blocking: a short count when the socket is full.
	Write(b []byte) (int, error)
	// Peek reads from the peek offset without consuming, advancing the
	// offset: 0, nil at EOF; ErrSocketEmpty when nothing is queued there.
	Peek(b []byte) (int, error)
	// Discard drops n bytes from the queue's head; the peek offset moves
	// back by n.
	Discard(n int) error
	// SetPeekOffset sets the peek offset, counted from the queue's head.
	SetPeekOffset(n int) error
	ShutdownWrite() error
	// Abort closes the socket with a RST.
	Abort()
	// Space is how many more bytes the socket takes now.
	Space() (int, error)
	// Writable reports whether the socket takes bytes again after a short
	// write: what the kernel's poll says (POLLOUT).
	Writable() bool
}

// ErrSocketEmpty is EndpointSocket.Peek's EAGAIN.
var ErrSocketEmpty = errors.New("translate: endpoint socket has nothing queued")

package proxy

// Endpoint connections dialled from the host, with the fewest system calls
// between the client's SYN and its SYN-ACK:
//
//  1. socket (non-blocking), TCP_NODELAY, connect. To an endpoint on this
//     host or a veth away, the kernel usually runs the whole handshake
//     inside connect(2) (the SYN and the SYN-ACK are both handled in the
//     softirq that runs as the call returns), so it returns EINPROGRESS
//     with the connection already established.
//  2. poll(2) with a zero timeout says whether it is (SO_ERROR is read only
//     when poll reports an error), and then no trip through the runtime's
//     poller. Otherwise the dial waits for the socket to become writable in
//     the poller, bounded by ctx.
//  3. getsockname refuses a socket the kernel connected to itself, as net
//     does.
//  4. The descriptor goes to the runtime's poller as an os.File at the
//     connection's first use that needs it (file), not in the dial: a
//     flow's first use comes after the client's handshake, so the
//     registration (epoll_ctl, the File and its finalizer) is off the
//     connect path. (net's own dial would add getpeername and a parked
//     wake-up, and net.FileConn a dup and three more calls.)
//  5. Keep-alive (endpointKeepAlive, as net.Dialer does it) is set by the
//     flow, and only once it has lasted endpointKeepAlive (keepAliveLater):
//     off the connect path, and never for a short flow.
//
// BENCHMARKS.md (the connect cell's breakdown) has the figures.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/internal/rawio"
	"github.com/userproxy/userproxy/netstack"
)

// hostConn is a TCP connection dialled by dialHost. Besides net.Conn it
// has CloseWrite and SetLinger, as *net.TCPConn does. Its descriptor joins
// the runtime's poller on the first call that needs it (step 4); every
// method but selfConnected goes through file.
type hostConn struct {
	fd     int // the socket; f owns it once registered
	remote netip.AddrPort

	once   sync.Once
	f      *os.File
	rc     syscall.RawConn // of f
	closed atomic.Bool     // Close was called: errors are os.ErrClosed
	rd, wr rawOp           // the raw reads' and writes' state (Read, Write)
}

// rawOp is one direction's raw call: its buffer and result, and the
// RawConn callback bound to them once per connection (file), so that a
// packet's Read or Write allocates nothing. mu keeps concurrent callers of
// one direction apart, as net.Conn allows them.
type rawOp struct {
	mu  sync.Mutex
	b   []byte
	n   int
	err error
	fn  func(fd uintptr) bool
}

// file returns the connection's os.File, putting the descriptor into the
// runtime's poller on the first call.
func (c *hostConn) file() *os.File {
	c.once.Do(func() {
		c.f = os.NewFile(uintptr(c.fd), "endpoint") // non-blocking, so in the poller
		c.rc, _ = c.f.SyscallConn()                 // fails only for a nil File
		c.rd.fn, c.wr.fn = c.rd.read, c.wr.write
	})
	return c.f
}

// rawConn returns the syscall.RawConn of file.
func (c *hostConn) rawConn() syscall.RawConn {
	c.file()
	return c.rc
}

var _ net.Conn = (*hostConn)(nil)

// dialHost connects to ep from the host, within ctx.
func dialHost(ctx context.Context, ep netip.AddrPort) (net.Conn, error) {
	ep = netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())
	family, sa := unix.AF_INET6, unix.Sockaddr(nil)
	if ep.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(ep.Port()), Addr: ep.Addr().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(ep.Port()), Addr: ep.Addr().As16()}
	}
	if err := ctx.Err(); err != nil {
		return nil, dialError(ep, "dial", err)
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_TCP)
	if err != nil {
		return nil, dialError(ep, "socket", err)
	}
	if fd <= 2 {
		// A process started with a standard descriptor closed: os.File
		// treats 1 and 2 as stdout and stderr (a write that meets EPIPE
		// raises SIGPIPE), so the socket moves above them.
		nfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		_ = unix.Close(fd)
		if err != nil {
			return nil, dialError(ep, "fcntl", err)
		}
		fd = nfd
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		_ = unix.Close(fd)
		return nil, dialError(ep, "setsockopt", err)
	}
	// The endpoint's urgent data stays in the byte stream (RFC 6093 5: a
	// middlebox passes it inline; the URG flag does not cross the proxy
	// either way), set before the connection exists so that no urgent
	// byte comes first. Without it, a read skips the urgent byte while
	// SO_PEEK_OFF counts it, and MSG_TRUNC stops at its mark: a translated
	// flow sent the client a byte twice and was then reset.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_OOBINLINE, 1); err != nil {
		_ = unix.Close(fd)
		return nil, dialError(ep, "setsockopt", err)
	}
	pending := false
	switch err := unix.Connect(fd, sa); {
	case err == nil:
	case errors.Is(err, unix.EINPROGRESS), errors.Is(err, unix.EALREADY), errors.Is(err, unix.EINTR):
		ready, err := connected(fd)
		if err != nil {
			_ = unix.Close(fd)
			return nil, dialError(ep, "connect", err)
		}
		pending = !ready
	default: // 1
		_ = unix.Close(fd)
		return nil, dialError(ep, "connect", err)
	}
	c := &hostConn{fd: fd, remote: ep}
	if pending {
		// The wait needs the poller: the descriptor joins it now (step 4).
		if err := c.awaitConnect(ctx); err != nil {
			_ = c.Close()
			return nil, dialError(ep, "connect", err)
		}
	}
	if c.selfConnected() { // 3
		// A local endpoint nothing listens on, and the kernel picked its
		// port as ours: TCP's simultaneous open connected the socket to
		// itself. net's dial refuses it the same way.
		_ = c.Close()
		return nil, dialError(ep, "connect", unix.ECONNREFUSED)
	}
	return c, nil
}

// selfConnected reports whether the connection's local address is its
// remote one. It reads the descriptor directly: call it only while the
// dial still owns the connection.
func (c *hostConn) selfConnected() bool {
	sa, err := unix.Getsockname(c.fd)
	if err != nil {
		return false
	}
	ip, port := c.remote.Addr(), int(c.remote.Port())
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return ip.Is4() && a.Port == port && a.Addr == ip.As4()
	case *unix.SockaddrInet6:
		return ip.Is6() && a.Port == port && a.Addr == ip.As16()
	}
	return false
}

// connected reports whether the connection of fd, connecting, is
// established (step 2); an error is the connection's failure.
func connected(fd int) (bool, error) {
	fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	n, err := unix.Poll(fds[:], 0)
	for errors.Is(err, unix.EINTR) {
		n, err = unix.Poll(fds[:], 0)
	}
	switch {
	case err != nil:
		return false, err
	case n == 0:
		return false, nil
	case fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) == 0:
		// Writable and no error: established (tcp_poll in
		// net/ipv4/tcp.c reports neither POLLIN nor POLLOUT in
		// SYN_SENT), so SO_ERROR has nothing to say.
		return true, nil
	}
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ERROR)
	if err != nil {
		return false, err
	}
	if v != 0 {
		return false, unix.Errno(v)
	}
	return true, nil
}

// awaitConnect waits in the poller until the connection is established or
// fails, or ctx is done: its end (deadline or cancel) sets a write deadline
// in the past, the one timer of the wait, so an ended wait always returns
// ctx's error, and a wait that stopped the AfterFunc leaves no deadline.
func (c *hostConn) awaitConnect(ctx context.Context) error {
	f := c.file()
	rc := c.rc // set by file
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	var cerr error
	werr := rc.Write(func(fd uintptr) bool {
		ok, err := connected(int(fd))
		cerr = err
		return ok || err != nil
	})
	if !stop() || werr != nil {
		// ctx ended the wait (its deadline, or the AfterFunc, which may
		// still be setting the deadline: the connection is not used).
		if err := ctx.Err(); err != nil {
			return err
		}
		return werr
	}
	return cerr
}

// dialError is what net's dial would return: an *net.OpError naming the
// endpoint and the call that failed.
func dialError(ep netip.AddrPort, call string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ep), Err: err}
	}
	return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(ep), Err: os.NewSyscallError(call, err)}
}

// keepAlive turns on keep-alive probes as net.Dialer's default does for
// endpointKeepAlive: after that long idle, every that long, 9 unanswered end
// the connection (step 5).
func (c *hostConn) keepAlive() error {
	var serr error
	err := c.rawConn().Control(func(fd uintptr) {
		// SO_KEEPALIVE first: TCP_KEEPIDLE then re-arms the timer for the
		// idle time left (keepAliveLater).
		for _, o := range [...]struct{ level, opt, v int }{
			{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
			{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, int(endpointKeepAlive / time.Second)},
			{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, int(endpointKeepAlive / time.Second)},
			{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9},
		} {
			if err := unix.SetsockoptInt(int(fd), o.level, o.opt, o.v); err != nil {
				serr = os.NewSyscallError("setsockopt", err)
				return
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// Read reads from the endpoint, waiting in the poller while there is
// nothing to read. A read into at most maxRawIO bytes is a raw read(2)
// (rawio_linux.go), a larger one os.File's. The endpoint's FIN is io.EOF;
// errors are *os.PathError, as os.File's are: a passed deadline's matches
// os.ErrDeadlineExceeded, a closed connection's os.ErrClosed.
func (c *hostConn) Read(b []byte) (int, error) {
	rc := c.rawConn()
	if len(b) > maxRawIO {
		return c.f.Read(b)
	}
	if len(b) == 0 {
		return 0, nil
	}
	n, rerr, err := c.rd.run(rc.Read, b)
	switch {
	case err != nil:
		return 0, c.wrapErr("read", err)
	case rerr != nil:
		return 0, c.wrapErr("read", rerr)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of b to the endpoint, waiting in the poller while its
// send buffer is full. A write of at most maxRawIO bytes is made of raw
// write(2) calls (rawio_linux.go), a larger one with os.File's. Errors are
// as Read's.
func (c *hostConn) Write(b []byte) (int, error) {
	rc := c.rawConn()
	if len(b) > maxRawIO {
		return c.f.Write(b)
	}
	n, werr, err := c.wr.run(rc.Write, b)
	switch {
	case err != nil:
		return n, c.wrapErr("write", err)
	case werr != nil:
		return n, c.wrapErr("write", werr)
	}
	return n, nil
}

// run makes the direction's raw call on b through call (the RawConn's Read
// or Write): it returns the bytes moved, the system call's error, and the
// poller's (a deadline, a closed descriptor).
func (o *rawOp) run(call func(func(uintptr) bool) error, b []byte) (int, error, error) {
	o.mu.Lock()
	o.b, o.n, o.err = b, 0, nil
	err := call(o.fn)
	n, oerr := o.n, o.err
	o.b = nil
	o.mu.Unlock()
	return n, oerr, err
}

// read is one raw read(2) into o.b; false (EAGAIN) parks in the poller.
func (o *rawOp) read(fd uintptr) bool {
	for {
		n, errno := rawio.Read(fd, o.b)
		switch errno {
		case 0:
			o.n = n
			return true
		case unix.EINTR:
		case unix.EAGAIN:
			return false
		default:
			o.err = errno
			return true
		}
	}
}

// write writes all of o.b with raw write(2) calls, resuming where it
// stopped each time the poller finds the socket writable again.
func (o *rawOp) write(fd uintptr) bool {
	for o.n < len(o.b) {
		m, errno := rawio.Write(fd, o.b[o.n:])
		switch {
		case errno == 0 && m > 0:
			o.n += m
		case errno == 0: // nothing taken and no error: os.File's answer
			o.err = io.ErrUnexpectedEOF
			return true
		case errno == unix.EINTR:
		case errno == unix.EAGAIN:
			return false
		default:
			o.err = errno
			return true
		}
	}
	return true
}

// wrapErr wraps a failure of op as os.File does, the poller's error for a
// closed descriptor as os.ErrClosed.
func (c *hostConn) wrapErr(op string, err error) error {
	if c.closed.Load() {
		err = os.ErrClosed
	}
	return &os.PathError{Op: op, Path: c.f.Name(), Err: err}
}

// Close closes the connection (through file, so that a second Close
// fails as os.File's does instead of closing a reused descriptor).
func (c *hostConn) Close() error {
	f := c.file()
	c.closed.Store(true)
	return f.Close()
}

// CloseWrite shuts down the sending side (a FIN to the endpoint).
func (c *hostConn) CloseWrite() error {
	var serr error
	if err := c.rawConn().Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	if serr != nil {
		return os.NewSyscallError("shutdown", serr)
	}
	return nil
}

// SetLinger sets SO_LINGER, as (*net.TCPConn).SetLinger: 0 makes Close
// send a RST.
func (c *hostConn) SetLinger(sec int) error {
	l := unix.Linger{}
	if sec >= 0 {
		l.Onoff, l.Linger = 1, int32(sec)
	}
	var serr error
	if err := c.rawConn().Control(func(fd uintptr) { serr = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &l) }); err != nil {
		return err
	}
	if serr != nil {
		return os.NewSyscallError("setsockopt", serr)
	}
	return nil
}

// LocalAddr returns the local address (getsockname), or nil.
func (c *hostConn) LocalAddr() net.Addr {
	var sa unix.Sockaddr
	if err := c.rawConn().Control(func(fd uintptr) { sa, _ = unix.Getsockname(int(fd)) }); err != nil {
		return nil
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return nil
}

// RemoteAddr returns the endpoint's address.
func (c *hostConn) RemoteAddr() net.Addr { return net.TCPAddrFromAddrPort(c.remote) }

// SetDeadline implements net.Conn.
func (c *hostConn) SetDeadline(t time.Time) error { return c.file().SetDeadline(t) }

// SetReadDeadline implements net.Conn.
func (c *hostConn) SetReadDeadline(t time.Time) error { return c.file().SetReadDeadline(t) }

// SetWriteDeadline implements net.Conn.
func (c *hostConn) SetWriteDeadline(t time.Time) error { return c.file().SetWriteDeadline(t) }

// xlWindow is the window a translated flow offers while its socket takes
// everything: 4 MiB, the kernel's largest send buffer by default
// (net.ipv4.tcp_wmem) and gVisor's largest receive buffer here (stack.go).
const xlWindow = 4 << 20

// translatable readies the connection for the translator
// (netstack/translate.go): peeks from an offset (SO_PEEK_OFF), and returns
// it as the translator's socket, with its send buffer as the window to
// offer.
func (c *hostConn) translatable() (netstack.EndpointSocket, uint32, error) {
	if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
		return nil, 0, fmt.Errorf("SO_PEEK_OFF: %w", err)
	}
	// A send buffer of xlWindow, set now: the window offered follows its
	// free space, and the kernel's autotuning would start it at 16 KiB.
	// SO_SNDBUFFORCE passes net.core.wmem_max (CAP_NET_ADMIN, which the
	// TUN needs anyway); without it, SO_SNDBUF up to that limit.
	if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, xlWindow) != nil {
		_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, xlWindow)
	}
	sndbuf, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		return nil, 0, fmt.Errorf("SO_SNDBUF: %w", err)
	}
	// A receive buffer of xlWindow too (pasta sets its sockets' buffers to
	// the most it can): the socket's receive queue is the flow's send
	// buffer toward the client, holding what is in flight until the client
	// acknowledges it. Peeking is no reading to the kernel's receive
	// buffer autotuning, which sees only what is discarded per round trip
	// of the endpoint's connection (microseconds on a node), so the buffer
	// stayed at tcp_rmem's default of 128 KiB: under 5% loss on the
	// client's link the holes' retransmissions held the queue, the
	// endpoint's window closed (its sender rwnd-limited 100% of the time)
	// and the flow moved 11 Mbit/s.
	if unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, xlWindow) != nil {
		_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUF, xlWindow)
	}
	c.file() // into the poller: the owner waits on its RawConn
	// The kernel doubles the size asked for, for its overhead: the
	// payload it takes is about half of what SO_SNDBUF reports. The window
	// offered is never more than that.
	room := sndbuf / 2
	return xlSocket{c: c, room: room}, uint32(min(xlWindow, room)), nil
}

// TranslateSupported reports why this kernel cannot carry translated TCP
// flows, if it cannot: they peek from an offset (SO_PEEK_OFF), which TCP
// sockets take since Linux 6.10 (EOPNOTSUPP before).
func TranslateSupported() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("a TCP socket to probe SO_PEEK_OFF: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, 0); err != nil {
		return fmt.Errorf("SO_PEEK_OFF on a TCP socket (Linux 6.10 and later): %w", err)
	}
	return nil
}

// xlSocket is a hostConn as the translator's EndpointSocket: raw,
// non-blocking calls on its descriptor.
type xlSocket struct {
	c    *hostConn
	room int // the payload the send buffer holds
}

// Space is the send buffer's room less what is queued in it (SIOCOUTQ:
// bytes written and not yet acknowledged by the endpoint).
func (s xlSocket) Space() (int, error) {
	var outq int32
	_, _, errno := unix.RawSyscall(unix.SYS_IOCTL, uintptr(s.c.fd), unix.SIOCOUTQ, uintptr(unsafe.Pointer(&outq)))
	if errno != 0 {
		return 0, errno
	}
	return max(0, s.room-int(outq)), nil
}

// Writable asks the kernel's poll, without waiting, whether the socket
// takes bytes (POLLOUT): its own measure of room, which a short write's
// wait (waitWritable) and a full flow's probes go by.
func (s xlSocket) Writable() bool { return s.c.writable() }

func (c *hostConn) writable() bool {
	fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLOUT}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n == 1 && fds[0].Revents&unix.POLLOUT != 0
}

func (s xlSocket) Write(b []byte) (int, error) {
	n, errno := rawio.Write(uintptr(s.c.fd), b)
	switch errno {
	case 0:
		return n, nil
	case unix.EAGAIN:
		return 0, nil
	}
	return 0, errno
}

func (s xlSocket) Peek(b []byte) (int, error) {
	return s.recv(b, len(b), unix.MSG_PEEK)
}

// Discard drops n bytes. A receive stops at the urgent mark after
// bytes before it (tcp_recvmsg_locked, urgent data inline or not), so a
// discard across the mark takes two calls.
func (s xlSocket) Discard(n int) error {
	for left := n; left > 0; {
		r, err := s.recv(nil, left, unix.MSG_TRUNC)
		if err == nil && r == 0 {
			err = fmt.Errorf("discarded %d of %d acknowledged bytes", n-left, n)
		}
		if err != nil {
			return err
		}
		left -= r
	}
	return nil
}

func (s xlSocket) recv(b []byte, n, flags int) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	r, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(s.c.fd), uintptr(p), uintptr(n), uintptr(flags|unix.MSG_DONTWAIT), 0, 0)
	switch errno {
	case 0:
		return int(r), nil
	case unix.EAGAIN:
		return 0, netstack.ErrSocketEmpty
	}
	return 0, errno
}

func (s xlSocket) SetPeekOffset(n int) error {
	return unix.SetsockoptInt(s.c.fd, unix.SOL_SOCKET, unix.SO_PEEK_OFF, n)
}

func (s xlSocket) ShutdownWrite() error { return unix.Shutdown(s.c.fd, unix.SHUT_WR) }

// Abort makes the socket's close send a RST, and its reader return.
func (s xlSocket) Abort() {
	_ = s.c.SetLinger(0)
	_ = unix.Shutdown(s.c.fd, unix.SHUT_RD)
}

// adoptHostConn makes a connection of an endpoint socket the previous
// process handed over (package handover): file is in the runtime's poller
// already, its descriptor non-blocking.
func adoptHostConn(file *os.File, remote netip.AddrPort) (*hostConn, error) {
	rc, err := file.SyscallConn()
	if err != nil {
		return nil, err
	}
	c := &hostConn{remote: remote}
	if err := rc.Control(func(fd uintptr) { c.fd = int(fd) }); err != nil {
		return nil, err
	}
	c.once.Do(func() {
		c.f, c.rc = file, rc
		c.rd.fn, c.wr.fn = c.rd.read, c.wr.write
	})
	return c, nil
}

// adoptedSocket is translatable for a socket set up by the previous
// process: its peek offset and send buffer are as that process left them.
func (c *hostConn) adoptedSocket() (netstack.EndpointSocket, error) {
	sndbuf, err := unix.GetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
	if err != nil {
		return nil, fmt.Errorf("SO_SNDBUF: %w", err)
	}
	return xlSocket{c: c, room: sndbuf / 2}, nil
}

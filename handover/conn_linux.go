package handover

// The handover socket's protocol, over a SOCK_SEQPACKET unix socket (one
// message per write, descriptors attached to the message that carries
// them):
//
//  1. The taker (the new process) connects and says hello: the magic, the
//     snapshot formats it reads, its PID. The server (the running process)
//     checks that the taker runs as its own user (SO_PEERCRED), and refuses
//     it when another taker came first or no format is common.
//     Otherwise it accepts (the format it writes, its PID) and hands the
//     taker to its owner.
//  2. The owner stops reading, builds its snapshot, and sends an offer
//     (the number of descriptors, the snapshot's length),
//     then the descriptors in batches of fdBatch with SCM_RIGHTS, then the
//     snapshot in chunks.
//  3. The taker validates and restores everything without acting on it
//     yet (no segment out, no packet read), then confirms; or it fails,
//     saying why. A confirmation commits the old process: it answers with
//     a commit and never takes its flows back. Only then does the taker
//     act. A failure, the taker's exit or silence past the owner's bound
//     leave the old process serving, and the next taker may try; a taker
//     that gets no commit acts only if the old process is gone (it crashed
//     after the confirmation), and otherwise gives up.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The protocol's messages, by their first byte.
const (
	msgHello   = 'H'
	msgAccept  = 'A'
	msgOffer   = 'O'
	msgRefuse  = 'R'
	msgFDs     = 'F'
	msgChunk   = 'S'
	msgConfirm = 'C'
	msgCommit  = 'K'
	msgFail    = 'X'
)

var helloMagic = [8]byte{'U', 'P', 'X', 'H', 'O', 'V', 'R', '1'}

const (
	// fdBatch is the most descriptors one message carries: below the
	// kernel's SCM_MAX_FD (253).
	fdBatch = 250
	// chunkMax is the most snapshot bytes one message carries, well within
	// a unix socket's default send buffer.
	chunkMax = 60 << 10
	// helloTimeout bounds a taker's hello, so that a client that connects
	// and says nothing does not hold the socket.
	helloTimeout = 5 * time.Second
	// MaxFDs bounds the descriptors a taker accepts: the process's own
	// limit is the real one; this keeps a broken offer from asking for more.
	MaxFDs = 1 << 22
)

// ErrNoServer is a Dial that found no running process to take over from:
// no socket, or nobody listening on it (a process that crashed).
var ErrNoServer = errors.New("handover: no running process to take over from")

// ErrRefused is the running process's refusal; the error says why.
var ErrRefused = errors.New("handover: refused")

// Server listens for a taker on the handover socket.
type Server struct {
	ln     *net.UnixListener
	path   string
	ino    uint64 // the socket file's inode: Close removes only its own
	busy   atomic.Bool
	offers chan *Offer
	done   chan struct{}
	wg     sync.WaitGroup
	// greeting holds the connections whose hello is awaited, so that Close
	// ends their wait at once.
	mu       sync.Mutex
	greeting map[*net.UnixConn]struct{}
}

// Listen makes the handover socket at path, readable by the owner only, in
// a directory made for the owner only. A socket file already there (a
// running process's, or a crashed one's) is replaced atomically: the new
// socket is bound beside it and renamed over it, so a taker never finds
// none.
func Listen(path string) (*Server, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("handover: %w", err)
	}
	tmp := path + "." + strconv.Itoa(os.Getpid())
	_ = os.Remove(tmp)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: tmp, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("handover: listening on %s: %w", tmp, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*Server, error) {
		_ = ln.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("handover: %w", err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fail(err)
	}
	s := &Server{ln: ln, path: path, ino: st.Ino, offers: make(chan *Offer), done: make(chan struct{}), greeting: map[*net.UnixConn]struct{}{}}
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Path returns the socket's path.
func (s *Server) Path() string { return s.path }

// Offers delivers each taker that said a valid hello while no other was
// being served; it is closed by Close. The owner must answer every offer:
// Refuse, or Send and then Wait.
func (s *Server) Offers() <-chan *Offer { return s.offers }

// Close stops listening and removes the socket file, unless another
// process's socket has replaced it since.
func (s *Server) Close() error {
	select {
	case <-s.done:
		return nil
	default:
	}
	close(s.done)
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.greeting {
		_ = c.SetDeadline(time.Now())
	}
	s.mu.Unlock()
	s.wg.Wait()
	close(s.offers) // no greeter is left to send: the owner's range ends
	var st unix.Stat_t
	if unix.Stat(s.path, &st) == nil && st.Ino == s.ino {
		_ = os.Remove(s.path)
	}
	return err
}

// acceptLoop takes takers until Close.
func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: try again
			continue
		}
		s.wg.Add(1)
		go func() { defer s.wg.Done(); s.greet(c) }()
	}
}

// greet reads a taker's hello and hands it to the owner as an offer, or
// refuses it.
func (s *Server) greet(c *net.UnixConn) {
	if err := checkPeer(c); err != nil {
		_ = c.Close()
		return
	}
	s.mu.Lock()
	select {
	case <-s.done:
		s.mu.Unlock()
		_ = c.Close()
		return
	default:
	}
	s.greeting[c] = struct{}{}
	_ = c.SetDeadline(time.Now().Add(helloTimeout))
	s.mu.Unlock()
	buf := make([]byte, 512)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	s.mu.Lock()
	delete(s.greeting, c)
	s.mu.Unlock()
	if err != nil || n < 1+8+2+2+4 || buf[0] != msgHello || [8]byte(buf[1:9]) != helloMagic {
		_ = c.Close()
		return
	}
	lo, hi := be16(buf[9:]), be16(buf[11:])
	pid := int(be32(buf[13:]))
	if Format < lo || Format > hi {
		refuse(c, fmt.Sprintf("the running process writes snapshot format %d, the new one reads %d to %d", Format, lo, hi))
		return
	}
	if !s.busy.CompareAndSwap(false, true) {
		refuse(c, "another process is taking over")
		return
	}
	o := &Offer{s: s, c: c, Format: Format, TakerPID: pid}
	accept := appendBE32(appendBE16([]byte{msgAccept}, Format), uint32(os.Getpid()))
	if _, _, err := c.WriteMsgUnix(accept, nil, nil); err != nil {
		o.release()
		return
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case s.offers <- o:
	case <-s.done:
		o.Refuse("the running process is stopping")
	}
}

// checkPeer refuses a taker that runs as another user than this process.
func checkPeer(c *net.UnixConn) error {
	cred, err := peerCred(c)
	if err != nil {
		return err
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("handover: a taker of uid %d, this process runs as %d", cred.Uid, os.Geteuid())
	}
	return nil
}

// peerCred returns the credentials of c's peer (SO_PEERCRED: as of its
// connect or listen).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

func refuse(c *net.UnixConn, reason string) {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	_, _, _ = c.WriteMsgUnix(append([]byte{msgRefuse}, reason...), nil, nil)
	_ = c.Close()
}

// Offer is one taker, held by the server's owner.
type Offer struct {
	s        *Server
	c        *net.UnixConn
	Format   uint16 // the snapshot format to write
	TakerPID int
	once     sync.Once
}

// Refuse answers the taker with reason and frees the server for another.
func (o *Offer) Refuse(reason string) {
	refuse(o.c, reason)
	o.release()
}

func (o *Offer) release() { o.once.Do(func() { _ = o.c.Close(); o.s.busy.Store(false) }) }

// Send sends fds and the snapshot. The descriptors stay open in this
// process (the kernel shares each open file): the owner keeps them until
// Wait reports the taker's confirmation, and serves on with them if it
// does not come.
func (o *Offer) Send(snapshot []byte, fds []int, timeout time.Duration) error {
	_ = o.c.SetDeadline(time.Now().Add(timeout))
	hdr := appendBE32(appendBE32([]byte{msgOffer}, uint32(len(fds))), uint32(len(snapshot)))
	if err := o.write(hdr, nil); err != nil {
		return err
	}
	for i := 0; i < len(fds); i += fdBatch {
		batch := fds[i:min(i+fdBatch, len(fds))]
		if err := o.write(appendBE32([]byte{msgFDs}, uint32(len(batch))), unix.UnixRights(batch...)); err != nil {
			return err
		}
	}
	for i := 0; i < len(snapshot); i += chunkMax {
		if err := o.write(append([]byte{msgChunk}, snapshot[i:min(i+chunkMax, len(snapshot))]...), nil); err != nil {
			return err
		}
	}
	return nil
}

func (o *Offer) write(b, oob []byte) error {
	if _, _, err := o.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("handover: sending to the taker (pid %d): %w", o.TakerPID, err)
	}
	return nil
}

// Wait waits up to timeout for the taker's answer: nil once it confirms
// and this process's commit is sent (the owner is committed: it must not
// act on what it sent again, and stops), an error when the taker fails,
// goes away or stays silent (the owner serves on). Either way the offer is
// over.
func (o *Offer) Wait(timeout time.Duration) error {
	defer o.release()
	_ = o.c.SetDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1024)
	n, _, _, _, err := o.c.ReadMsgUnix(buf, nil)
	switch {
	case err != nil:
		return fmt.Errorf("handover: no answer from the taker (pid %d): %w", o.TakerPID, err)
	case n == 0:
		return fmt.Errorf("handover: the taker (pid %d) went away", o.TakerPID)
	case buf[0] == msgConfirm:
		_ = o.c.SetDeadline(time.Now().Add(time.Second))
		if _, _, err := o.c.WriteMsgUnix([]byte{msgCommit}, nil, nil); err != nil {
			return fmt.Errorf("handover: the taker (pid %d) went away after its confirmation: %w", o.TakerPID, err)
		}
		return nil
	case buf[0] == msgFail:
		return fmt.Errorf("handover: the taker (pid %d) failed: %s", o.TakerPID, buf[1:n])
	}
	return fmt.Errorf("handover: the taker (pid %d) sent message %q", o.TakerPID, buf[0])
}

// ServerPID returns the pid of the process that serves the handover socket
// at path, read from the socket's peer credentials: it says no hello and
// asks for nothing, so the server only sees a connection close. It returns
// ErrNoServer when nobody serves there (`userproxy restart`).
func ServerPID(path string) (int, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return 0, fmt.Errorf("%w (%s)", ErrNoServer, path)
		}
		return 0, fmt.Errorf("handover: %w", err)
	}
	defer c.Close()
	cred, err := peerCred(c)
	if err != nil {
		return 0, fmt.Errorf("handover: the peer of %s: %w", path, err)
	}
	return int(cred.Pid), nil
}

// Taker is the new process's side.
type Taker struct {
	c         *net.UnixConn
	Format    uint16 // the snapshot format the server writes
	ServerPID int
}

// Dial connects to the running process's handover socket and says hello.
// It returns ErrNoServer when there is nobody to take over from, and an
// error wrapping ErrRefused when the running process refuses.
func Dial(path string, timeout time.Duration) (*Taker, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (%s)", ErrNoServer, path)
		}
		return nil, fmt.Errorf("handover: %w", err)
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	hello := append([]byte{msgHello}, helloMagic[:]...)
	hello = appendBE16(hello, Format)
	hello = appendBE16(hello, Format)
	hello = appendBE32(hello, uint32(os.Getpid()))
	if _, _, err := c.WriteMsgUnix(hello, nil, nil); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("handover: hello: %w", err)
	}
	buf := make([]byte, 1024)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	switch {
	case err != nil:
		_ = c.Close()
		return nil, fmt.Errorf("handover: waiting for the running process's answer: %w", err)
	case n >= 1 && buf[0] == msgRefuse:
		_ = c.Close()
		return nil, fmt.Errorf("%w: %s", ErrRefused, buf[1:n])
	case n != 1+2+4 || buf[0] != msgAccept || be16(buf[1:]) != Format:
		_ = c.Close()
		return nil, fmt.Errorf("handover: the running process answered %q, not an acceptance", buf[:n])
	}
	_ = c.SetDeadline(time.Time{})
	return &Taker{c: c, Format: Format, ServerPID: int(be32(buf[3:]))}, nil
}

// Receive waits for the running process's offer (it stops reading and
// builds its snapshot first) and reads the descriptors and the snapshot,
// all within timeout. On error every descriptor received is closed.
func (t *Taker) Receive(timeout time.Duration) (snapshot []byte, fds []*os.File, err error) {
	_ = t.c.SetDeadline(time.Now().Add(timeout))
	defer func() {
		if err != nil {
			for _, f := range fds {
				_ = f.Close()
			}
			fds = nil
		}
	}()
	buf := make([]byte, 1+chunkMax)
	n, _, _, _, err := t.c.ReadMsgUnix(buf, nil)
	switch {
	case err != nil:
		return nil, nil, fmt.Errorf("handover: waiting for the running process's offer (pid %d): %w", t.ServerPID, err)
	case n != 1+4+4 || buf[0] != msgOffer:
		return nil, nil, fmt.Errorf("handover: the running process sent %q, not an offer", buf[:min(n, 16)])
	}
	nfds, size := int(be32(buf[1:])), int(be32(buf[5:]))
	if nfds > MaxFDs || size > headerLen+MaxSnapshot {
		return nil, nil, fmt.Errorf("handover: an offer of %d descriptors and %d bytes", nfds, size)
	}
	oob := make([]byte, unix.CmsgSpace(fdBatch*4))
	snapshot = make([]byte, 0, min(size, 1<<20))
	for len(fds) < nfds || len(snapshot) < size {
		n, oobn, flags, _, err := t.c.ReadMsgUnix(buf, oob)
		if err != nil {
			return nil, fds, fmt.Errorf("handover: receiving from the running process (pid %d): %w", t.ServerPID, err)
		}
		var got []int
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				return nil, fds, fmt.Errorf("handover: control message: %w", err)
			}
			for _, m := range msgs {
				rights, err := unix.ParseUnixRights(&m)
				if err == nil {
					got = append(got, rights...)
				}
			}
		}
		for _, fd := range got {
			fds = append(fds, os.NewFile(uintptr(fd), "handover-"+strconv.Itoa(len(fds))))
		}
		if flags&(unix.MSG_CTRUNC|unix.MSG_TRUNC) != 0 {
			return nil, fds, errors.New("handover: a message cut short")
		}
		switch {
		case n == 0:
			return nil, fds, fmt.Errorf("handover: the running process (pid %d) went away", t.ServerPID)
		case buf[0] == msgFDs && n == 5 && int(be32(buf[1:])) == len(got) && len(fds) <= nfds:
		case buf[0] == msgChunk && len(got) == 0 && len(snapshot)+n-1 <= size:
			snapshot = append(snapshot, buf[1:n]...)
		default:
			return nil, fds, fmt.Errorf("handover: message %q of %d bytes with %d descriptors out of place", buf[0], n, len(got))
		}
	}
	return snapshot, fds, nil
}

// ErrServerAlive is a confirmation the running process did not commit to
// while it still runs: it serves on, and this process must not act.
var ErrServerAlive = errors.New("handover: the running process did not commit")

// Confirm tells the running process that this one is ready, and waits up
// to timeout for its commit. nil: act (take the flows, read the queues).
// An error wrapping ErrServerAlive: the running process serves on. A
// running process that is gone (it crashed after the confirmation) counts
// as committed: nobody else serves.
func (t *Taker) Confirm(timeout time.Duration) error {
	defer t.c.Close()
	_ = t.c.SetDeadline(time.Now().Add(timeout))
	if _, _, err := t.c.WriteMsgUnix([]byte{msgConfirm}, nil, nil); err != nil {
		return t.noCommit(fmt.Errorf("confirming: %w", err))
	}
	buf := make([]byte, 64)
	n, _, _, _, err := t.c.ReadMsgUnix(buf, nil)
	switch {
	case err != nil:
		return t.noCommit(fmt.Errorf("waiting for the commit: %w", err))
	case n == 1 && buf[0] == msgCommit:
		return nil
	}
	return t.noCommit(fmt.Errorf("the running process answered %q, not a commit", buf[:n]))
}

// noCommit is Confirm's answer without a commit: nil when the running
// process is gone, else ErrServerAlive with why.
func (t *Taker) noCommit(why error) error {
	if err := unix.Kill(t.ServerPID, 0); errors.Is(err, unix.ESRCH) {
		return nil
	}
	return fmt.Errorf("%w (pid %d): %v", ErrServerAlive, t.ServerPID, why)
}

// Fail tells the running process that this one did not take over, and
// why: it serves on.
func (t *Taker) Fail(reason string) {
	_ = t.c.SetDeadline(time.Now().Add(time.Second))
	_, _, _ = t.c.WriteMsgUnix(append([]byte{msgFail}, reason...), nil, nil)
	_ = t.c.Close()
}

// Close drops the connection: to the running process, a taker gone away.
func (t *Taker) Close() { _ = t.c.Close() }

func be16(b []byte) uint16 { return uint16(b[0])<<8 | uint16(b[1]) }
func be32(b []byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}
func appendBE16(b []byte, v uint16) []byte { return append(b, byte(v>>8), byte(v)) }
func appendBE32(b []byte, v uint32) []byte {
	return append(b, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

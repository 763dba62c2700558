package handover

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen starts a server in a fresh directory, closed when the test ends.
func listen(t *testing.T) *Server {
	t.Helper()
	s, err := Listen(filepath.Join(t.TempDir(), "run", "userproxy0.handover"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// offer waits for the server's next offer.
func offer(t *testing.T, s *Server) *Offer {
	t.Helper()
	select {
	case o := <-s.Offers():
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("no offer")
		return nil
	}
}

// TestHandoverMovesDescriptors: 600 descriptors (three batches and more)
// and a snapshot of several chunks reach the taker; each descriptor is the
// same open socket (its inode, and bytes written through it arrive at its
// peer), the snapshot is byte for byte the one sent, and the taker's
// confirmation is what the server's Wait returns.
func TestHandoverMovesDescriptors(t *testing.T) {
	s := listen(t)
	if st, err := os.Stat(s.Path()); err != nil || st.Mode().Perm() != 0o600 || st.Mode()&os.ModeSocket == 0 {
		t.Fatalf("the socket file: %v, %v; want a socket of mode 0600", st.Mode(), err)
	}
	if st, err := os.Stat(filepath.Dir(s.Path())); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("the run directory: %v, %v; want 0700", st.Mode(), err)
	}
	const n = 600
	var ours, peers []int
	for range n {
		p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ours, peers = append(ours, p[0]), append(peers, p[1])
	}
	defer func() {
		for _, fd := range append(ours, peers...) {
			_ = unix.Close(fd)
		}
	}()
	snap := make([]byte, 3*chunkMax+123)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(snap)

	type result struct {
		snap []byte
		fds  []*os.File
		err  error
	}
	got := make(chan result, 1)
	go func() {
		tk, err := Dial(s.Path(), 5*time.Second)
		if err != nil {
			got <- result{err: err}
			return
		}
		b, fds, err := tk.Receive(5 * time.Second)
		if err == nil {
			err = tk.Confirm(5 * time.Second)
		} else {
			tk.Close()
		}
		got <- result{b, fds, err}
	}()
	o := offer(t, s)
	if o.TakerPID != os.Getpid() || o.Format != Format {
		t.Fatalf("offer from pid %d, format %d", o.TakerPID, o.Format)
	}
	if err := o.Send(snap, ours, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := o.Wait(5 * time.Second); err != nil {
		t.Fatalf("Wait: %v; want the confirmation", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() {
		for _, f := range r.fds {
			_ = f.Close()
		}
	}()
	if !bytes.Equal(r.snap, snap) {
		t.Fatalf("the snapshot: %d bytes, not the %d sent", len(r.snap), len(snap))
	}
	if len(r.fds) != n {
		t.Fatalf("%d descriptors received, %d sent", len(r.fds), n)
	}
	for i, f := range r.fds {
		var a, b unix.Stat_t
		if err := unix.Fstat(ours[i], &a); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fstat(int(f.Fd()), &b); err != nil {
			t.Fatal(err)
		}
		if a.Ino != b.Ino || a.Dev != b.Dev {
			t.Fatalf("descriptor %d: inode %d, sent %d", i, b.Ino, a.Ino)
		}
		if i%100 == 0 {
			msg := []byte{'m', byte(i)}
			if _, err := f.Write(msg); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 4)
			if k, err := unix.Read(peers[i], buf); err != nil || !bytes.Equal(buf[:k], msg) {
				t.Fatalf("descriptor %d: its peer read %q, %v", i, buf[:k], err)
			}
		}
	}
}

// TestHandoverOneTakerAtATime: while one taker is being served, a second
// is refused with the reason; once the first fails, the server is free
// for the next, and the first's failure reaches the owner's Wait.
func TestHandoverOneTakerAtATime(t *testing.T) {
	s := listen(t)
	first := make(chan *Taker, 1)
	go func() {
		tk, err := Dial(s.Path(), 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		first <- tk
	}()
	o := offer(t, s)
	if err := o.Send([]byte("state"), nil, time.Second); err != nil {
		t.Fatal(err)
	}
	tk := <-first
	if _, err := Dial(s.Path(), 5*time.Second); !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "another process is taking over") {
		t.Fatalf("a second taker: %v; want refused, another process first", err)
	}
	if b, fds, err := tk.Receive(time.Second); err != nil || string(b) != "state" || len(fds) != 0 {
		t.Fatalf("Receive: %q, %d descriptors, %v", b, len(fds), err)
	}
	tk.Fail("the snapshot did not validate")
	if err := o.Wait(5 * time.Second); err == nil || !strings.Contains(err.Error(), "the snapshot did not validate") {
		t.Fatalf("Wait after the taker's failure: %v", err)
	}
	third := make(chan error, 1)
	go func() {
		tk, err := Dial(s.Path(), 5*time.Second)
		if err == nil {
			tk.Close() // goes away without a word
		}
		third <- err
	}()
	o = offer(t, s)
	if err := <-third; err != nil {
		t.Fatalf("a taker after a failed one: %v", err)
	}
	if err := o.Wait(5 * time.Second); err == nil {
		t.Fatal("Wait: nil for a taker that went away")
	}
}

// TestHandoverNoServer: no socket, or a socket nobody listens on (a
// process that crashed), is a clean start, not an error to stop on.
func TestHandoverNoServer(t *testing.T) {
	dir := t.TempDir()
	if _, err := Dial(filepath.Join(dir, "none"), time.Second); !errors.Is(err, ErrNoServer) {
		t.Fatalf("no socket: %v", err)
	}
	stale := filepath.Join(dir, "stale")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: stale, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	_ = ln.Close()
	if _, err := Dial(stale, time.Second); !errors.Is(err, ErrNoServer) {
		t.Fatalf("a stale socket: %v", err)
	}
	s, err := Listen(stale) // takes the stale file's place
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	go func() {
		if tk, err := Dial(stale, time.Second); err == nil {
			tk.Close()
		}
	}()
	offer(t, s).Refuse("test")
}

// TestHandoverSocketReplaced: a second Listen on the path (the new process
// after a handover) takes the path; the first's Close leaves the second's
// socket file in place; takers reach the second.
func TestHandoverSocketReplaced(t *testing.T) {
	a := listen(t)
	b, err := Listen(a.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Path()); err != nil {
		t.Fatalf("the first server's Close removed the second's socket: %v", err)
	}
	go func() {
		if tk, err := Dial(b.Path(), time.Second); err == nil {
			tk.Close()
		}
	}()
	offer(t, b).Refuse("test")
}

// TestHandoverFormatRefused: a taker that reads no format this process
// writes is refused, and told which.
func TestHandoverFormatRefused(t *testing.T) {
	s := listen(t)
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Path(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hello := append([]byte{msgHello}, helloMagic[:]...)
	hello = appendBE16(appendBE16(hello, Format+1), Format+3)
	hello = appendBE32(hello, 1)
	if _, _, err := c.WriteMsgUnix(hello, nil, nil); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 256)
	n, _, _, _, err := c.ReadMsgUnix(buf, nil)
	if err != nil || n == 0 || buf[0] != msgRefuse || !strings.Contains(string(buf[1:n]), "format") {
		t.Fatalf("answer %q, %v; want a refusal naming the format", buf[:n], err)
	}
}

// TestHandoverSilentClient: a client that connects and says nothing does
// not hold the server: Close returns at once.
func TestHandoverSilentClient(t *testing.T) {
	s := listen(t)
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Path(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(20 * time.Millisecond) // accepted, waiting for the hello
	start := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d >= helloTimeout/2 {
		t.Fatalf("Close took %v with a silent client", d)
	}
}

// TestHandoverCommit: a taker's confirmation draws the running process's
// commit; a running process that gives up instead (here: it refuses after
// sending its state) leaves the taker ErrServerAlive, so that it does not
// act while the old one serves on.
func TestHandoverCommit(t *testing.T) {
	s := listen(t)
	for _, commit := range []bool{true, false} {
		res := make(chan error, 1)
		go func() {
			tk, err := Dial(s.Path(), 5*time.Second)
			if err != nil {
				res <- err
				return
			}
			if _, _, err := tk.Receive(5 * time.Second); err != nil {
				res <- err
				return
			}
			res <- tk.Confirm(5 * time.Second)
		}()
		o := offer(t, s)
		if err := o.Send([]byte("state"), nil, time.Second); err != nil {
			t.Fatal(err)
		}
		if commit {
			if err := o.Wait(5 * time.Second); err != nil {
				t.Fatalf("Wait: %v", err)
			}
			if err := <-res; err != nil {
				t.Fatalf("a confirmation the running process committed to: %v", err)
			}
			continue
		}
		o.Refuse("giving up")
		if err := <-res; !errors.Is(err, ErrServerAlive) {
			t.Fatalf("a confirmation the running process did not commit to: %v; want ErrServerAlive", err)
		}
	}
}

// TestServerPID: the pid behind a handover socket is read without an offer
// (the server sees a connection close and serves the next taker as
// before); no socket, or a stale one, is ErrNoServer.
func TestServerPID(t *testing.T) {
	dir := t.TempDir()
	if _, err := ServerPID(filepath.Join(dir, "none")); !errors.Is(err, ErrNoServer) {
		t.Fatalf("no socket: %v", err)
	}
	s := listen(t)
	for range 3 {
		pid, err := ServerPID(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		if pid != os.Getpid() {
			t.Fatalf("ServerPID = %d, want this process's %d", pid, os.Getpid())
		}
	}
	select {
	case o := <-s.Offers():
		t.Fatalf("ServerPID made an offer (taker %d)", o.TakerPID)
	case <-time.After(100 * time.Millisecond):
	}
	go func() {
		if tk, err := Dial(s.Path(), time.Second); err == nil {
			tk.Close()
		}
	}()
	offer(t, s).Refuse("test")
	_ = s.Close()
	if _, err := ServerPID(s.Path()); !errors.Is(err, ErrNoServer) {
		t.Fatalf("after Close: %v", err)
	}
}

package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// listenBacklog0 listens on 127.0.0.1 with an accept queue of one
// connection (listen(2) with backlog 0): once it holds one unaccepted
// connection, the kernel drops further SYNs, so a dial stays in progress.
func listenBacklog0(t *testing.T) (netip.AddrPort, int) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(sa.(*unix.SockaddrInet4).Port)), fd
}

func TestDialHost(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "tcp6" {
				addr = "[::1]:0"
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Skipf("no %s loopback: %v", network, err)
			}
			defer ln.Close()
			ep := ln.Addr().(*net.TCPAddr).AddrPort()
			c, err := dialHost(context.Background(), ep)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if c.(*hostConn).f != nil {
				t.Error("the dial put the descriptor into the poller; that waits for the connection's first use, after the client's handshake")
			}
			srv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != ep {
				t.Errorf("RemoteAddr %v, want %v", got, ep)
			}
			if got, want := c.LocalAddr().String(), srv.RemoteAddr().String(); got != want {
				t.Errorf("LocalAddr %v, want the server's view %v", got, want)
			}
			hc := c.(*hostConn)
			var nodelay, keep, idle, intvl, cnt int
			_ = hc.rawConn().Control(func(fd uintptr) {
				nodelay, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NODELAY)
				keep, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
			})
			if nodelay != 1 || keep != 0 {
				t.Errorf("after the dial: TCP_NODELAY %d, SO_KEEPALIVE %d; want 1, 0 (keep-alive comes after the handshake)", nodelay, keep)
			}
			if err := hc.keepAlive(); err != nil {
				t.Fatal(err)
			}
			_ = hc.rawConn().Control(func(fd uintptr) {
				keep, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
				idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
				intvl, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
				cnt, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
			})
			if keep != 1 || idle != 15 || intvl != 15 || cnt != 9 {
				t.Errorf("keep-alive %d idle %d interval %d count %d; want 1, 15, 15, 9 (net.Dialer's default)", keep, idle, intvl, cnt)
			}

			// Both ways, then a half-close: the server reads EOF and can
			// still answer.
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 8)
			if n, err := io.ReadFull(srv, buf[:4]); err != nil || string(buf[:n]) != "ping" {
				t.Fatalf("server read %q, %v", buf[:n], err)
			}
			if err := c.(halfCloser).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if n, err := srv.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
				t.Fatalf("server after CloseWrite: %d, %v; want EOF", n, err)
			}
			if _, err := srv.Write([]byte("pong")); err != nil {
				t.Fatal(err)
			}
			if n, err := io.ReadFull(c, buf[:4]); err != nil || string(buf[:n]) != "pong" {
				t.Fatalf("read %q, %v", buf[:n], err)
			}

			// resetTCP, on a second connection: the server sees a RST,
			// not a FIN.
			c2, srv2 := dialAccepted(t, ln, ep)
			resetTCP(c2)
			_ = srv2.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := srv2.Read(buf); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("server after resetTCP: %v; want ECONNRESET", err)
			}
		})
	}
}

func TestDialHostRefused(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close() // nothing listens there now: a RST answers the SYN
	c, err := dialHost(context.Background(), ep)
	if err == nil {
		c.Close()
		t.Fatal("dial of a closed port succeeded")
	}
	var op *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("error %v (%T); want a dial *net.OpError wrapping ECONNREFUSED", err, err)
	}
	if unanswered(err) {
		t.Errorf("a refusal counts as unanswered: %v", err)
	}
}

// TestDialHostInProgress takes the path of a connect that the kernel does
// not finish inside connect(2): the listener's full accept queue drops the
// SYN, so the dial waits in the poller.
func TestDialHostInProgress(t *testing.T) {
	ep, lfd := listenBacklog0(t)
	first, err := dialHost(context.Background(), ep) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()

	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		c, err := dialHost(ctx, ep)
		if err == nil {
			c.Close()
			t.Fatal("dial into a full accept queue succeeded")
		}
		if !errors.Is(err, context.DeadlineExceeded) || !unanswered(err) {
			t.Fatalf("error %v; want the context's deadline, unanswered", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the dial took %v past a 200 ms deadline", d)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		c, err := dialHost(ctx, ep)
		if err == nil {
			c.Close()
			t.Fatal("dial into a full accept queue succeeded")
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v; want context.Canceled", err)
		}
	})
	t.Run("completes", func(t *testing.T) {
		// Room in the queue once the first connection is accepted: the
		// dial's retransmitted SYN (after 1 s) gets in.
		time.AfterFunc(300*time.Millisecond, func() {
			if nfd, _, err := unix.Accept(lfd); err == nil {
				_ = unix.Close(nfd)
			}
		})
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		c, err := dialHost(ctx, ep)
		if err != nil {
			t.Fatalf("dial after room was made: %v", err)
		}
		defer c.Close()
		<-ctx.Done() // the dial's context ends: the connection must not
		time.Sleep(50 * time.Millisecond)
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatalf("write after the dial's context ended: %v", err)
		}
	})
}

// TestSelfConnected: a socket bound to the port it connects to (on
// loopback, with nothing listening) is connected to itself by TCP's
// simultaneous open; dialHost refuses such a connection.
func TestSelfConnected(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	lo := &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}
	if err := unix.Bind(fd, lo); err != nil {
		t.Fatal(err)
	}
	sa, _ := unix.Getsockname(fd)
	port := sa.(*unix.SockaddrInet4).Port
	if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: lo.Addr, Port: port}); err != nil && !errors.Is(err, unix.EINPROGRESS) {
		t.Fatal(err)
	}
	self := &hostConn{fd: fd, remote: netip.AddrPortFrom(netip.AddrFrom4(lo.Addr), uint16(port))}
	defer self.Close()
	if err := self.awaitConnect(context.Background()); err != nil {
		t.Fatalf("simultaneous open: %v", err)
	}
	if !self.selfConnected() {
		t.Fatal("a socket connected to itself is not seen as such")
	}

	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := dialHost(context.Background(), ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.(*hostConn).selfConnected() {
		t.Fatal("a connection to a listener is seen as connected to itself")
	}
}

// loopbackListener listens on 127.0.0.1 until the test ends.
func loopbackListener(t *testing.T) (net.Listener, netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).AddrPort()
}

// dialAccepted dials ep, which ln listens on, and accepts the connection:
// both ends close when the test ends.
func dialAccepted(t *testing.T, ln net.Listener, ep netip.AddrPort) (*hostConn, net.Conn) {
	t.Helper()
	c, err := dialHost(context.Background(), ep)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ln.Accept()
	if err != nil {
		_ = c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(); _ = srv.Close() })
	return c.(*hostConn), srv
}

// TestKeepAliveLater checks that an endpoint connection's keep-alive is
// turned on only once its flow has lasted the delay, and never when the
// flow ends first.
func TestKeepAliveLater(t *testing.T) {
	_, ep := loopbackListener(t)
	dial := func() *hostConn {
		c, err := dialHost(context.Background(), ep)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*hostConn)
	}
	keep := func(c *hostConn) (on, idle, intvl, cnt int) {
		_ = c.rawConn().Control(func(fd uintptr) {
			on, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
			idle, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
			intvl, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
			cnt, _ = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
		})
		return on, idle, intvl, cnt
	}
	period := int(endpointKeepAlive / time.Second)

	// A flow that ends before the delay: no keep-alive, and none later.
	short := dial()
	stop := keepAliveLater(short, 50*time.Millisecond)
	if on, _, _, _ := keep(short); on != 0 {
		t.Errorf("SO_KEEPALIVE %d before the delay; want 0", on)
	}
	stopped := stop()

	// A flow that lasts: keep-alive as net.Dialer's default sets it. The
	// timer sets the four one after another: polled until all are.
	long := dial()
	defer keepAliveLater(long, time.Millisecond)()
	deadline := time.Now().Add(5 * time.Second)
	on, idle, intvl, cnt := keep(long)
	for (on != 1 || idle != period || intvl != period || cnt != 9) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		on, idle, intvl, cnt = keep(long)
	}
	if on != 1 || idle != period || intvl != period || cnt != 9 {
		t.Errorf("after the delay: keep-alive %d idle %d interval %d count %d; want 1, %d, %d, 9", on, idle, intvl, cnt, period, period)
	}
	// By now the short flow's timer would have fired, had stop not
	// stopped it.
	time.Sleep(100 * time.Millisecond)
	if on, _, _, _ := keep(short); !stopped || on != 0 {
		t.Errorf("stopped %v, then SO_KEEPALIVE %d; want true, 0", stopped, on)
	}

	// A connection another dialer made keeps its own: no timer.
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if keepAliveLater(a, time.Millisecond)() {
		t.Error("a timer for a connection the proxy did not dial")
	}
}

// TestHostConnRawIO holds hostConn's raw reads and writes (rawio_linux.go)
// to os.File's behaviour: writes larger than the socket can take wait in
// the poller and deliver every byte in order; EOF, a reset, deadlines,
// empty reads and a closed connection answer as os.File's do.
func TestHostConnRawIO(t *testing.T) {
	ln, ep := loopbackListener(t)
	dial := func() (*hostConn, net.Conn) { return dialAccepted(t, ln, ep) }

	t.Run("write waits for room", func(t *testing.T) {
		want := make([]byte, 8<<20)
		for i := range want {
			want[i] = byte(i * 7 / 251)
		}
		for _, chunk := range []int{maxRawIO, len(want)} { // raw writes, then os.File's
			c, srv := dial()
			_ = c.rawConn().Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10) })
			got := make(chan []byte, 1)
			go func() {
				time.Sleep(50 * time.Millisecond) // let the writer fill the socket first
				b, _ := io.ReadAll(srv)
				got <- b
			}()
			for off := 0; off < len(want); off += chunk {
				n, err := c.Write(want[off : off+chunk])
				if err != nil || n != chunk {
					t.Fatalf("Write of %d bytes at %d: %d, %v; want all of it", chunk, off, n, err)
				}
			}
			if err := c.CloseWrite(); err != nil {
				t.Fatal(err)
			}
			if b := <-got; !bytes.Equal(b, want) {
				t.Fatalf("writes of %d bytes: the server read %d bytes, not the %d written in order", chunk, len(b), len(want))
			}
		}
	})

	t.Run("no allocation per packet", func(t *testing.T) {
		c, srv := dial()
		out, in := make([]byte, 64), make([]byte, 64)
		echo := func() {
			if _, err := c.Write(out); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(srv, in); err != nil {
				t.Fatal(err)
			}
			if _, err := srv.Write(in); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, in); err != nil {
				t.Fatal(err)
			}
		}
		echo() // the first use puts the descriptor into the poller
		// The server side's net.Conn allocates nothing per call either.
		if a := testing.AllocsPerRun(100, echo); a != 0 {
			t.Errorf("%.1f allocations per exchange; want 0", a)
		}
	})

	t.Run("read: data, empty, EOF", func(t *testing.T) {
		c, srv := dial()
		if n, err := c.Read(nil); n != 0 || err != nil {
			t.Fatalf("empty Read: %d, %v; want 0, nil", n, err)
		}
		if _, err := srv.Write([]byte("pong")); err != nil {
			t.Fatal(err)
		}
		_ = srv.(*net.TCPConn).CloseWrite()
		b, err := io.ReadAll(c)
		if err != nil || string(b) != "pong" {
			t.Fatalf("ReadAll: %q, %v; want pong then EOF", b, err)
		}
		if n, err := c.Read(make([]byte, 4)); n != 0 || err != io.EOF {
			t.Fatalf("Read after EOF: %d, %v; want 0, io.EOF", n, err)
		}
	})

	t.Run("read: reset", func(t *testing.T) {
		c, srv := dial()
		_ = srv.(*net.TCPConn).SetLinger(0)
		_ = srv.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 4))
		var pe *os.PathError
		if !errors.Is(err, syscall.ECONNRESET) || !errors.As(err, &pe) || pe.Op != "read" {
			t.Fatalf("Read after the endpoint's RST: %v; want a read *os.PathError matching ECONNRESET", err)
		}
	})

	t.Run("deadlines", func(t *testing.T) {
		c, _ := dial()
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read past its deadline: %v; want os.ErrDeadlineExceeded", err)
		}
		_ = c.rawConn().Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 16<<10) })
		_ = c.SetWriteDeadline(time.Now().Add(20 * time.Millisecond))
		// Raw writes until the socket and the peer's receive buffer are
		// full (nobody reads) and the deadline passes.
		chunk := make([]byte, maxRawIO)
		var err error
		for i := 0; i < 1000 && err == nil; i++ {
			var n int
			n, err = c.Write(chunk)
			if err == nil && n != len(chunk) {
				t.Fatalf("Write: %d bytes without an error; want %d", n, len(chunk))
			}
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Write past its deadline: %v; want os.ErrDeadlineExceeded", err)
		}
	})

	t.Run("closed", func(t *testing.T) {
		c, _ := dial()
		_ = c.Close()
		for _, size := range []int{4, maxRawIO + 1} { // raw, then os.File's
			if _, err := c.Read(make([]byte, size)); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Read(%d bytes) on a closed connection: %v; want os.ErrClosed", size, err)
			}
			if _, err := c.Write(make([]byte, size)); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Write(%d bytes) on a closed connection: %v; want os.ErrClosed", size, err)
			}
		}
	})
}

// TestTranslatedSocketUrgentData: an endpoint that sends urgent data in
// the middle of its stream: the translator's peeks from offsets and its
// discards see one stream with the urgent byte inline (SO_OOBINLINE), then
// the EOF. Without it the peeks skipped the urgent byte while the peek
// offset counted it, and a discard stopped at the mark.
func TestTranslatedSocketUrgentData(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sent := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			sent <- err
			return
		}
		defer c.Close()
		rc, _ := c.(*net.TCPConn).SyscallConn()
		var serr error
		for _, w := range []struct {
			b     string
			flags int
		}{{"AB", 0}, {"U", unix.MSG_OOB}, {"CD", 0}} {
			_ = rc.Write(func(fd uintptr) bool {
				serr = unix.Sendto(int(fd), []byte(w.b), w.flags, nil)
				return serr != unix.EAGAIN
			})
			if serr != nil {
				break
			}
			time.Sleep(20 * time.Millisecond) // a segment each
		}
		sent <- serr
	}()
	c, err := dialHost(context.Background(), ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sock, _, err := c.(*hostConn).translatable()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("the endpoint's sends: %v", err)
	}
	time.Sleep(50 * time.Millisecond) // the endpoint's bytes and FIN are queued here
	var got []byte
	buf := make([]byte, 2)
	for len(got) < 10 {
		n, err := sock.Peek(buf)
		if err != nil {
			t.Fatalf("peek after %q: %v", got, err)
		}
		if n == 0 {
			break
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "ABUCD" {
		t.Fatalf("peeked %q; want %q", got, "ABUCD")
	}
	if err := sock.Discard(5); err != nil {
		t.Fatalf("discarding what was peeked: %v", err)
	}
	if err := sock.SetPeekOffset(0); err != nil {
		t.Fatal(err)
	}
	if n, err := sock.Peek(buf); n != 0 || err != nil {
		t.Fatalf("after the discard: %d bytes, %v; want the EOF", n, err)
	}
}

// TestTranslatableBuffers: a translated flow's endpoint socket has send
// and receive buffers of xlWindow (the kernel reports them doubled): its
// receive queue holds what is in flight toward the client, which peeking
// does not let the kernel's autotuning see.
func TestTranslatableBuffers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := dialHost(context.Background(), ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, _, err := c.(*hostConn).translatable(); err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct {
		name string
		opt  int
	}{{"SO_SNDBUF", unix.SO_SNDBUF}, {"SO_RCVBUF", unix.SO_RCVBUF}} {
		v, err := unix.GetsockoptInt(c.(*hostConn).fd, unix.SOL_SOCKET, o.opt)
		if err != nil || v < xlWindow {
			t.Errorf("%s %d (%v); want at least %d", o.name, v, err, xlWindow)
		}
	}
}

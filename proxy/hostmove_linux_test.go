package proxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// hostMoveSide is a proxy serving a NodePort on 127.0.0.1 to an echo
// endpoint.
func hostMoveSide(t *testing.T, nodePort, epPort int) *Proxy {
	t.Helper()
	p, tr, _ := newTestProxyWith(t, Config{}, true)
	tr.OnServiceAdd(svc("web", "10.96.0.1", v1.ProtocolTCP, 80, func(s *v1.Service) {
		s.Spec.Type = v1.ServiceTypeNodePort
		s.Spec.Ports[0].NodePort = int32(nodePort)
	}))
	tr.OnEndpointSliceAdd(slice("web", "web-1", v1.ProtocolTCP, int32(epPort), "", "127.0.0.1"))
	tr.OnSynced()
	return p
}

// echoing writes random chunks to c and checks their echo, n times.
func echoing(t *testing.T, c net.Conn, rng *rand.Rand, n int) {
	t.Helper()
	for range n {
		out := make([]byte, 1+rng.IntN(256<<10))
		for i := range out {
			out[i] = byte(rng.Uint32())
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		errc := make(chan error, 1)
		go func() { _, err := c.Write(out); errc <- err }()
		in := make([]byte, len(out))
		if _, err := io.ReadFull(c, in); err != nil {
			t.Fatalf("reading the echo: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("writing: %v", err)
		}
		if !bytes.Equal(in, out) {
			t.Fatal("the echo differs")
		}
	}
}

// A NodePort connection moved to another proxy keeps carrying bytes both
// ways, every byte intact, with bytes in flight in both directions at the
// cut (large chunks written while the echo is read); a failed handover
// puts it back in the first proxy.
func TestHostFlowMoves(t *testing.T) {
	ep, err := echoOn(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	epPort := ep.Addr().(*net.TCPAddr).Port
	nodePort := freePort(t)
	old := hostMoveSide(t, nodePort, epPort)
	np := old.NewNodePorts([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	defer np.Close()
	np.Sync(old.Table())
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+itoa(nodePort), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	echoing(t, c, rng, 5)

	// A handover that fails: the flow goes on here.
	moved, fds := old.DetachFlows()
	if len(moved.Host) != 1 || len(fds) != 2 {
		t.Fatalf("detached %d host flows with %d sockets, want 1 and 2", len(moved.Host), len(fds))
	}
	old.ReattachFlows()
	echoing(t, c, rng, 5)

	// A writer keeps bytes in flight while the flow moves.
	next := hostMoveSide(t, nodePort, epPort)
	stop := make(chan struct{})
	errc := make(chan error, 1)
	var sent, got bytes.Buffer
	go func() {
		w := rand.New(rand.NewPCG(3, 4))
		for {
			select {
			case <-stop:
				errc <- nil
				return
			default:
			}
			out := make([]byte, 64<<10)
			for i := range out {
				out[i] = byte(w.Uint32())
			}
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(out); err != nil {
				errc <- err
				return
			}
			sent.Write(out)
		}
	}()
	readDone := make(chan error, 1)
	var hold atomic.Bool // the client stops reading: the proxy's writes to it block
	go func() {
		buf := make([]byte, 32<<10)
		for {
			for hold.Load() {
				time.Sleep(time.Millisecond)
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := c.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				readDone <- err
				return
			}
		}
	}()
	// Cuts until one falls inside a write (the client stops reading for a
	// while, so that the buffers fill), each put back but the last: bytes
	// read and not written at the cut must reach their peer, here or in
	// the next proxy.
	for cut := 1; ; cut++ {
		time.Sleep(20 * time.Millisecond)
		hold.Store(true)
		time.Sleep(100 * time.Millisecond)
		moved, fds = old.DetachFlows()
		hold.Store(false)
		if len(moved.Host) != 1 {
			t.Fatalf("cut %d: detached %d host flows, want 1", cut, len(moved.Host))
		}
		held := moved.Host[0].Pending
		if len(held[0])+len(held[1]) > 0 {
			t.Logf("cut %d held %d bytes toward the endpoint, %d toward the client", cut, len(held[0]), len(held[1]))
			break
		}
		if cut == 100 { // about one cut in ten falls inside a write here
			t.Fatal("100 cuts, none inside a write")
		}
		old.ReattachFlows()
	}
	tcp, _, err := next.AdoptFlows(nil, moved, asFiles(t, fds))
	if err != nil || tcp != 1 {
		t.Fatalf("adopted %d flows: %v", tcp, err)
	}
	next.StartAdopted(nil)
	old.ForgetDetached()
	time.Sleep(100 * time.Millisecond)
	close(stop)
	if err := <-errc; err != nil {
		t.Fatalf("the writer: %v", err)
	}
	// Everything written comes back: half-close, read to the end.
	_ = c.(*net.TCPConn).CloseWrite()
	if err := <-readDone; err != io.EOF {
		t.Fatalf("the reader ended with %v, want EOF after the echo", err)
	}
	if !bytes.Equal(got.Bytes(), sent.Bytes()) {
		t.Fatalf("%d bytes sent, %d came back, equal %v", sent.Len(), got.Len(), bytes.Equal(got.Bytes(), sent.Bytes()))
	}
	t.Logf("%d bytes through the move", sent.Len())
	if n := old.Flows(); n != 0 {
		t.Errorf("the old proxy still has %d flows", n)
	}
}

// NodePort listeners lent in a handover: while lent, the old proxy accepts
// nothing (a connection waits in the listener's queue); a failed handover
// gives them back; the next proxy serves the NodePort on the listener it
// inherited, the connection that waited included, with the port still
// bound by the old proxy.
func TestNodePortListenersLent(t *testing.T) {
	ep, err := echoOn(t, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	epPort := ep.Addr().(*net.TCPAddr).Port
	nodePort := freePort(t)
	addr := "127.0.0.1:" + itoa(nodePort)
	old := hostMoveSide(t, nodePort, epPort)
	np := old.NewNodePorts([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	defer np.Close()
	np.Sync(old.Table())
	ping := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		got := make([]byte, 4)
		_, err := io.ReadFull(c, got)
		return err
	}
	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	lent := np.Lend()
	if len(lent) != 1 || lent[0].Name != "TCP "+addr {
		t.Fatalf("lent %+v, want the one TCP NodePort", lent)
	}
	waiting := dial() // the kernel completes it; nobody accepts it yet
	_ = waiting.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := waiting.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := waiting.Read(make([]byte, 4)); err == nil {
		t.Fatal("a lent NodePort served a connection")
	}
	np.Unlend()
	if err := ping(dial()); err != nil {
		t.Fatalf("after the listeners came back: %v", err)
	}

	lent = np.Lend()
	again := dial()
	next := hostMoveSide(t, nodePort, epPort)
	np2 := next.NewNodePorts([]netip.Addr{netip.MustParseAddr("127.0.0.1")})
	defer np2.Close()
	files := asFiles(t, []int{lent[0].FD})
	np2.Inherit(map[string]*os.File{lent[0].Name: files[0]})
	np2.Sync(next.Table())
	np2.DropInherited()
	if f := np2.Failed(); len(f) != 0 {
		t.Fatalf("the next proxy could not serve the NodePort: %v", f)
	}
	if err := ping(again); err != nil {
		t.Fatalf("the connection that waited, served by the next proxy: %v", err)
	}
	np.Close() // the old proxy lets its listener go
	if err := ping(dial()); err != nil {
		t.Fatalf("a new connection after the old proxy closed: %v", err)
	}
}

package kube

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/streaming/pkg/httpstream"
	"k8s.io/streaming/pkg/httpstream/spdy"

	"github.com/userproxy/userproxy/service"
)

// Ports of fakeKubelet.
const (
	portEcho     = 1 // echoes
	portFirehose = 2 // writes without end
)

// fakeKubelet is an in-process SPDY server speaking the port-forward
// streams' pairing loosely (data streams only), for the PortForwarder's
// lifecycle: replies can be held back, and the opening of a tunnel slowed.
type fakeKubelet struct {
	t         *testing.T
	ln        net.Listener
	delay     atomic.Int64 // nanoseconds each stream's reply is held back
	openDelay atomic.Int64 // nanoseconds each opening takes
	opens     atomic.Int64
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     []httpstream.Connection
}

func newFakeKubelet(t *testing.T) *fakeKubelet {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{t: t, ln: ln}
	k.wg.Go(func() { // fake kubelet acceptor
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := spdy.NewServerConnection(c, k.stream)
			if err != nil {
				c.Close()
				continue
			}
			k.mu.Lock()
			k.conns = append(k.conns, sc)
			k.mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		k.mu.Lock()
		for _, c := range k.conns {
			c.Close()
		}
		k.mu.Unlock()
		k.wg.Wait()
	})
	return k
}

func (k *fakeKubelet) stream(s httpstream.Stream, _ <-chan struct{}) error {
	time.Sleep(time.Duration(k.delay.Load()))
	h := s.Headers()
	if h.Get(v1.StreamType) != v1.StreamTypeData {
		return nil
	}
	port, _ := strconv.Atoi(h.Get(v1.PortHeader))
	k.wg.Go(func() { // fake kubelet stream
		defer s.Close()
		switch port {
		case portEcho:
			_, _ = io.Copy(s, s)
		case portFirehose:
			b := make([]byte, 32<<10)
			for {
				if _, err := s.Write(b); err != nil {
					return
				}
			}
		}
	})
	return nil
}

// forwarder returns a PortForwarder whose tunnels go to k.
func (k *fakeKubelet) forwarder(cfg PortForwardConfig) *PortForwarder {
	cfg.REST = &rest.Config{Host: "https://127.0.0.1:1"} // never contacted
	f, err := NewPortForwarder(cfg)
	if err != nil {
		k.t.Fatal(err)
	}
	f.open = func(service.PodRef) (httpstream.Connection, error) {
		k.opens.Add(1)
		time.Sleep(time.Duration(k.openDelay.Load()))
		c, err := net.Dial("tcp", k.ln.Addr().String())
		if err != nil {
			return nil, err
		}
		return spdy.NewClientConnection(c)
	}
	k.t.Cleanup(func() { f.Close(); f.waitOpeners() })
	return f
}

var testPod = service.PodRef{Namespace: "ns", Name: "pod"}

func dialWithin(f *PortForwarder, port uint16, d time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return f.DialPod(ctx, testPod, port)
}

func echo(c net.Conn, msg string) error {
	if _, err := io.WriteString(c, msg); err != nil {
		return err
	}
	b := make([]byte, len(msg))
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	if string(b) != msg {
		return errors.New("echoed " + string(b))
	}
	return nil
}

// waitUntil polls cond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestTunnelThatDoesNotAnswerIsRetired: a stream pair that takes longer
// than streamAttempt retires its tunnel, and the dial goes on through a new
// one, while the flows of the old tunnel go on; the old tunnel closes with
// its last flow.
func TestTunnelThatDoesNotAnswerIsRetired(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{})
	a, err := dialWithin(f, portEcho, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := echo(a, "first"); err != nil {
		t.Fatal(err)
	}
	k.delay.Store(int64(streamAttempt + 500*time.Millisecond))
	b, err := dialWithin(f, portEcho, 10*time.Second)
	if err != nil {
		t.Fatalf("a dial after a tunnel stopped answering: %v", err)
	}
	k.delay.Store(0)
	if err := echo(b, "new tunnel"); err != nil {
		t.Fatal(err)
	}
	if err := echo(a, "still here"); err != nil {
		t.Fatalf("the retired tunnel's flow: %v", err)
	}
	if s := f.Stats(); s.Opens != 2 || s.Broken != 1 {
		t.Errorf("stats %+v, want 2 opens and 1 tunnel given up", s)
	}
	a.Close()
	b.Close()
	waitUntil(t, "the flows to be uncounted", func() bool { return f.Stats().StreamsOpen == 0 })
}

// TestGivenUpOpeningGoesIdle: a tunnel that opens after every dial waiting
// for it gave up is closed after Idle, not kept.
func TestGivenUpOpeningGoesIdle(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{Idle: 50 * time.Millisecond})
	k.openDelay.Store(int64(200 * time.Millisecond))
	if _, err := dialWithin(f, portEcho, 20*time.Millisecond); err == nil {
		t.Fatal("a dial shorter than the opening succeeded")
	}
	waitUntil(t, "the tunnel to open", func() bool { return f.Stats().Opens == 1 })
	waitUntil(t, "the unused tunnel to close", func() bool { s := f.Stats(); return s.Tunnels == 0 && s.IdleClosed == 1 })
	if s := f.Stats(); s.StreamsOpen != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestAbandonedStreamsAreNotCounted: streams that arrive after their dial
// gave up are freed, and the open-flow count stays right.
func TestAbandonedStreamsAreNotCounted(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{Idle: 50 * time.Millisecond})
	c, err := dialWithin(f, portEcho, 5*time.Second) // the tunnel is open
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	k.delay.Store(int64(300 * time.Millisecond))
	if _, err := dialWithin(f, portEcho, 100*time.Millisecond); err == nil {
		t.Fatal("a dial shorter than the streams' reply succeeded")
	}
	time.Sleep(800 * time.Millisecond) // both replies arrive
	if s := f.Stats(); s.StreamsOpen != 0 || s.StreamFailures != 1 {
		t.Errorf("stats %+v, want 0 streams open and 1 failure", s)
	}
	waitUntil(t, "the tunnel to go idle", func() bool { return f.Stats().Tunnels == 0 })
}

// TestStalledClientIsResetAlone: a flow whose client reads nothing while the
// pod writes fills its buffer and, after StallLimit, is reset with an error;
// the tunnel's other flows carry on once it is.
func TestStalledClientIsResetAlone(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{StallLimit: 300 * time.Millisecond})
	hose, err := dialWithin(f, portFirehose, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer hose.Close()
	e, err := dialWithin(f, portEcho, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	time.Sleep(time.Second) // the firehose fills its buffer, and is reset
	start := time.Now()
	if err := echo(e, "other flow"); err != nil {
		t.Fatalf("the other flow: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the other flow waited %v", took)
	}
	n, err := io.Copy(io.Discard, hose)
	if err == nil || !errors.Is(err, errStalled) {
		t.Fatalf("the stalled flow read %d bytes, then %v; want errStalled", n, err)
	}
	if n < maxBuffered/2 {
		t.Errorf("the stalled flow kept %d bytes, want its buffer (%d)", n, maxBuffered)
	}
	if _, err := hose.Write([]byte("x")); !errors.Is(err, errStalled) {
		t.Errorf("a write to the stalled flow: %v, want errStalled (not bytes dropped silently)", err)
	}
}

// TestReadAfterClose: a flow closed while its reader waits ends that read
// with net.ErrClosed, and every read after, never (0, nil).
func TestReadAfterClose(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{})
	c, err := dialWithin(f, portEcho, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 8)); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	c.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Errorf("the waiting read: %v, want net.ErrClosed", err)
	}
	for range 3 {
		if n, err := c.Read(make([]byte, 8)); n != 0 || !errors.Is(err, net.ErrClosed) {
			t.Fatalf("a read after Close: %d, %v; want net.ErrClosed", n, err)
		}
	}
}

// TestCloseStopsOpenings: Close does not wait for an opening in progress,
// and dials after it fail with ErrClosed.
func TestCloseStopsOpenings(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{})
	k.openDelay.Store(int64(time.Second))
	errc := make(chan error, 1)
	go func() { _, err := dialWithin(f, portEcho, 5*time.Second); errc <- err }()
	waitUntil(t, "the opening to start", func() bool { return k.opens.Load() == 1 })
	start := time.Now()
	f.Close()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close took %v with an opening in progress", took)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("the waiting dial: %v, want ErrClosed", err)
	}
	if _, err := dialWithin(f, portEcho, time.Second); !errors.Is(err, ErrClosed) {
		t.Errorf("a dial after Close: %v, want ErrClosed", err)
	}
	time.Sleep(1200 * time.Millisecond) // the abandoned opening ends (goleak)
}

// TestCloseDoesNotWaitForStreamReplies: a stream pair whose reply never
// comes in time (a tunnel whose kubelet died) holds no one up: the dial
// fails at its deadline and Close returns at once, though the SPDY library
// still waits for the reply.
func TestCloseDoesNotWaitForStreamReplies(t *testing.T) {
	k := newFakeKubelet(t)
	f := k.forwarder(PortForwardConfig{})
	c, err := dialWithin(f, portEcho, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	k.delay.Store(int64(time.Second))
	if _, err := dialWithin(f, portEcho, 200*time.Millisecond); err == nil {
		t.Fatal("a dial shorter than the reply succeeded")
	}
	start := time.Now()
	f.Close()
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Close waited %v for a stream reply", took)
	}
}

package netstack

import (
	"context"
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/translate"
)

// memSocket is an endpoint socket in memory that takes every write and
// holds the endpoint's bytes in queue; its Peek panics once armed, as a
// bug in a flow's code would.
type memSocket struct {
	queue   []byte
	peekOff int
	aborted bool
	armed   bool
}

func (s *memSocket) Write(b []byte) (int, error) { return len(b), nil }
func (s *memSocket) Peek(b []byte) (int, error) {
	if s.armed {
		panic("a bug in the flow's TCP")
	}
	if s.peekOff >= len(s.queue) {
		return 0, ErrSocketEmpty
	}
	n := copy(b, s.queue[s.peekOff:])
	s.peekOff += n
	return n, nil
}
func (s *memSocket) Discard(n int) error {
	s.queue = s.queue[n:]
	s.peekOff = max(0, s.peekOff-n)
	return nil
}
func (s *memSocket) SetPeekOffset(n int) error { s.peekOff = n; return nil }
func (s *memSocket) ShutdownWrite() error      { return nil }
func (s *memSocket) Abort()                    { s.aborted = true }
func (s *memSocket) Space() (int, error)       { return 1 << 20, nil }
func (s *memSocket) Writable() bool            { return true }

// clientPacket builds the client's segment to the service, a whole IPv4
// packet.
func clientPacket(client, svc netip.AddrPort, seq, ack uint32, flags byte) []byte {
	w := translate.NewWriter(client, svc)
	p := make([]byte, 100)
	return p[:w.Build(p, seq, ack, flags, 0xffff, nil, nil)]
}

// TestTranslatedFlowPanicContained: a panic in one flow's TCP, on any of
// its entries (the gate's input on the TUN's reader, the owner's
// readiness reports, the timers), ends that flow with a RST to the client
// and an aborted socket, is counted and logged with its stack, and does not
// reach the caller.
func TestTranslatedFlowPanicContained(t *testing.T) {
	client, svc := netip.MustParseAddrPort("10.0.0.7:40000"), netip.MustParseAddrPort("10.96.0.10:80")
	for _, entry := range []string{"input", "readable", "timer"} {
		t.Run(entry, func(t *testing.T) {
			ct, err := conntrack.NewTable(conntrack.Config{})
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.ErrorLevel)
			st := &Stack{logger: zap.New(core)}
			st.resets.ct = ct
			sock := &memSocket{}
			var out [][]byte
			now := time.Unix(1000, 0)
			syn, _ := parseTCP(clientPacket(client, svc, 5000, 0, tcpSYN))
			f := translate.New(translate.Config{
				Sock: sock, Writer: translate.NewWriter(svc, client), Emit: func(p []byte) { out = append(out, append([]byte(nil), p...)) },
				Now: func() time.Time { return now }, ISS: 1000, RcvWnd: 1 << 20, LinkMSS: 1460,
			}, syn)
			f.Start()
			ack, _ := parseTCP(clientPacket(client, svc, 5001, 1001, tcpACK))
			f.Input(ack)
			woken := 0
			r := &TranslateRequest{x: &translator{st: st}}
			r.released.Store(true) // no in-flight slot to give back
			tf := &TranslatedFlow{f: f, r: r, wake: func() { woken++ }}
			tf.timer = time.AfterFunc(time.Hour, func() {})
			tf.ack = time.AfterFunc(time.Hour, func() {})
			defer tf.Forget()
			sock.queue = []byte("answer")
			switch entry {
			case "input":
				// A pure ACK that pumps: the peek panics under input.
				sock.armed = true
				tf.input(clientPacket(client, svc, 5001, 1001, tcpACK))
			case "readable":
				sock.armed = true
				if !tf.Readable() {
					t.Errorf("Readable reports the flow live after its panic")
				}
			case "timer":
				tf.Readable() // the answer goes out, the timer armed
				sock.armed = true
				now = now.Add(2 * time.Second)
				tf.onRTO() // rewinds and peeks
			}
			if got := st.counters.flowPanics.Load(); got != 1 {
				t.Errorf("flow panics counted: %d; want 1", got)
			}
			if !tf.Ended() || !sock.aborted || woken == 0 {
				t.Errorf("after the panic: ended %v, socket aborted %v, owner woken %d times", tf.Ended(), sock.aborted, woken)
			}
			if last, _ := parseTCP(out[len(out)-1]); last.Flags()&tcpRST == 0 {
				t.Errorf("the client's last segment has flags %#x; want a RST", last.Flags())
			}
			if e := logs.FilterMessageSnippet("panicked").All(); len(e) != 1 || e[0].ContextMap()["stack"] == nil {
				t.Errorf("logged %+v; want one error with the stack", e)
			}
		})
	}
}

// holdingHandler holds every translated request until the test has
// answered it and says so on done.
type holdingHandler struct {
	echoHandler
	reqs chan *TranslateRequest
	done chan struct{}
}

func (h holdingHandler) HandleTranslated(r *TranslateRequest) {
	h.reqs <- r
	<-h.done
}

// newTranslatingStack is a translating stack on a memory link with one
// in-flight slot, its clock now, whose handler holds each request.
func newTranslatingStack(t *testing.T, now func() time.Time) (*Stack, *MemoryLink, holdingHandler) {
	t.Helper()
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept, TranslateTCP: true, MaxInFlight: 1, MaxInFlightPerClient: 1, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	h := holdingHandler{reqs: make(chan *TranslateRequest, 4), done: make(chan struct{}, 4)}
	st.SetFlowHandler(h)
	return st, link, h
}

// TestTranslatedSYNAfterInFlightDrop: a SYN the in-flight bound dropped is
// retransmitted by the client; the retransmission is the translator's new
// request, not a SYN that gVisor's TCP takes (the flow would have switched
// paths silently, outside the bound).
func TestTranslatedSYNAfterInFlightDrop(t *testing.T) {
	st, link, h := newTranslatingStack(t, time.Now)
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	a, b := netip.MustParseAddrPort("10.0.0.7:40001"), netip.MustParseAddrPort("10.0.0.7:40002")
	link.Inject(tcpPacket(a, svc, header.TCPFlagSyn, 100, 0))
	ra := <-h.reqs
	link.Inject(tcpPacket(b, svc, header.TCPFlagSyn, 200, 0)) // over the bound: dropped
	waitUntil(t, func() bool { return st.Stats().InFlightLimited == 1 })
	ra.Refuse()
	h.done <- struct{}{}
	link.Inject(tcpPacket(b, svc, header.TCPFlagSyn, 200, 0)) // the client's retransmission
	select {
	case rb := <-h.reqs:
		if rb.Client() != b {
			t.Fatalf("request from %s; want %s", rb.Client(), b)
		}
		rb.Refuse()
		h.done <- struct{}{}
	case <-time.After(5 * time.Second):
		t.Fatalf("the retransmitted SYN never reached the translator (gVisor's TCP took it)")
	}
}

// TestTranslatedHalfOpenEvicted: with every in-flight slot held by
// handshakes whose SYN-ACK went unanswered (a spoofed SYN flood), a new
// client's SYN resets the oldest of them once it has waited xlHalfOpenAge
// and takes its slot; before that, it is dropped.
func TestTranslatedHalfOpenEvicted(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	st, link, h := newTranslatingStack(t, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	spoofed, real := netip.MustParseAddrPort("198.18.0.1:1024"), netip.MustParseAddrPort("10.0.0.7:40002")
	link.Inject(tcpPacket(spoofed, svc, header.TCPFlagSyn, 100, 0))
	ra := <-h.reqs
	sock := &memSocket{}
	tf := ra.Accept(sock, 1<<20, func() {}, func(func()) {}, nil)
	defer tf.Forget()
	h.done <- struct{}{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if synAck := link.Read(ctx); synAck == nil {
		t.Fatal("no SYN-ACK")
	}

	link.Inject(tcpPacket(real, svc, header.TCPFlagSyn, 200, 0)) // the slot is young: dropped
	waitUntil(t, func() bool { return st.Stats().InFlightLimited == 1 })
	if tf.Ended() {
		t.Fatal("a handshake younger than xlHalfOpenAge was reset")
	}
	mu.Lock()
	now = now.Add(xlHalfOpenAge)
	mu.Unlock()
	link.Inject(tcpPacket(real, svc, header.TCPFlagSyn, 200, 0)) // the client's retransmission
	select {
	case rb := <-h.reqs:
		if rb.Client() != real {
			t.Fatalf("request from %s; want %s", rb.Client(), real)
		}
		rb.Refuse()
		h.done <- struct{}{}
	case <-time.After(5 * time.Second):
		t.Fatal("the new client's SYN never reached the handler")
	}
	if !tf.Ended() || !sock.aborted || st.Stats().HandshakesAborted != 1 {
		t.Fatalf("the old handshake: ended %v, socket aborted %v, handshakes aborted %d", tf.Ended(), sock.aborted, st.Stats().HandshakesAborted)
	}
	for {
		p := link.Read(ctx)
		if p == nil {
			t.Fatal("no RST to the old handshake's client")
		}
		if s, ok := parseTCP(p); ok && s.Flags()&tcpRST != 0 && netip.AddrFrom4([4]byte(p[16:20])) == spoofed.Addr() {
			break
		}
	}
}

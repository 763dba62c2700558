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
)

// panickySocket is a fake endpoint socket whose Peek panics once armed, as
// a bug in the flow's code would.
type panickySocket struct {
	fakeSocket
	armed bool
}

func (s *panickySocket) Peek(b []byte) (int, error) {
	if s.armed {
		panic("a bug in the flow's TCP")
	}
	return s.fakeSocket.Peek(b)
}

// TestTranslatedFlowPanicContained: a panic in one flow's TCP, on any of
// its entries (the gate's input on the TUN's reader, the owner's
// readiness reports, the timers), ends that flow with a RST to the client
// and an aborted socket, is counted and logged with its stack, and does not
// reach the caller.
func TestTranslatedFlowPanicContained(t *testing.T) {
	for _, entry := range []string{"input", "readable", "timer"} {
		t.Run(entry, func(t *testing.T) {
			ct, err := conntrack.NewTable(conntrack.Config{})
			if err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.ErrorLevel)
			st := &Stack{logger: zap.New(core)}
			st.resets.ct = ct
			sock := &panickySocket{fakeSocket: fakeSocket{room: -1}}
			h := newXLHarness(t, clientSeg{mss: 1460, ws: 7, wnd: 64240})
			h.f.sock = sock
			h.established(0xffff)
			woken := 0
			r := &TranslateRequest{x: &translator{st: st}}
			r.released.Store(true) // no in-flight slot to give back
			tf := &TranslatedFlow{f: h.f, r: r, wake: func() { woken++ }}
			tf.timer = time.AfterFunc(time.Hour, func() {})
			tf.ack = time.AfterFunc(time.Hour, func() {})
			defer tf.Forget()
			sock.queue, sock.armed = []byte("answer"), true
			switch entry {
			case "input":
				// A pure ACK that pumps: the peek panics under input.
				w := *testSegWriter(t, "10.0.0.7:40000", "10.96.0.10:80")
				pkt := make([]byte, 60)
				n := w.build(pkt, h.seq, testISS+1, tcpACK, 0xffff, nil, nil)
				tf.input(pkt[:n])
			case "readable":
				if !tf.Readable() {
					t.Errorf("Readable reports the flow live after its panic")
				}
			case "timer":
				h.f.mu.Lock()
				h.f.rtoArmed, h.f.sndNxt, h.f.sndMax = true, h.f.sndNxt+6, h.f.sndMax+6
				h.f.mu.Unlock()
				h.now = h.now.Add(time.Second)
				tf.onRTO() // rewinds and peeks
			}
			if got := st.counters.flowPanics.Load(); got != 1 {
				t.Errorf("flow panics counted: %d; want 1", got)
			}
			if !tf.Ended() || !sock.aborted || woken == 0 {
				t.Errorf("after the panic: ended %v, socket aborted %v, owner woken %d times", tf.Ended(), sock.aborted, woken)
			}
			out := h.take()
			if len(out) == 0 || out[len(out)-1].flags&tcpRST == 0 {
				t.Errorf("the client got %+v; want a RST last", out)
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

// TestTranslatedSYNAfterInFlightDrop: a SYN the in-flight bound dropped is
// retransmitted by the client; the retransmission is the translator's new
// request, not a SYN that gVisor's TCP takes (the flow would have switched
// paths silently, outside the bound).
func TestTranslatedSYNAfterInFlightDrop(t *testing.T) {
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept, TranslateTCP: true, MaxInFlight: 1, MaxInFlightPerClient: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := holdingHandler{reqs: make(chan *TranslateRequest, 4), done: make(chan struct{}, 4)}
	st.SetFlowHandler(h)
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
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept, TranslateTCP: true, MaxInFlight: 1, MaxInFlightPerClient: 1, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	h := holdingHandler{reqs: make(chan *TranslateRequest, 4), done: make(chan struct{}, 4)}
	st.SetFlowHandler(h)
	svc := netip.MustParseAddrPort("10.96.0.10:80")
	spoofed, real := netip.MustParseAddrPort("198.18.0.1:1024"), netip.MustParseAddrPort("10.0.0.7:40002")
	link.Inject(tcpPacket(spoofed, svc, header.TCPFlagSyn, 100, 0))
	ra := <-h.reqs
	sock := &fakeSocket{room: -1}
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
		if s, ok := parseClientSeg(p); ok && s.flags&tcpRST != 0 && netip.AddrFrom4([4]byte(p[16:20])) == spoofed.Addr() {
			break
		}
	}
}

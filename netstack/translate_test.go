package netstack

import (
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

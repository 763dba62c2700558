package translate

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// moveFlow exports h's flow and restores it around the same socket, as
// the next process does after a handover, later by pause.
func (h *harness) moveFlow(pause time.Duration) {
	h.t.Helper()
	m, err := h.f.Export()
	if err != nil {
		h.t.Fatalf("Export: %v", err)
	}
	h.now = h.now.Add(pause)
	f, err := Restore(h.cfg, m)
	if err != nil {
		h.t.Fatalf("Restore: %v", err)
	}
	h.f = f
	h.f.Resume()
}

// client is a receiver of the flow's segments, as simple as RFC 9293
// allows: it takes in-order bytes, drops the rest and answers each
// segment with its cumulative ACK.
type client struct {
	nxt    uint32
	got    []byte
	fin    bool
	lastTS uint32
}

// TestFlowMoved: a flow moved mid-transfer, both ways, with and without
// SACK and timestamps, and with the first segment after the move lost:
// the client gets the endpoint's every byte in order, the endpoint gets
// the client's, the timestamps go on from the old process's (PAWS would
// drop a segment whose value went back), and the flow ends orderly.
func TestFlowMoved(t *testing.T) {
	for _, c := range []struct{ ts, sack bool }{{true, true}, {false, false}, {true, false}, {false, true}} {
		h := newHarnessLink(t, Segment{mss: 100, ws: 7, ts: c.ts, tsVal: 1, sackOK: c.sack, wnd: 65535}, 1460, false)
		h.established(65535)
		want := make([]byte, 5000)
		for i := range want {
			want[i] = byte(i * 7)
		}
		h.sock.queue = bytes.Clone(want)
		h.segment(0, testISS+1, 65535, "before ")
		h.f.Readable()
		cl := &client{nxt: testISS + 1}
		deliver := func(segs []Segment, drop func(s Segment) bool) {
			for _, s := range segs {
				if c.ts && s.ts {
					if int32(s.tsVal-cl.lastTS) < 0 {
						t.Fatalf("ts %v sack %v: a timestamp %d after %d", c.ts, c.sack, s.tsVal, cl.lastTS)
					}
					cl.lastTS = s.tsVal
				}
				if off := int(s.seq - (testISS + 1)); len(s.payload) > 0 && (off+len(s.payload) > len(want) || !bytes.Equal(s.payload, want[off:off+len(s.payload)])) {
					t.Fatalf("ts %v sack %v: sent at %d bytes that are not the endpoint's there", c.ts, c.sack, off)
				}
				if drop != nil && drop(s) {
					continue
				}
				if len(s.payload) > 0 && s.seq == cl.nxt {
					cl.got = append(cl.got, s.payload...)
					cl.nxt += uint32(len(s.payload))
				}
				if s.flags&tcpFIN != 0 && s.seq+uint32(len(s.payload)) == cl.nxt {
					cl.fin = true
					cl.nxt++
				}
				h.f.Input(Segment{seq: h.seq, ack: cl.nxt, flags: tcpACK, wnd: 65535, ws: -1, ts: c.ts, tsVal: 2, tsEcr: s.tsVal})
			}
		}
		feed := func(drop func(s Segment) bool) { deliver(h.take(), drop) }
		// Half the first flight is answered before the move; the rest
		// reaches the client after it, and its ACKs the new flow.
		first := h.take()
		if len(first) < 4 {
			t.Fatalf("first flight: %d segments", len(first))
		}
		deliver(first[:len(first)/2], nil)
		h.take()
		h.moveFlow(5 * time.Millisecond)
		deliver(first[len(first)/2:], nil)
		h.segment(0, cl.nxt, 65535, "after")
		dropped := false
		feed(func(s Segment) bool {
			if len(s.payload) > 0 && !dropped {
				dropped = true
				return true
			}
			return false
		})
		h.sock.eof = true
		h.f.Readable()
		for i := 0; i < 200 && !cl.fin; i++ {
			if len(h.out) == 0 {
				h.now = h.now.Add(h.f.rtoDelay())
				h.f.OnRTO()
			}
			feed(nil)
		}
		if !cl.fin || !bytes.Equal(cl.got, want) {
			t.Fatalf("ts %v sack %v: the client got %d of %d bytes, FIN %v", c.ts, c.sack, len(cl.got), len(want), cl.fin)
		}
		if string(h.sock.written) != "before after" {
			t.Fatalf("ts %v sack %v: the endpoint got %q", c.ts, c.sack, h.sock.written)
		}
		h.segment(tcpFIN, cl.nxt, 65535, "")
		if !h.f.Ended() || !h.f.orderly {
			t.Fatalf("ts %v sack %v: not ended orderly after both FINs", c.ts, c.sack)
		}
	}
}

// TestFlowMovedInHandshake: a flow whose SYN-ACK is out moves too: the
// new process sends the same SYN-ACK again if the client's ACK does not
// come, and the ACK completes the handshake there; an ended flow does not
// move.
func TestFlowMovedInHandshake(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, ts: true, tsVal: 1, sackOK: true, wnd: 512})
	synAck := h.take()
	h.moveFlow(0)
	if !h.f.State().SynRcvd {
		t.Fatal("restored out of its handshake")
	}
	h.now = h.now.Add(h.f.rtoDelay())
	h.f.OnRTO()
	again := h.take()
	if len(again) != 1 || again[0].flags != tcpSYN|tcpACK || again[0].seq != synAck[0].seq || again[0].ack != synAck[0].ack {
		t.Fatalf("the SYN-ACK's timer in the new process sent %+v; want the SYN-ACK again", again)
	}
	h.sock.queue = []byte("hello")
	h.segment(0, testISS+1, 512, "")
	h.f.Readable()
	if got := payloads(h.take()); len(got) != 1 || got[0] != [2]uint32{0, 5} {
		t.Fatalf("after the client's ACK: %v", got)
	}
	h.f.Abort()
	if _, err := h.f.Export(); err == nil {
		t.Fatal("an ended flow exported")
	}
}

// TestRestoreRefuses: a moved state that breaks a flow's invariants (a
// snapshot from a broken or hostile source) is refused, naming what.
func TestRestoreRefuses(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, ts: true, tsVal: 1, sackOK: true, wnd: 512})
	h.established(512)
	good, err := h.f.Export()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(h.cfg, good); err != nil {
		t.Fatalf("the flow's own state: %v", err)
	}
	// Past 2 GiB each way, sequence space has wrapped past the ISS and
	// the IRS: still a good flow (an iperf3 stream's, moved by SIGHUP).
	long := good
	long.ISS, long.IRS = long.SndUna-3<<30, long.RcvNxt-3<<30
	long.Recover = long.SndUna - 1
	if _, err := Restore(h.cfg, long); err != nil {
		t.Errorf("a flow 3 GiB long each way: %v", err)
	}
	for _, c := range []struct {
		name, want string
		mod        func(m *Moved)
	}{
		{"tiny MSS", "MSS", func(m *Moved) { m.MSS = 12 }},
		{"scale past 14", "scales", func(m *Moved) { m.SndShift = 15 }},
		{"scales without the client's", "did not agree", func(m *Moved) { m.PeerWS = -1 }},
		{"una past max", "una", func(m *Moved) { m.SndUna = m.SndMax + 10 }},
		{"nxt past max", "una", func(m *Moved) { m.SndNxt = m.SndMax + 1 }},
		{"FIN sent below max", "FIN", func(m *Moved) { m.FinSent, m.FinSeen, m.SndMax = true, true, m.SndNxt+5 }},
		{"zero window", "window", func(m *Moved) { m.RcvWnd = 0 }},
		{"reordering threshold", "reordering", func(m *Moved) { m.DupThresh = 1 }},
		{"zero cwnd", "cwnd", func(m *Moved) { m.Cwnd = 0 }},
		{"negative RTT", "round trips", func(m *Moved) { m.SRTT = -time.Second }},
	} {
		m := good
		c.mod(&m)
		if _, err := Restore(h.cfg, m); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error naming %q", c.name, err, c.want)
		}
	}
}

// TestFlowDetached: a detached flow (handed to the next process) does
// nothing, whatever its old owner still calls: no segment out, no byte
// written to or taken from the socket, no reset; once reattached (the
// handover failed) it goes on, its peek offset set again; an Abort that
// came while it was detached is done at the reattach.
func TestFlowDetached(t *testing.T) {
	h := newHarnessLink(t, Segment{mss: 100, ws: 7, sackOK: true, wnd: 65535}, 1460, false)
	h.established(65535)
	h.sock.queue = bytes.Repeat([]byte("x"), 300)
	h.f.Readable()
	h.take()
	if _, err := h.f.Detach(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.f.Export(); err == nil {
		t.Fatal("a detached flow exported twice")
	}
	h.sock.queue = append(h.sock.queue, "more"...)
	h.segment(0, testISS+1+300, 65535, "client bytes")
	h.f.Readable()
	h.now = h.now.Add(time.Second)
	h.f.OnRTO()
	h.f.FlushAck()
	if out := h.take(); len(out) > 0 || len(h.sock.written) > 0 || len(h.sock.queue) != 304 || h.sock.aborted || h.f.Ended() {
		t.Fatalf("detached: %d segments out, %d bytes written, %d queued, aborted %v", len(out), len(h.sock.written), len(h.sock.queue), h.sock.aborted)
	}
	if st := h.f.State(); st.RTO || st.Ack || st.Closed {
		t.Fatalf("a detached flow asks for %+v", st)
	}
	h.sock.peekOff = 0 // as a next process that gave up may leave it
	h.f.Reattach()
	if h.sock.aborted || h.f.Ended() {
		t.Fatal("reattached: ended")
	}
	h.f.Readable()
	if got := payloads(h.take()); len(got) == 0 || got[0] != [2]uint32{300, 4} {
		t.Fatalf("reattached: sent %v; want the 4 bytes after the 300 in flight", got)
	}

	h.f.Detach()
	h.f.Abort()
	h.f.Reattach()
	if out := h.take(); len(out) != 1 || out[0].flags&tcpRST == 0 || !h.sock.aborted {
		t.Fatalf("an Abort while detached, then reattached: %+v, socket aborted %v; want the reset", out, h.sock.aborted)
	}
}

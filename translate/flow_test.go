package translate

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fakeSocket is an endpoint socket in memory: write takes up to room
// bytes (room < 0: all); the endpoint's bytes wait in queue, peeked from
// peekOff as the kernel's SO_PEEK_OFF does.
type fakeSocket struct {
	written  []byte
	room     int
	queue    []byte
	peekOff  int
	eof      bool
	shutdown bool
	aborted  bool
}

func (s *fakeSocket) Write(b []byte) (int, error) {
	n := len(b)
	if s.room >= 0 {
		n = min(n, s.room)
		s.room -= n
	}
	s.written = append(s.written, b[:n]...)
	return n, nil
}

func (s *fakeSocket) Peek(b []byte) (int, error) {
	if s.peekOff >= len(s.queue) {
		if s.eof {
			return 0, nil
		}
		return 0, ErrSocketEmpty
	}
	n := copy(b, s.queue[s.peekOff:])
	s.peekOff += n
	return n, nil
}

func (s *fakeSocket) Discard(n int) error {
	s.queue = s.queue[n:]
	s.peekOff = max(0, s.peekOff-n)
	return nil
}

func (s *fakeSocket) SetPeekOffset(n int) error { s.peekOff = n; return nil }
func (s *fakeSocket) ShutdownWrite() error      { s.shutdown = true; return nil }
func (s *fakeSocket) Abort()                    { s.aborted = true }

// Space is room, or 1 MiB for a socket that takes everything.
func (s *fakeSocket) Space() (int, error) {
	if s.room < 0 {
		return 1 << 20, nil
	}
	return s.room, nil
}

func (s *fakeSocket) Writable() bool { return s.room != 0 }

// harness drives one flow as its client: it sends segments and reads
// what the flow emitted.
type harness struct {
	t    *testing.T
	cfg  Config
	sock *fakeSocket
	f    *Flow
	out  []Segment
	now  time.Time
	seq  uint32 // the client's next sequence number
}

const (
	testISS = 1000
	testIRS = 5000
)

func newHarness(t *testing.T, syn Segment) *harness {
	return newHarnessLink(t, syn, 65000, false)
}

// newHarnessLink is newHarness over a link of MSS linkMSS; with gso,
// the link offloads: data segments come out whole through emitPartial,
// which checks the MSS they are to be cut at and cuts them as the kernel
// would, so that the harness sees the segments the client would get.
func newHarnessLink(t *testing.T, syn Segment, linkMSS uint16, gso bool) *harness {
	h := &harness{t: t, sock: &fakeSocket{room: -1}, now: time.Unix(1000, 0), seq: testIRS + 1}
	syn.seq, syn.flags = testIRS, tcpSYN
	cfg := Config{
		Sock: h.sock, Writer: testWriter("10.96.0.10:80", "10.0.0.7:40000"), Emit: h.emit,
		Now: func() time.Time { return h.now }, ISS: testISS, TSBase: 7000, RcvWnd: 1 << 20, RcvShift: 7, LinkMSS: linkMSS,
	}
	if gso {
		cfg.EmitPartial = h.emitPartial
	}
	h.cfg = cfg
	h.f = New(cfg, syn)
	h.f.Start()
	return h
}

// emitPartial cuts a GSO segment p, whose headers are hdrLen bytes long,
// into segments of at most mss bytes of payload, as the kernel does.
func (h *harness) emitPartial(p []byte, hdrLen, mss int) {
	if mss <= 0 || len(p) <= hdrLen {
		h.t.Fatalf("a GSO segment of %d bytes, headers %d, to be cut at MSS %d", len(p), hdrLen, mss)
	}
	if segs := (len(p) - hdrLen + mss - 1) / mss; segs > 2048 {
		h.t.Fatalf("a GSO segment cut into %d segments of %d bytes", segs, mss)
	}
	s, ok := parseIP(p)
	if !ok {
		h.t.Fatalf("the flow emitted what is not a TCP segment: %x", p)
	}
	for off := 0; off < len(s.payload); off += mss {
		c := s
		c.seq += uint32(off)
		c.payload = append([]byte(nil), s.payload[off:min(off+mss, len(s.payload))]...)
		h.out = append(h.out, c)
	}
}

func (h *harness) emit(p []byte) {
	s, ok := parseIP(p)
	if !ok {
		h.t.Fatalf("the flow emitted what is not a TCP segment: %x", p)
	}
	s.payload = append([]byte(nil), s.payload...)
	h.out = append(h.out, s)
}

// take returns what the flow emitted since the last call.
func (h *harness) take() []Segment {
	out := h.out
	h.out = nil
	return out
}

// segment sends the client's segment with the ACK of ack and window wnd.
func (h *harness) segment(flags byte, ack uint32, wnd uint16, payload string) bool {
	s := Segment{seq: h.seq, ack: ack, flags: flags | tcpACK, wnd: wnd, payload: []byte(payload), ws: -1}
	h.seq += uint32(len(payload))
	if flags&tcpFIN != 0 {
		h.seq++
	}
	return h.f.Input(s)
}

func (h *harness) established(wnd uint16) {
	h.t.Helper()
	synAck := h.take()
	if len(synAck) != 1 || synAck[0].flags != tcpSYN|tcpACK || synAck[0].seq != testISS || synAck[0].ack != testIRS+1 {
		h.t.Fatalf("SYN-ACK: %+v", synAck)
	}
	h.segment(0, testISS+1, wnd, "")
	if out := h.take(); len(out) != 0 {
		h.t.Fatalf("the handshake's ACK drew %+v", out)
	}
	if h.f.state != stateEstablished {
		h.t.Fatalf("state %d after the handshake", h.f.state)
	}
}

// TestFlowExchange: the handshake's options, a request written to the
// socket with its ACK held, the answer carrying that ACK, the client's ACK
// discarding what it covers.
func TestFlowExchange(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, ts: true, tsVal: 42, wnd: 64240})
	synAck := h.out[0]
	// The SYN-ACK's MSS is what the link carries to us, whatever the
	// client's (RFC 9293 3.7.1: each side announces what it receives).
	if synAck.mss != 65000 || synAck.ws != 7 || !synAck.ts || synAck.tsEcr != 42 || synAck.tsVal != 7000 {
		t.Fatalf("SYN-ACK options: %+v", synAck)
	}
	h.established(502) // x 128

	h.segment(0x08, testISS+1, 502, "ping")
	if !bytes.Equal(h.sock.written, []byte("ping")) {
		t.Fatalf("socket got %q", h.sock.written)
	}
	if out := h.take(); len(out) != 0 || !h.f.ackHeld {
		t.Fatalf("request drew %+v, ack held %v", out, h.f.ackHeld)
	}

	h.sock.queue = []byte("pong")
	h.now = h.now.Add(5 * time.Millisecond)
	h.f.Readable()
	out := h.take()
	if len(out) != 1 || string(out[0].payload) != "pong" || out[0].seq != testISS+1 || out[0].ack != testIRS+1+4 {
		t.Fatalf("answer: %+v", out)
	}
	if !out[0].ts || out[0].tsVal != 7005 || out[0].wnd != (1<<20)>>7 {
		t.Errorf("answer's timestamps and window: %+v", out[0])
	}
	if h.f.ackHeld || !h.f.rtoArmed {
		t.Errorf("after the answer: ack held %v, RTO armed %v", h.f.ackHeld, h.f.rtoArmed)
	}

	h.segment(0, testISS+1+4, 502, "")
	if len(h.sock.queue) != 0 || h.f.rtoArmed || len(h.take()) != 0 {
		t.Errorf("after the client's ACK: queue %q, RTO armed %v", h.sock.queue, h.f.rtoArmed)
	}
}

// TestFlowFullSocket: a short write acknowledges what the socket took and
// closes the window; the socket draining opens it with three duplicate ACKs
// after the update, and the client's bytes sent again are taken.
func TestFlowFullSocket(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.sock.room = 3
	h.segment(0, testISS+1, 65535, "hello")
	out := h.take()
	if string(h.sock.written) != "hel" || len(out) != 1 || out[0].ack != testIRS+1+3 || out[0].wnd != 0 {
		t.Fatalf("short write: socket %q, sent %+v", h.sock.written, out)
	}
	h.seq = testIRS + 1 + 3 // the client goes back to what was not taken
	h.f.Writable()
	out = h.take()
	if len(out) != 1+dupAckThresh {
		t.Fatalf("writable sent %d segments, want %d", len(out), 1+dupAckThresh)
	}
	for _, s := range out {
		if s.ack != testIRS+1+3 || s.wnd == 0 || len(s.payload) != 0 {
			t.Errorf("window update %+v", s)
		}
	}
	h.sock.room = -1
	h.segment(0, testISS+1, 65535, "lo")
	if string(h.sock.written) != "hello" {
		t.Errorf("socket got %q", h.sock.written)
	}
}

// TestFlowOutOfOrder: a segment past a gap is kept, not written, and
// draws a duplicate ACK at once; the segment that fills the gap writes
// both in order and is acknowledged at once; a segment sent again in part
// writes only its new bytes.
func TestFlowOutOfOrder(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.seq += 5
	h.segment(0, testISS+1, 65535, "world")
	out := h.take()
	if len(h.sock.written) != 0 || len(out) != 1 || out[0].ack != testIRS+1 || h.f.kept.len() != 1 {
		t.Fatalf("past a gap: socket %q, sent %+v, kept %d", h.sock.written, out, h.f.kept.len())
	}
	h.seq = testIRS + 1
	h.segment(0, testISS+1, 65535, "hello")
	out = h.take()
	if string(h.sock.written) != "helloworld" || len(out) != 1 || out[0].ack != testIRS+1+10 || h.f.kept.len() != 0 {
		t.Fatalf("the gap filled: socket %q, sent %+v, kept %d", h.sock.written, out, h.f.kept.len())
	}
	h.seq = testIRS + 1 + 8
	h.segment(0, testISS+1, 65535, "ld!!")
	h.f.FlushAck()
	out = h.take()
	if string(h.sock.written) != "helloworld!!" || len(out) != 1 || out[0].ack != testIRS+1+12 {
		t.Fatalf("sent again in part: socket %q, sent %+v", h.sock.written, out)
	}
	h.seq = testIRS + 1
	h.segment(0, testISS+1, 65535, "hello")
	if out := h.take(); string(h.sock.written) != "helloworld!!" || len(out) != 1 || out[0].ack != testIRS+1+12 {
		t.Fatalf("sent again whole: socket %q, sent %+v", h.sock.written, out)
	}
}

// TestFlowKeptBounds: segments past a gap are kept up to keptSegs
// of them and keptBytes, within the stack's shared budget, none past the
// window offered; a full socket keeps them (the client was told of them)
// and writes them once it drains.
func TestFlowKeptBounds(t *testing.T) {
	h := newHarness(t, Segment{ws: 7, wnd: 65535})
	h.established(65535)
	for i := range keptSegs + 2 {
		h.seq = testIRS + 1 + uint32(10*(i+1))
		h.segment(0, testISS+1, 65535, "0123456789")
	}
	if h.f.kept.len() != keptSegs {
		t.Fatalf("kept %d segments, want %d", h.f.kept.len(), keptSegs)
	}
	for i, k := range h.f.kept.segs {
		if k.seq != testIRS+1+uint32(10*(i+1)) {
			t.Fatalf("kept out of order at %d: %d", i, k.seq)
		}
	}
	h.f.kept.drop()
	h.f.rcvAdv = h.f.rcvNxt + 8<<20 // as if an 8 MiB window had been offered
	big := string(make([]byte, 60000))
	for i := range keptBytes/60000 + 2 {
		h.seq = testIRS + 1 + 10 + uint32(60000*i)
		h.segment(0, testISS+1, 65535, big)
	}
	if h.f.kept.bytes > keptBytes || h.f.kept.bytes < keptBytes-60000 {
		t.Fatalf("kept %d bytes; want at most %d, and close", h.f.kept.bytes, keptBytes)
	}
	h.f.kept.drop()

	var budget atomic.Int64
	budget.Store(25)
	h.f.kept.budget = &budget
	for i := range 4 {
		h.seq = testIRS + 1 + uint32(10*(i+1))
		h.segment(0, testISS+1, 65535, "0123456789")
	}
	if h.f.kept.len() != 2 || budget.Load() != 5 {
		t.Fatalf("with a budget of 25 bytes: kept %d segments, %d bytes left", h.f.kept.len(), budget.Load())
	}
	h.f.kept.drop()
	if budget.Load() != 25 {
		t.Fatalf("the budget after a drop: %d", budget.Load())
	}
	h.f.kept.budget = nil

	h.seq = h.f.rcvAdv // past the window offered
	h.segment(0, testISS+1, 65535, "x")
	if h.f.kept.len() != 0 {
		t.Fatalf("kept a segment past the window")
	}
	h.seq = testIRS + 1 + 10
	h.segment(0, testISS+1, 65535, "0123456789")
	h.sock.room = 3
	h.seq = testIRS + 1
	h.segment(0, testISS+1, 65535, "0123456789")
	if string(h.sock.written) != "012" || h.f.kept.len() != 1 || !h.f.sockFull {
		t.Fatalf("a full socket: socket %q, kept %d", h.sock.written, h.f.kept.len())
	}
	h.sock.room = -1
	h.f.Writable()
	if string(h.sock.written) != "012" {
		t.Fatalf("the kept segment went in past the gap the short write left: %q", h.sock.written)
	}
	h.seq = testIRS + 1 + 3
	h.segment(0, testISS+1, 65535, "3456789")
	if want := "01234567890123456789"; string(h.sock.written) != want {
		t.Fatalf("after the resend: socket %q, want %q", h.sock.written, want)
	}
}

// TestFlowWindowAndRetransmission: sending stops at the client's window
// and goes on when it opens; a timeout sends again from the acknowledged
// point; three duplicate ACKs do too; the timeouts end in a reset.
func TestFlowWindowAndRetransmission(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(4)
	h.sock.queue = []byte("abcdefgh")
	h.f.Readable()
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "abcd" {
		t.Fatalf("in a window of 4: %+v", out)
	}
	h.segment(0, testISS+1+4, 4, "")
	out := h.take()
	if len(out) != 1 || string(out[0].payload) != "efgh" || out[0].seq != testISS+1+4 || string(h.sock.queue) != "efgh" {
		t.Fatalf("after the ACK: %+v, queue %q", out, h.sock.queue)
	}
	h.now = h.now.Add(rtoMin)
	if !h.f.OnRTO() {
		t.Fatal("the flow ended at the first timeout")
	}
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "efgh" || out[0].seq != testISS+1+4 {
		t.Fatalf("after a timeout: %+v", out)
	}
	if h.f.rtoDelay() != 2*rtoMin {
		t.Errorf("backed off to %v", h.f.rtoDelay())
	}

	h.segment(0, testISS+1+8, 2, "") // all acknowledged; the window shrinks to 2
	h.sock.queue = append(h.sock.queue, "ijkl"...)
	h.f.Readable()
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "ij" {
		t.Fatalf("in a window of 2: %+v", out)
	}
	// Duplicate ACKs at the timeout's recovery point (sndMax then) start
	// no recovery (RFC 6582 3.2): they may be the answers to what the
	// rewind sent twice.
	for range dupAckThresh {
		h.segment(0, testISS+1+8, 2, "")
	}
	if out := h.take(); len(out) != 0 {
		t.Fatalf("after %d duplicate ACKs at the recovery point: %+v", dupAckThresh, out)
	}
	h.segment(0, testISS+1+10, 2, "") // past it: "kl" goes
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "kl" {
		t.Fatalf("after the ACK of ij: %+v", out)
	}
	for range dupAckThresh {
		h.segment(0, testISS+1+10, 2, "")
	}
	if out := h.take(); len(out) != 1 || string(out[0].payload) != "kl" || out[0].seq != testISS+1+10 {
		t.Fatalf("after %d duplicate ACKs: %+v", dupAckThresh, out)
	}

	for i := 0; ; i++ {
		h.now = h.now.Add(h.f.rtoDelay())
		if !h.f.OnRTO() {
			break
		}
		if i > 100 {
			t.Fatal("the timeouts never end the flow")
		}
	}
	out = h.take()
	if last := out[len(out)-1]; last.flags&tcpRST == 0 || !h.sock.aborted {
		t.Errorf("given up: last segment %+v, socket aborted %v", last, h.sock.aborted)
	}
}

// TestFlowEnd: the client's FIN half-closes the socket; the socket's EOF
// becomes our FIN after the bytes before it; its ACK ends the flow.
func TestFlowEnd(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.segment(tcpFIN, testISS+1, 65535, "bye")
	out := h.take()
	if !h.sock.shutdown || string(h.sock.written) != "bye" || len(out) != 0 || !h.f.ackHeld {
		t.Fatalf("client's FIN: shutdown %v, socket %q, sent %+v, its ACK held %v", h.sock.shutdown, h.sock.written, out, h.f.ackHeld)
	}
	h.sock.queue, h.sock.eof = []byte("ok"), true
	h.f.Readable()
	out = h.take()
	if len(out) != 2 || string(out[0].payload) != "ok" || out[0].ack != testIRS+1+3+1 || out[1].flags&tcpFIN == 0 || out[1].seq != testISS+1+2 {
		t.Fatalf("EOF: %+v", out)
	}
	if h.segment(0, testISS+1+2+1, 65535, "") {
		t.Error("the flow goes on after both FINs were acknowledged")
	}
	if h.sock.aborted {
		t.Error("an orderly end aborted the socket")
	}

	// The endpoint ends first: the client's FIN after ours is
	// acknowledged at once, and ends the flow.
	h = newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.sock.eof = true
	h.f.Readable()
	if out := h.take(); len(out) != 1 || out[0].flags&tcpFIN == 0 {
		t.Fatalf("the endpoint's EOF: %+v", out)
	}
	if h.segment(tcpFIN, testISS+2, 65535, "") {
		t.Error("the flow goes on after both FINs were acknowledged")
	}
	if out := h.take(); len(out) != 1 || out[0].ack != testIRS+2 || out[0].flags&tcpFIN != 0 {
		t.Fatalf("the client's FIN after ours: %+v", out)
	}
}

// TestFlowReset: a RST at the next sequence number ends the flow; one
// elsewhere draws a challenge ACK (RFC 5961 3.2).
func TestFlowReset(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.seq += 100
	if !h.segment(tcpRST, 0, 0, "") {
		t.Fatal("an out-of-window RST ended the flow")
	}
	if out := h.take(); len(out) != 1 || out[0].flags&tcpRST != 0 || out[0].ack != testIRS+1 {
		t.Fatalf("challenge: %+v", out)
	}
	h.seq = testIRS + 1
	if h.segment(tcpRST, 0, 0, "") || !h.sock.aborted {
		t.Fatalf("an exact RST: socket aborted %v", h.sock.aborted)
	}
}

// TestFlowShortWindowUpdate: a window cut short by the socket's free
// space is offered again, larger, once the socket drains, without a
// segment of the client's to answer: the client may be waiting for it.
func TestFlowShortWindowUpdate(t *testing.T) {
	h := newHarness(t, Segment{ws: 7, wnd: 512})
	h.established(512)
	// A socket with 1500 bytes of room, as the SYN-ACK offered it: 500
	// left after the segment, less than the client sends into.
	h.sock.room, h.f.rcvAdv = 1500, h.f.rcvNxt+1500
	h.segment(0, testISS+1, 512, string(make([]byte, 1000)))
	h.f.FlushAck() // the held ACK
	out := h.take()
	if len(out) != 1 || int(out[0].wnd)<<7 > 1500 || !h.f.wndShort {
		t.Fatalf("ACK %+v, window short %v", out, h.f.wndShort)
	}
	h.f.FlushAck() // the socket has not drained
	if out := h.take(); len(out) != 0 {
		t.Fatalf("an update with nothing freed: %+v", out)
	}
	h.sock.room = -1 // drained
	h.f.FlushAck()
	out = h.take()
	if len(out) != 1 || int(out[0].wnd)<<7 != 1<<20 || h.f.wndShort {
		t.Fatalf("update %+v, window short %v", out, h.f.wndShort)
	}
}

// TestFlowPartialSegments: over a link that offloads, the endpoint's
// bytes go out in one segment past the MSS, cut at the MSS by the kernel,
// with the checksum left partial (the pseudo-header's sum); pure ACKs are
// finished.
func TestFlowPartialSegments(t *testing.T) {
	h := newHarness(t, Segment{mss: 1460, ws: 7, wnd: 512})
	type partial struct{ hdrLen, mss, size int }
	var got []partial
	h.f.gso = true
	h.f.emitPartial = func(p []byte, hdrLen, mss int) {
		got = append(got, partial{hdrLen, mss, len(p)})
		s, ok := parseIP(p)
		if !ok {
			t.Fatalf("not a segment: %x", p)
		}
		tcp := p[20:]
		pseudo := append([]byte{10, 96, 0, 10, 10, 0, 0, 7, 0, 6}, byte(len(tcp)>>8), byte(len(tcp)))
		if got, want := binary.BigEndian.Uint16(tcp[16:]), naiveChecksum(pseudo); got != want {
			t.Errorf("checksum %#x, want the pseudo-header's %#x", got, want)
		}
		s.payload = append([]byte(nil), s.payload...)
		h.out = append(h.out, s)
	}
	h.established(512)
	h.sock.queue = bytes.Repeat([]byte("x"), 5000)
	h.f.Readable()
	out := h.take()
	if len(out) != 1 || len(out[0].payload) != 5000 || len(got) != 1 || got[0] != (partial{40, 1460, 5040}) {
		t.Fatalf("sent %d segments (%+v), partial writes %+v", len(out), out, got)
	}
	h.segment(0, testISS+1+5000, 512, "")
	if len(h.sock.queue) != 0 || len(got) != 1 {
		t.Fatalf("after the ACK: queue %d, partial writes %+v", len(h.sock.queue), got)
	}
}

// TestFlowHandshakeDeadline: a client that does not complete its
// handshake is reset at its deadline, the SYN-ACK's timer cut to it.
func TestFlowHandshakeDeadline(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.f.hsDeadline = h.now.Add(300 * time.Millisecond)
	h.take()
	h.now = h.now.Add(rtoMin)
	if !h.f.OnRTO() || len(h.take()) != 1 {
		t.Fatalf("the SYN-ACK is not sent again")
	}
	if d := h.f.rtoDelay(); d != 100*time.Millisecond {
		t.Fatalf("the timer is armed for %v, want the 100ms left", d)
	}
	h.now = h.now.Add(100 * time.Millisecond)
	if h.f.OnRTO() {
		t.Fatalf("the flow lives on past its handshake's deadline")
	}
	if out := h.take(); len(out) != 1 || out[0].flags&tcpRST == 0 || !h.sock.aborted {
		t.Fatalf("at the deadline: sent %+v, socket aborted %v", out, h.sock.aborted)
	}
}

// TestFlowUnscaledWindow: a client that takes no window scale is offered
// 64 KiB at most, and that full offer is not "short": no timer polls the
// socket for a larger one it could not say.
func TestFlowUnscaledWindow(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 65535})
	h.established(65535)
	h.segment(0, testISS+1, 65535, "ping")
	h.f.FlushAck()
	out := h.take()
	if len(out) != 1 || out[0].wnd != 0xffff-4 || h.f.wndShort {
		t.Fatalf("ACK %+v, window short %v", out, h.f.wndShort)
	}
}

// TestFlowAckPastRewind: an acknowledgment of bytes sent before a rewind,
// past the rewind's sends, is taken (RFC 9293: up to the highest sent), and
// a client that answers every window probe is probed on, not reset.
func TestFlowAckPastRewind(t *testing.T) {
	h := newHarness(t, Segment{ws: -1, wnd: 10})
	h.established(10)
	h.sock.queue = []byte("0123456789abcdefghijklmnopqrst")
	h.f.Readable()
	h.segment(0, testISS+1+10, 20, "") // 10 taken, room for 20 more
	if h.f.sndNxt != testISS+1+30 {
		t.Fatalf("sent up to %d", h.f.sndNxt-testISS-1)
	}
	h.segment(0, testISS+1+10, 5, "") // the window shrinks
	h.now = h.now.Add(rtoMin)
	h.f.OnRTO() // rewinds, and sends again what 5 bytes of window take
	if h.f.sndNxt != testISS+1+15 || h.f.sndMax != testISS+1+30 {
		t.Fatalf("after the rewind: sndNxt %d, sndMax %d", h.f.sndNxt-testISS-1, h.f.sndMax-testISS-1)
	}
	h.take()
	h.segment(0, testISS+1+30, 0, "") // the client had it all
	if h.f.sndUna != testISS+1+30 || h.f.sndNxt != testISS+1+30 || len(h.sock.queue) != 0 {
		t.Fatalf("the ACK past the rewind: sndUna %d, sndNxt %d, queue %q", h.f.sndUna-testISS-1, h.f.sndNxt-testISS-1, h.sock.queue)
	}
	h.sock.queue = []byte("more")
	h.f.Readable() // the window is 0: a probe is due
	for range 3 * maxProbes {
		h.now = h.now.Add(h.f.rtoDelay())
		if !h.f.OnRTO() {
			t.Fatal("the flow was reset while the client answered its probes")
		}
		h.segment(0, testISS+1+30, 0, "") // the probe's answer: still 0
	}
}

// TestFlowTinyMSS: a SYN announcing a tiny MSS, or none, with and without
// timestamps, over a link with and without offloads, gets a working flow:
// the MSS is floored at Linux's tcp_min_snd_mss (48, CVE-2019-11479), an
// absent one is RFC 9293's 536, and every segment carries payload within
// it. MSS 12 with timestamps once divided by zero on the TUN's reader.
func TestFlowTinyMSS(t *testing.T) {
	const answer = 3000
	for _, mss := range []uint16{0, 1, 12, 40, 48, 88, 1460} {
		for _, ts := range []bool{false, true} {
			for _, gso := range []bool{false, true} {
				t.Run(fmt.Sprintf("mss %d ts %v gso %v", mss, ts, gso), func(t *testing.T) {
					h := newHarnessLink(t, Segment{mss: mss, ws: 7, ts: ts, tsVal: 42, wnd: 64240}, 1460, gso)
					if synAck := h.out[0]; synAck.mss != 1460 {
						t.Fatalf("SYN-ACK MSS %d; want the link's 1460", synAck.mss)
					}
					h.established(0xffff)
					want := max(int(mss), minMSS)
					if mss == 0 {
						want = defaultMSS4
					}
					if ts {
						want -= 12
					}
					h.sock.queue = bytes.Repeat([]byte("0123456789"), answer/10)
					h.sock.eof = true
					var got []byte
					fin := false
					for round := 0; round < 1000 && !fin; round++ {
						h.f.Readable()
						out := h.take()
						if len(out) == 0 {
							t.Fatalf("round %d: nothing sent; %d bytes received, FIN %v", round, len(got), fin)
						}
						for _, s := range out {
							if len(s.payload) > want || (len(s.payload) == 0 && s.flags&tcpFIN == 0) {
								t.Fatalf("a segment of %d bytes (flags %#x); want 1 to %d", len(s.payload), s.flags, want)
							}
							if int(s.seq-(testISS+1)) != len(got) {
								t.Fatalf("segment at %d after %d bytes", s.seq-(testISS+1), len(got))
							}
							got = append(got, s.payload...)
							fin = s.flags&tcpFIN != 0
						}
						ack := testISS + 1 + uint32(len(got))
						if fin {
							ack++
						}
						h.segment(0, ack, 0xffff, "")
					}
					if !fin || !bytes.Equal(got, bytes.Repeat([]byte("0123456789"), answer/10)) {
						t.Fatalf("got %d bytes, FIN %v; want the endpoint's %d and its FIN", len(got), fin, answer)
					}
				})
			}
		}
	}
}

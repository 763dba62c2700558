package netstack

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// ackRecorder is an ackHolder's link: it keeps the ACK numbers written.
type ackRecorder struct{ acks chan uint32 }

func (r *ackRecorder) write(pl stack.PacketBufferList) {
	for _, pkt := range pl.AsSlice() {
		r.acks <- header.TCP(pkt.TransportHeader().Slice()).AckNumber()
	}
}

func newTestAckHolder(limit time.Duration) (*ackHolder, *ackRecorder) {
	rec := &ackRecorder{acks: make(chan uint32, 16)}
	h := &ackHolder{}
	h.init(rec.write, limit, time.Now)
	return h, rec
}

var testFlow = conntrack.MakeTuple(conntrack.TCP, client, service)

// clientAt is the client at port, with its flow.
func clientAt(port uint16) (netip.AddrPort, conntrack.Tuple) {
	c := netip.AddrPortFrom(client.Addr(), port)
	return c, conntrack.MakeTuple(conntrack.TCP, c, service)
}

// fromClient is a data segment (or, with no payload, a RST) of the flow
// from the client, whole, as the gate's reader has it.
func fromClient(src netip.AddrPort, seq uint32, payload string) []byte {
	if payload == "" {
		return tcpPacket(src, service, header.TCPFlagRst, seq, 0)
	}
	return tcpData(src, service, seq, 1, []byte(payload))
}

// toClient is a segment gVisor writes to the client of flow t,
// acknowledging ack, with flags when payload is empty (else ACK|PSH). out is
// given it as the gate gives it.
func toClient(h *ackHolder, t conntrack.Tuple, ack uint32, flags header.TCPFlags, payload string, holdable bool) bool {
	pkt := gvisorSegment(service, t.Src(), 1, ack, nil, []byte(payload))
	defer pkt.DecRef()
	if payload == "" {
		header.TCP(pkt.TransportHeader().Slice()).SetFlags(uint8(flags))
	}
	return h.out(t, appendHead(nil, pkt), pkt, holdable)
}

// ackTo is toClient's pure ACK on testFlow.
func ackTo(h *ackHolder, ack uint32, holdable bool) bool {
	return toClient(h, testFlow, ack, header.TCPFlagAck, "", holdable)
}

// exchange is one request and its response in step on flow t of client c:
// the client's lone segment at seq, gVisor's pure ACK of it, then the
// response (which carries the same acknowledgment). It reports whether the
// pure ACK was held.
func exchange(h *ackHolder, c netip.AddrPort, t conntrack.Tuple, seq uint32, req string) bool {
	h.in(t, fromClient(c, seq, req), true)
	held := toClient(h, t, seq+uint32(len(req)), header.TCPFlagAck, "", true)
	toClient(h, t, seq+uint32(len(req)), 0, "answer", true)
	return held
}

// holdOne has the client send a lone 5-byte request at seq on testFlow and
// gVisor acknowledge it, and fails unless that ACK is held.
func holdOne(t *testing.T, h *ackHolder, seq uint32) {
	t.Helper()
	h.in(testFlow, fromClient(client, seq, "again"), true)
	if !ackTo(h, seq+5, true) {
		t.Fatalf("the ACK of %d was not held", seq+5)
	}
}

// written fails unless the holder wrote an ACK of want, what says why.
func written(t *testing.T, rec *ackRecorder, want uint32, what string) {
	t.Helper()
	select {
	case ack := <-rec.acks:
		if ack != want {
			t.Fatalf("%s: wrote an ACK of %d, want %d", what, ack, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the held ACK was not written", what)
	}
}

func noWrite(t *testing.T, rec *ackRecorder) {
	t.Helper()
	select {
	case ack := <-rec.acks:
		t.Fatalf("the ACK of %d was written", ack)
	default:
	}
}

// entries is how many flows the holder keeps state for.
func entries(h *ackHolder) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.flows)
}

// TestAckOfALoneSegmentIsSuperseded: the pure ACK of a lone segment (the
// first request included) is held, and the response, carrying the same
// acknowledgment, supersedes it: nothing is written but the response, and
// no state is left.
func TestAckOfALoneSegmentIsSuperseded(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	for i := range 4 {
		if !exchange(h, client, testFlow, 1000+uint32(5*i), "hello") {
			t.Fatalf("request %d: its ACK was not held", i+1)
		}
	}
	noWrite(t, rec)
	if n := h.superseded.Load(); n != 4 {
		t.Fatalf("%d ACKs superseded, want 4", n)
	}
	if n := entries(h); n != 0 {
		t.Fatalf("%d entries left after the exchanges, want 0", n)
	}
}

// TestAckOfTwoSegmentsIsNotHeld: a segment that is not lone ends the note,
// and the ACK of both goes out at once, as the kernel acknowledges every
// second segment; so does the ACK of a second segment that came while the
// first one's ACK was held (conntrack saw that ACK, so it calls the second
// lone).
func TestAckOfTwoSegmentsIsNotHeld(t *testing.T) {
	h, _ := newTestAckHolder(time.Minute)
	h.in(testFlow, fromClient(client, 1005, "one"), true)
	h.in(testFlow, fromClient(client, 1008, "two"), false)
	if ackTo(h, 1011, true) {
		t.Fatal("the ACK of two segments was held")
	}
	h.in(testFlow, fromClient(client, 1011, "one"), true)
	if !ackTo(h, 1014, true) {
		t.Fatal("the ACK of a lone segment was not held")
	}
	h.in(testFlow, fromClient(client, 1014, "two"), true)
	if ackTo(h, 1017, true) || h.superseded.Load() != 1 {
		t.Fatalf("the second segment's ACK: held, or %d superseded (want 1)", h.superseded.Load())
	}
}

// TestAckNotHeldUnlessLoneAloneAndEstablished: the ACK of a segment that
// is not lone is not held, nor one that shares its write with other
// packets or whose flow is not ESTABLISHED (holdable false), nor one that
// carries data or acknowledges anything but the noted segment.
func TestAckNotHeldUnlessLoneAloneAndEstablished(t *testing.T) {
	h, _ := newTestAckHolder(time.Minute)
	h.in(testFlow, fromClient(client, 1000, "hello"), false)
	if ackTo(h, 1005, true) {
		t.Fatal("held the ACK of a segment that is not lone")
	}
	h.in(testFlow, fromClient(client, 1005, "again"), true)
	if ackTo(h, 1010, false) {
		t.Fatal("held although not holdable")
	}
	h.in(testFlow, fromClient(client, 1010, "again"), true)
	if ackTo(h, 1012, true) {
		t.Fatal("held an ACK of part of the noted segment")
	}
	h.in(testFlow, fromClient(client, 1015, "again"), true)
	if toClient(h, testFlow, 1020, 0, "data", true) {
		t.Fatal("held a segment with data")
	}
	if n := entries(h); n != 0 {
		t.Fatalf("%d entries left, want 0", n)
	}
}

// TestAckOfAFINIsHeld: the client's FIN, all else acknowledged, is lone;
// its pure ACK is held, and gVisor's own FIN, acknowledging it, supersedes
// it, as the endpoint's kernel's FIN would carry its delayed ACK.
func TestAckOfAFINIsHeld(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	h.in(testFlow, tcpPacket(client, service, header.TCPFlagFin|header.TCPFlagAck, 1000, 1), true)
	if !ackTo(h, 1001, true) {
		t.Fatal("the FIN's ACK was not held")
	}
	if toClient(h, testFlow, 1001, header.TCPFlagFin|header.TCPFlagAck, "", true) {
		t.Fatal("held the FIN")
	}
	noWrite(t, rec)
	if n := h.superseded.Load(); n != 1 {
		t.Fatalf("%d superseded, want 1", n)
	}
}

// TestAcksHeldPerFlow: concurrent flows hold their ACKs each, another
// flow's data flushes nothing, and each response supersedes its own flow's
// ACK.
func TestAcksHeldPerFlow(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	var flows []conntrack.Tuple
	for i := range 3 {
		c, ft := clientAt(41000 + uint16(i))
		flows = append(flows, ft)
		h.in(ft, fromClient(c, 1000, "hello"), true)
		if !toClient(h, ft, 1005, header.TCPFlagAck, "", true) {
			t.Fatalf("flow %d: its ACK was not held", i)
		}
	}
	noWrite(t, rec)
	if n := entries(h); n != 3 {
		t.Fatalf("%d entries, want 3", n)
	}
	for _, ft := range flows {
		toClient(h, ft, 1005, 0, "answer", true)
	}
	if h.superseded.Load() != 3 || h.flushed.Load() != 0 {
		t.Fatalf("%d superseded, %d flushed; want 3 and 0", h.superseded.Load(), h.flushed.Load())
	}
	if n := entries(h); n != 0 {
		t.Fatalf("%d entries left, want 0", n)
	}
}

// TestHeldAckExpires: held ACKs that nothing supersedes are written after
// the limit, in order, and a note whose ACK never came is forgotten too; the
// client's next request is held again.
func TestHeldAckExpires(t *testing.T) {
	h, rec := newTestAckHolder(20 * time.Millisecond)
	holdOne(t, h, 1005)
	c, other := clientAt(41000)
	h.in(other, fromClient(c, 7000, "hello"), true)
	if !toClient(h, other, 7005, header.TCPFlagAck, "", true) {
		t.Fatal("the second flow's ACK was not held")
	}
	c2, noted := clientAt(41001)
	h.in(noted, fromClient(c2, 9000, "hello"), true) // never acknowledged
	written(t, rec, 1010, "at the limit")
	written(t, rec, 7005, "at the limit, the second flow")
	if n := h.expired.Load(); n != 2 {
		t.Fatalf("%d expired, want 2", n)
	}
	waitUntil(t, func() bool { return entries(h) == 0 })
	if !exchange(h, client, testFlow, 1010, "third") {
		t.Fatal("the request after an expired ACK was not held")
	}
}

// armedFor is whether the holder's timer is set, and how many expiry
// records it keeps.
func armedFor(h *ackHolder) (bool, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.armed, len(h.due) - h.head
}

// TestAckTimerIdleBetweenExchanges: once an exchange's response has
// superseded its held ACK and no flow has state, the timer is stopped and
// the queue empty: a request/response client never has it fire (it fired
// for every stale record before, about once per exchange; BENCHMARKS.md).
func TestAckTimerIdleBetweenExchanges(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	for i := range 3 {
		if !exchange(h, client, testFlow, 1000+uint32(5*i), "hello") {
			t.Fatalf("exchange %d: its ACK was not held", i)
		}
		if armed, queued := armedFor(h); armed || queued != 0 {
			t.Fatalf("after exchange %d: timer armed %v with %d records, want stopped and none", i, armed, queued)
		}
	}
	noWrite(t, rec)
}

// TestStaleRecordsDoNotSetTheTimer: the expiry walk passes over the
// records of entries that went (or were made again) without waiting for
// their time; the first live entry sets the next firing. The test drives
// the walk with its own clock; the limit is an hour, so that the real timer
// never fires while it runs.
func TestStaleRecordsDoNotSetTheTimer(t *testing.T) {
	rec := &ackRecorder{acks: make(chan uint32, 16)}
	base := time.Unix(1000, 0)
	now := base
	h := &ackHolder{}
	h.init(rec.write, time.Hour, func() time.Time { return now })
	defer h.close()
	c1, gone := clientAt(41000)
	c2, live := clientAt(41001)
	now = base.Add(30 * time.Minute)
	h.in(gone, fromClient(c1, 1000, "hello"), true) // noted, then acknowledged by the response
	now = base.Add(54 * time.Minute)
	h.in(live, fromClient(c2, 2000, "hello"), true) // noted, its ACK not yet written
	toClient(h, gone, 1005, 0, "answer", true)
	if armed, queued := armedFor(h); !armed || queued != 2 {
		t.Fatalf("timer armed %v with %d records, want armed with 2", armed, queued)
	}
	now = base.Add(time.Hour)
	h.expire()
	if armed, queued := armedFor(h); !armed || queued != 1 {
		t.Fatalf("after the walk: timer armed %v with %d records, want the live one's alone", armed, queued)
	}
	now = base.Add(114 * time.Minute)
	h.expire()
	if armed, queued := armedFor(h); armed || queued != 0 || entries(h) != 0 {
		t.Fatalf("after the live note's time: timer armed %v, %d records, %d entries; want none", armed, queued, entries(h))
	}
}

// TestAckNotesBounded: past maxAckFlows flows with a note, a lone segment
// is not noted and its ACK goes out.
func TestAckNotesBounded(t *testing.T) {
	h, _ := newTestAckHolder(time.Minute)
	for i := range maxAckFlows {
		c, ft := clientAt(1024 + uint16(i))
		h.in(ft, fromClient(c, 1000, "hello"), true)
	}
	if n := entries(h); n != maxAckFlows {
		t.Fatalf("%d entries, want %d", n, maxAckFlows)
	}
	h.in(testFlow, fromClient(client, 1000, "hello"), true)
	if ackTo(h, 1005, true) {
		t.Fatal("held an ACK past the bound")
	}
	h.close()
}

// TestHeldAckDroppedByRSTAndClose: the client's RST drops the held ACK
// (nothing is left to acknowledge), and so does the stack's close; after
// it nothing is held.
func TestHeldAckDroppedByRSTAndClose(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	holdOne(t, h, 1005)
	h.in(testFlow, fromClient(client, 1010, ""), false)
	if n := h.dropped.Load(); n != 1 {
		t.Fatalf("%d dropped after the client's RST, want 1", n)
	}
	holdOne(t, h, 2005)
	h.close()
	if n := h.dropped.Load(); n != 2 {
		t.Fatalf("%d dropped after close, want 2", n)
	}
	if exchange(h, client, testFlow, 2010, "again") {
		t.Fatal("held an ACK after close")
	}
	noWrite(t, rec)
}

// TestHeldAckLetOutByAnIgnoredRST: a RST from the client away from the
// sequence number gVisor expects is ignored by gVisor (RFC 5961, a
// challenge ACK at most), so the held ACK, which the client still needs,
// goes out; a RST that ends the flow after its entry went drops it.
func TestHeldAckLetOutByAnIgnoredRST(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	holdOne(t, h, 1005)
	h.in(testFlow, fromClient(client, 1012, ""), false)
	written(t, rec, 1010, "a RST gVisor ignores")
	if h.dropped.Load() != 0 || h.flushed.Load() != 1 {
		t.Fatalf("%d dropped, %d flushed; want 0 and 1", h.dropped.Load(), h.flushed.Load())
	}
	holdOne(t, h, 1015)
	h.resetOut(testFlow)
	if n := h.dropped.Load(); n != 1 {
		t.Fatalf("%d dropped after the flow's RST went out, want 1", n)
	}
	noWrite(t, rec)
}

// TestEchoCarriesTheHeldACK, through the stack: after a first exchange, the
// pure ACK of the client's next request is held until the handler answers,
// and the answer carries the acknowledgment (no pure ACK reaches the link);
// an answer that does not come lets the ACK out at the limit.
func TestEchoCarriesTheHeldACK(t *testing.T) {
	st, link, _ := newTestStack(t, accept)
	st.acks.mu.Lock()
	st.acks.limit = 500 * time.Millisecond // past the 50 ms the test watches the link for
	st.acks.mu.Unlock()
	release := make(chan struct{}, 4)
	st.SetFlowHandler(handlerFunc(func(r *TCPRequest) {
		c, err := r.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			select {
			case <-release:
			case <-r.Context().Done(): // the stack is closing
				return
			}
			if _, err := c.Write(buf[:n]); err != nil {
				return
			}
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := func() header.TCP {
		t.Helper()
		p := link.Read(ctx)
		if p == nil {
			t.Fatal("nothing written to the link")
		}
		return header.TCP(header.IPv4(p).Payload())
	}
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	iss := read().SequenceNumber()
	link.Inject(tcpPacket(client, service, header.TCPFlagAck, 1001, iss+1))
	held := func() bool {
		st.acks.mu.Lock()
		defer st.acks.mu.Unlock()
		return st.acks.flows[testFlow].held != nil
	}
	// The first request: conntrack calls it lone, the handshake's ACKs
	// having acknowledged all before it.
	link.Inject(tcpData(client, service, 1001, iss+1, []byte("hello")))
	waitUntil(t, held)
	quiet, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	p := link.Read(quiet)
	stop()
	if p != nil {
		t.Fatalf("wrote %v while the first request's ACK was held", header.TCP(header.IPv4(p).Payload()).Flags())
	}
	release <- struct{}{}
	if seg := read(); string(seg.Payload()) != "hello" || seg.AckNumber() != 1006 {
		t.Fatalf("after the first answer: %q acknowledging %d, want hello acknowledging 1006", seg.Payload(), seg.AckNumber())
	}
	link.Inject(tcpData(client, service, 1006, iss+6, []byte("world")))
	waitUntil(t, held)
	quiet, stop = context.WithTimeout(ctx, 50*time.Millisecond)
	p = link.Read(quiet)
	stop()
	if p != nil {
		t.Fatalf("wrote %v while the ACK was held", header.TCP(header.IPv4(p).Payload()).Flags())
	}
	release <- struct{}{}
	if seg := read(); string(seg.Payload()) != "world" || seg.AckNumber() != 1011 {
		t.Fatalf("after the answer: %q acknowledging %d, want the answer acknowledging 1011", seg.Payload(), seg.AckNumber())
	}
	if s := st.Stats(); s.AcksSuperseded != 2 {
		t.Fatalf("%d ACKs superseded, want 2", s.AcksSuperseded)
	}

	// No answer: the ACK goes out at the limit.
	link.Inject(tcpData(client, service, 1011, iss+11, []byte("again")))
	if seg := read(); seg.Flags() != header.TCPFlagAck || len(seg.Payload()) != 0 || seg.AckNumber() != 1016 {
		t.Fatalf("got %v with %d bytes acknowledging %d, want the pure ACK of 1016", seg.Flags(), len(seg.Payload()), seg.AckNumber())
	}
	if s := st.Stats(); s.AcksExpired != 1 {
		t.Fatalf("%d ACKs expired, want 1", s.AcksExpired)
	}
	release <- struct{}{}
	if seg := read(); string(seg.Payload()) != "again" {
		t.Fatalf("the answer was %q, want again", seg.Payload())
	}
}

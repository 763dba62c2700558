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

var ackFlow = conntrack.MakeTuple(conntrack.TCP, client, service)

// fromClient is a data segment (or, with no payload, a RST) of the flow
// from the client, whole, as the gate's reader has it.
func fromClient(src netip.AddrPort, seq uint32, payload string) []byte {
	if payload == "" {
		return tcpPacket(src, service, header.TCPFlagRst, seq, 0)
	}
	return tcpData(src, service, seq, 1, []byte(payload))
}

// toClient is a segment gVisor writes to the client, acknowledging ack: a
// pure ACK when payload is empty. out is given it as the gate gives it.
func toClient(h *ackHolder, ack uint32, payload string, holdable bool) bool {
	pkt := gvisorSegment(service, client, 1, ack, nil, []byte(payload))
	defer pkt.DecRef()
	if payload == "" {
		header.TCP(pkt.TransportHeader().Slice()).SetFlags(uint8(header.TCPFlagAck))
	}
	return h.out(ackFlow, appendHead(nil, pkt), pkt, holdable)
}

// exchange is one request and its response in step: the client's data at
// seq, gVisor's pure ACK of it, then the response (which carries the same
// acknowledgment). It reports whether the pure ACK was held.
func exchange(h *ackHolder, seq uint32, req string) bool {
	h.in(ackFlow, fromClient(client, seq, req))
	held := toClient(h, seq+uint32(len(req)), "", true)
	toClient(h, seq+uint32(len(req)), "answer", true)
	return held
}

// holdOne has the client send a 5-byte request at seq and gVisor
// acknowledge it, and fails unless that ACK is held.
func holdOne(t *testing.T, h *ackHolder, seq uint32) {
	t.Helper()
	h.in(ackFlow, fromClient(client, seq, "again"))
	if !toClient(h, seq+5, "", true) {
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

// TestAckOfALoneSegmentIsSuperseded: once the holder knows the last ACK the
// client has, the pure ACK of a request (one segment starting there) is
// held, and the response, carrying the same acknowledgment, supersedes it:
// nothing is written but the response.
func TestAckOfALoneSegmentIsSuperseded(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	if exchange(h, 1000, "hello") {
		t.Fatal("the first request's ACK was held before the holder knew the client's last ACK")
	}
	for i := range 3 {
		if !exchange(h, 1005+uint32(5*i), "again") {
			t.Fatalf("request %d: its ACK was not held", i+2)
		}
	}
	noWrite(t, rec)
	if n := h.superseded.Load(); n != 3 {
		t.Fatalf("%d ACKs superseded, want 3", n)
	}
}

// TestAckOfTwoSegmentsIsNotHeld: a second segment before the first one's
// ACK went out is not noted, and the ACK of both goes out at once, as the
// kernel acknowledges every second segment.
func TestAckOfTwoSegmentsIsNotHeld(t *testing.T) {
	h, _ := newTestAckHolder(time.Minute)
	exchange(h, 1000, "hello")
	h.in(ackFlow, fromClient(client, 1005, "one"))
	h.in(ackFlow, fromClient(client, 1008, "two"))
	if toClient(h, 1011, "", true) {
		t.Fatal("the ACK of two segments was held")
	}
	// Held once, for the first: the second's ACK supersedes it and is not
	// held.
	h.in(ackFlow, fromClient(client, 1011, "one"))
	if !toClient(h, 1014, "", true) {
		t.Fatal("the ACK of a lone segment was not held")
	}
	h.in(ackFlow, fromClient(client, 1014, "two"))
	if toClient(h, 1017, "", true) || h.superseded.Load() != 1 {
		t.Fatalf("the second segment's ACK: held, or %d superseded (want 1)", h.superseded.Load())
	}
}

// TestAckNotHeldUnlessAloneAndEstablished: an ACK that shares its write
// with other packets, or whose flow is not ESTABLISHED (holdable false), is
// not held, nor is an ACK that carries data or acknowledges anything but
// the noted segment.
func TestAckNotHeldUnlessAloneAndEstablished(t *testing.T) {
	h, _ := newTestAckHolder(time.Minute)
	exchange(h, 1000, "hello")
	h.in(ackFlow, fromClient(client, 1005, "again"))
	if toClient(h, 1010, "", false) {
		t.Fatal("held although not holdable")
	}
	h.in(ackFlow, fromClient(client, 1010, "again"))
	if toClient(h, 1012, "", true) {
		t.Fatal("held an ACK of part of the noted segment")
	}
	if toClient(h, 1015, "data", true) {
		t.Fatal("held a segment with data")
	}
}

// TestHeldAckExpires: a held ACK that nothing supersedes is written after
// the limit, and the client's next request is held again.
func TestHeldAckExpires(t *testing.T) {
	h, rec := newTestAckHolder(20 * time.Millisecond)
	exchange(h, 1000, "hello")
	holdOne(t, h, 1005)
	written(t, rec, 1010, "at the limit")
	if n := h.expired.Load(); n != 1 {
		t.Fatalf("%d expired, want 1", n)
	}
	if !exchange(h, 1010, "third") {
		t.Fatal("the request after an expired ACK was not held: the written ACK was not learnt")
	}
}

// TestHeldAckFlushedForAnotherFlow: data from another flow's client moves
// the holder to that flow; the held ACK is written first.
func TestHeldAckFlushedForAnotherFlow(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	exchange(h, 1000, "hello")
	holdOne(t, h, 1005)
	other := netip.AddrPortFrom(client.Addr(), client.Port()+1)
	h.in(conntrack.MakeTuple(conntrack.TCP, other, service), fromClient(other, 1, "hi"))
	written(t, rec, 1010, "another flow's data")
	if n := h.flushed.Load(); n != 1 {
		t.Fatalf("%d flushed, want 1", n)
	}
	if toClient(h, 1015, "", true) {
		t.Fatal("an ACK of a flow no longer followed was held")
	}
}

// TestHeldAckDroppedByRSTAndClose: the client's RST drops the held ACK
// (nothing is left to acknowledge), and so does the stack's close; after
// it nothing is held.
func TestHeldAckDroppedByRSTAndClose(t *testing.T) {
	h, rec := newTestAckHolder(time.Minute)
	exchange(h, 1000, "hello")
	holdOne(t, h, 1005)
	h.in(ackFlow, fromClient(client, 1010, ""))
	if n := h.dropped.Load(); n != 1 {
		t.Fatalf("%d dropped after the client's RST, want 1", n)
	}
	exchange(h, 2000, "hello")
	holdOne(t, h, 2005)
	h.close()
	if n := h.dropped.Load(); n != 2 {
		t.Fatalf("%d dropped after close, want 2", n)
	}
	if exchange(h, 2010, "again") {
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
	exchange(h, 1000, "hello")
	holdOne(t, h, 1005)
	h.in(ackFlow, fromClient(client, 1012, ""))
	written(t, rec, 1010, "a RST gVisor ignores")
	if h.dropped.Load() != 0 || h.flushed.Load() != 1 {
		t.Fatalf("%d dropped, %d flushed; want 0 and 1", h.dropped.Load(), h.flushed.Load())
	}
	if !exchange(h, 1010, "third") {
		t.Fatal("the flow was forgotten after a RST gVisor ignores")
	}
	holdOne(t, h, 1015)
	h.resetOut(ackFlow)
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
	st.acks.limit = time.Minute
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
	// The first exchange teaches the holder the client's last ACK.
	release <- struct{}{}
	link.Inject(tcpData(client, service, 1001, iss+1, []byte("hello")))
	for string(read().Payload()) != "hello" {
	}
	held := func() bool {
		st.acks.mu.Lock()
		defer st.acks.mu.Unlock()
		return st.acks.held != nil
	}
	link.Inject(tcpData(client, service, 1006, iss+6, []byte("world")))
	waitUntil(t, held)
	quiet, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	p := link.Read(quiet)
	stop()
	if p != nil {
		t.Fatalf("wrote %v while the ACK was held", header.TCP(header.IPv4(p).Payload()).Flags())
	}
	release <- struct{}{}
	if seg := read(); string(seg.Payload()) != "world" || seg.AckNumber() != 1011 {
		t.Fatalf("after the answer: %q acknowledging %d, want the answer acknowledging 1011", seg.Payload(), seg.AckNumber())
	}
	if s := st.Stats(); s.AcksSuperseded != 1 {
		t.Fatalf("%d ACKs superseded, want 1", s.AcksSuperseded)
	}

	// No answer: the ACK goes out at the limit.
	st.acks.mu.Lock()
	st.acks.limit = 20 * time.Millisecond
	st.acks.mu.Unlock()
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

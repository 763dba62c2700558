package netstack

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// holdingLink is a memory link whose SYN-ACK writes wait until release is
// closed, as a TUN write waits while the kernel runs the client's side of
// the handshake; each SYN-ACK is sent on synAcks first.
type holdingLink struct {
	*channel.Endpoint
	synAcks chan []byte
	release chan struct{}
}

func (l *holdingLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	for _, p := range pkts.AsSlice() {
		if b := p.ToView().AsSlice(); isSynAck(b) {
			l.synAcks <- b
			<-l.release
		}
	}
	return l.Endpoint.WritePackets(pkts)
}

// newHoldingStack is newTestStack over a holdingLink, with the reader's
// wait bounded by limit.
func newHoldingStack(t *testing.T, limit time.Duration) (*Stack, *holdingLink) {
	t.Helper()
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hl := &holdingLink{Endpoint: channel.New(64, DefaultMTU, ""), synAcks: make(chan []byte, 1), release: make(chan struct{})}
	st, err := New(Options{Link: &Link{ep: hl, name: "holding", close: func() error { hl.Close(); return nil }}, Conntrack: ct, Admit: accept})
	if err != nil {
		t.Fatal(err)
	}
	st.synAcks.limit = limit
	t.Cleanup(st.Close)
	t.Cleanup(func() {
		select {
		case <-hl.release:
		default:
			close(hl.release)
		}
	})
	st.SetFlowHandler(echoHandler{})
	return st, hl
}

func (l *holdingLink) inject(b []byte) {
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
	l.InjectInbound(header.IPv4ProtocolNumber, pb)
	pb.DecRef()
}

// tcpData is tcpPacket with a payload (flags PSH|ACK).
func tcpData(src, dst netip.AddrPort, seq, ack uint32, payload []byte) []byte {
	b := append(tcpPacket(src, dst, header.TCPFlagPsh|header.TCPFlagAck, seq, ack), payload...)
	ip := header.IPv4(b)
	ip.SetTotalLength(uint16(len(b)))
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(b[header.IPv4MinimumSize:])
	tcp.SetChecksum(0)
	s, d := tcpip.AddrFrom4(src.Addr().As4()), tcpip.AddrFrom4(dst.Addr().As4())
	tcp.SetChecksum(^checksum.Checksum(tcp, header.PseudoHeaderChecksum(header.TCPProtocolNumber, s, d, uint16(len(tcp)))))
	return b
}

// handshakeDuringSYNACK sends the client's SYN, and once the stack is
// writing the SYN-ACK, the client's first segment ("hi") on a goroutine of
// its own, as the TUN reader would; delivered is closed when the gate
// handed that segment on.
func (l *holdingLink) handshakeDuringSYNACK(t *testing.T) (delivered chan struct{}) {
	t.Helper()
	l.inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	var synAck []byte
	select {
	case synAck = <-l.synAcks:
	case <-time.After(10 * time.Second):
		t.Fatal("no SYN-ACK")
	}
	iss := header.TCP(header.IPv4(synAck).Payload()).SequenceNumber()
	delivered = make(chan struct{})
	go func() { // the TUN reader
		l.inject(tcpData(client, service, 1001, iss+1, []byte("hi")))
		close(delivered)
	}()
	return delivered
}

// TestClientSegmentWaitsForTheSYNACKWrite: the client's first segment,
// read while its SYN-ACK is still being written, reaches gVisor only once
// that write returned (synack.go), and is then served (echoed).
func TestClientSegmentWaitsForTheSYNACKWrite(t *testing.T) {
	st, hl := newHoldingStack(t, time.Minute)
	delivered := hl.handshakeDuringSYNACK(t)
	select {
	case <-delivered:
		t.Fatal("the client's segment was delivered while its SYN-ACK was being written")
	case <-time.After(100 * time.Millisecond):
	}
	close(hl.release)
	select {
	case <-delivered:
	case <-time.After(10 * time.Second):
		t.Fatal("the client's segment was not delivered after the SYN-ACK write returned")
	}
	if s := st.Stats(); s.SYNACKWaitsWritten != 1 || s.SYNACKWaitsTimedOut != 0 {
		t.Fatalf("%d waits ended by the write, %d timed out; want 1 and 0", s.SYNACKWaitsWritten, s.SYNACKWaitsTimedOut)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		pb := hl.ReadContext(ctx)
		if pb == nil {
			t.Fatal("no echo of the client's first segment")
		}
		p := pb.ToView().AsSlice()
		pb.DecRef()
		if string(header.TCP(header.IPv4(p).Payload()).Payload()) == "hi" {
			return
		}
	}
}

// TestSYNACKWaitIsBounded: a SYN-ACK write that does not return holds the
// reader for the limit only.
func TestSYNACKWaitIsBounded(t *testing.T) {
	st, hl := newHoldingStack(t, 20*time.Millisecond)
	delivered := hl.handshakeDuringSYNACK(t)
	select {
	case <-delivered:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader waited past its limit for a SYN-ACK write that did not return")
	}
	if n := st.synAcks.n.Load(); n != 1 {
		t.Fatalf("%d SYN-ACK writes registered while one is held, want 1", n)
	}
	if s := st.Stats(); s.SYNACKWaitsWritten != 0 || s.SYNACKWaitsTimedOut != 1 {
		t.Fatalf("%d waits ended by the write, %d timed out; want 0 and 1", s.SYNACKWaitsWritten, s.SYNACKWaitsTimedOut)
	}
	close(hl.release)
	waitUntil(t, func() bool { return st.synAcks.n.Load() == 0 })
}

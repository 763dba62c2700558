package netstack

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/userproxy/userproxy/conntrack"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type echoHandler struct{}

func (echoHandler) HandleTCP(r *TCPRequest) {
	c, err := r.Accept()
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = io.Copy(c, c)
}

func (echoHandler) HandleUDP(r *UDPRequest) { r.Conn.Close() }

func newTestStack(t testing.TB, admit AdmitFunc) (*Stack, *MemoryLink, *conntrack.Table) {
	t.Helper()
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: admit})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.SetFlowHandler(echoHandler{})
	return st, link, ct
}

func accept(conntrack.Tuple) Decision { return Accept }

// tcpPacket builds an IPv4 TCP segment with correct checksums.
func tcpPacket(src, dst netip.AddrPort, flags header.TCPFlags, seq, ack uint32) []byte {
	b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
	ip := header.IPv4(b)
	s, d := tcpip.AddrFrom4(src.Addr().As4()), tcpip.AddrFrom4(dst.Addr().As4())
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: s, DstAddr: d})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcp := header.TCP(b[header.IPv4MinimumSize:])
	tcp.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: ack, DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 65535})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, s, d, uint16(len(tcp)))
	tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	return b
}

// gvisorSegment builds a TCP segment the way gVisor's TCP endpoint hands
// one to its link: the TCP header (with opts) and then the IPv4 or IPv6
// header pushed in front of the payload, the protocols set. Checksums are
// left zero (outbound ones are not verified).
func gvisorSegment(src, dst netip.AddrPort, seq, ack uint32, opts, payload []byte) *stack.PacketBuffer {
	thLen := header.TCPMinimumSize + len(opts)
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{
		ReserveHeaderBytes: header.IPv6MinimumSize + thLen,
		Payload:            buffer.MakeWithData(payload),
	})
	tcp := header.TCP(pkt.TransportHeader().Push(thLen))
	tcp.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: ack,
		DataOffset: uint8(thLen), Flags: header.TCPFlagAck | header.TCPFlagPsh, WindowSize: 65535})
	copy(tcp[header.TCPMinimumSize:], opts)
	pkt.TransportProtocolNumber = header.TCPProtocolNumber
	s, d := tcpip.AddrFromSlice(src.Addr().AsSlice()), tcpip.AddrFromSlice(dst.Addr().AsSlice())
	if src.Addr().Is4() {
		ip := header.IPv4(pkt.NetworkHeader().Push(header.IPv4MinimumSize))
		ip.Encode(&header.IPv4Fields{TotalLength: uint16(pkt.Size()), TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: s, DstAddr: d})
		pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
	} else {
		ip := header.IPv6(pkt.NetworkHeader().Push(header.IPv6MinimumSize))
		ip.Encode(&header.IPv6Fields{PayloadLength: uint16(pkt.Size() - header.IPv6MinimumSize), TransportProtocol: header.TCPProtocolNumber, HopLimit: 64, SrcAddr: s, DstAddr: d})
		pkt.NetworkProtocolNumber = header.IPv6ProtocolNumber
	}
	return pkt
}

var (
	client  = netip.MustParseAddrPort("192.0.2.7:40000")
	service = netip.MustParseAddrPort("10.96.0.10:80")
)

// A stray ACK (no connection) is INVALID: dropped and counted, and gVisor
// never answers it with a RST.
func TestStrayACKIsDroppedWithoutRST(t *testing.T) {
	st, link, ct := newTestStack(t, accept)
	link.Inject(tcpPacket(client, service, header.TCPFlagAck, 1000, 2000))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if pkt := link.Read(ctx); pkt != nil {
		t.Fatalf("the stack answered a stray ACK with %d bytes (flags %v)", len(pkt), header.TCP(pkt[20:]).Flags())
	}
	if got := st.Stats().InvalidIn; got != 1 {
		t.Errorf("InvalidIn = %d, want 1", got)
	}
	if got := ct.Stats().Invalid[conntrack.ReasonNoEntryNotSYN]; got != 1 {
		t.Errorf("conntrack no_entry_not_syn = %d, want 1", got)
	}
}

// TestStrayResets: within Options.StrayResets of the start, a client's
// segment of no flow is answered as RFC 9293 3.10.7.1 answers a segment
// for a connection that does not exist (an ACK: a RST at its
// acknowledgment number; no ACK: a RST+ACK of the segment), a RST is not
// answered, and the segment still counts as INVALID; after the window,
// nothing is answered.
func TestStrayResets(t *testing.T) {
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	link := NewMemoryLink(0, 64)
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept, StrayResets: time.Minute, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.SetFlowHandler(echoHandler{})
	read := func() header.TCP {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pkt := link.Read(ctx)
		if pkt == nil {
			t.Fatal("no answer")
		}
		ip := header.IPv4(pkt)
		if !ip.IsChecksumValid() || ip.SourceAddress() != tcpip.AddrFrom4(service.Addr().As4()) || ip.DestinationAddress() != tcpip.AddrFrom4(client.Addr().As4()) {
			t.Fatalf("not a packet from the service to the client: %x", pkt)
		}
		tcp := header.TCP(ip.Payload())
		xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(tcp)))
		if checksum.Checksum(tcp, xsum) != 0xffff || tcp.SourcePort() != service.Port() || tcp.DestinationPort() != client.Port() {
			t.Fatalf("a bad TCP header: %x", tcp)
		}
		return tcp
	}
	quiet := func(what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if pkt := link.Read(ctx); pkt != nil {
			t.Fatalf("%s was answered: %x", what, pkt)
		}
	}

	link.Inject(tcpPacket(client, service, header.TCPFlagAck|header.TCPFlagPsh, 1000, 2000))
	if tcp := read(); tcp.Flags() != header.TCPFlagRst || tcp.SequenceNumber() != 2000 {
		t.Errorf("the answer to an ACK: flags %v seq %d, want RST at 2000", tcp.Flags(), tcp.SequenceNumber())
	}
	link.Inject(tcpPacket(client, service, header.TCPFlagFin, 1000, 0)) // bad flags: INVALID for another reason
	quiet("a FIN without ACK")
	link.Inject(tcpPacket(client, service, header.TCPFlagRst|header.TCPFlagAck, 1000, 2000))
	quiet("a RST")
	mu.Lock()
	now = now.Add(time.Minute + time.Second)
	mu.Unlock()
	link.Inject(tcpPacket(client, service, header.TCPFlagAck, 1000, 2000))
	quiet("an ACK after the window")
	if s := st.Stats(); s.StrayResets != 1 || s.InvalidIn != 4 {
		t.Errorf("StrayResets %d, InvalidIn %d; want 1 and 4", s.StrayResets, s.InvalidIn)
	}
}

// TestBuildStrayRST: RFC 9293 3.10.7.1's answers, IPv6 too: without an
// ACK, sequence number 0 and an ACK of the segment's sequence number plus
// its length (data, SYN and FIN counted).
func TestBuildStrayRST(t *testing.T) {
	b := tcpPacket(client, service, header.TCPFlagFin|header.TCPFlagPsh, 1000, 0)
	b = append(b, "hello"...)
	ip := header.IPv4(b)
	ip.SetTotalLength(uint16(len(b)))
	rst := header.IPv4(buildStrayRST(b))
	tcp := header.TCP(rst.Payload())
	if tcp.Flags() != header.TCPFlagRst|header.TCPFlagAck || tcp.SequenceNumber() != 0 || tcp.AckNumber() != 1000+5+1 {
		t.Errorf("for 5 bytes and a FIN at 1000: flags %v seq %d ack %d, want RST+ACK 0/1006", tcp.Flags(), tcp.SequenceNumber(), tcp.AckNumber())
	}
	src, dst := tcpip.AddrFrom16(netip.MustParseAddr("fd00::7").As16()), tcpip.AddrFrom16(netip.MustParseAddr("fd00:96::10").As16())
	b6 := make([]byte, header.IPv6MinimumSize+header.TCPMinimumSize)
	header.IPv6(b6).Encode(&header.IPv6Fields{PayloadLength: header.TCPMinimumSize, TransportProtocol: header.TCPProtocolNumber, HopLimit: 64, SrcAddr: src, DstAddr: dst})
	header.TCP(b6[header.IPv6MinimumSize:]).Encode(&header.TCPFields{SrcPort: 40000, DstPort: 80, SeqNum: 7, AckNum: 99, DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck})
	out := header.IPv6(buildStrayRST(b6))
	tcp6 := header.TCP(out.Payload())
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, out.SourceAddress(), out.DestinationAddress(), uint16(len(tcp6)))
	if out.SourceAddress() != dst || out.DestinationAddress() != src || tcp6.Flags() != header.TCPFlagRst || tcp6.SequenceNumber() != 99 ||
		tcp6.SourcePort() != 80 || tcp6.DestinationPort() != 40000 || checksum.Checksum(tcp6, xsum) != 0xffff {
		t.Errorf("IPv6: %x", []byte(out))
	}
	if buildStrayRST(tcpPacket(client, service, header.TCPFlagRst, 1, 0)) != nil {
		t.Error("a RST was answered")
	}
}

// A SYN the admission function rejects gets an ICMP port unreachable from
// the service address, quoting the SYN.
func TestRejectSendsPortUnreachable(t *testing.T) {
	st, link, _ := newTestStack(t, func(conntrack.Tuple) Decision { return Reject })
	syn := tcpPacket(client, service, header.TCPFlagSyn, 1000, 0)
	link.Inject(syn)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pkt := link.Read(ctx)
	if pkt == nil {
		t.Fatal("no ICMP error")
	}
	ip := header.IPv4(pkt)
	if !ip.IsChecksumValid() || ip.Protocol() != uint8(header.ICMPv4ProtocolNumber) {
		t.Fatalf("not a valid ICMP packet: %x", pkt)
	}
	if ip.SourceAddress() != tcpip.AddrFrom4(service.Addr().As4()) || ip.DestinationAddress() != tcpip.AddrFrom4(client.Addr().As4()) {
		t.Errorf("ICMP from %s to %s, want from the service to the client", ip.SourceAddress(), ip.DestinationAddress())
	}
	icmp := header.ICMPv4(ip.Payload())
	if icmp.Type() != header.ICMPv4DstUnreachable || icmp.Code() != header.ICMPv4PortUnreachable {
		t.Errorf("ICMP type %d code %d, want 3/3", icmp.Type(), icmp.Code())
	}
	if checksum.Checksum(icmp, 0) != 0xffff {
		t.Error("bad ICMP checksum")
	}
	if quoted := icmp[header.ICMPv4MinimumSize:]; string(quoted) != string(syn) {
		t.Errorf("quoted %x, want the SYN %x", quoted, syn)
	}
	if s := st.Stats(); s.Rejected != 1 {
		t.Errorf("Rejected = %d", s.Rejected)
	}
}

// Drop: no answer at all.
func TestDropIsSilent(t *testing.T) {
	st, link, _ := newTestStack(t, func(conntrack.Tuple) Decision { return Drop })
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if pkt := link.Read(ctx); pkt != nil {
		t.Fatalf("a dropped flow was answered: %x", pkt)
	}
	if s := st.Stats(); s.Dropped != 1 {
		t.Errorf("Dropped = %d", s.Dropped)
	}
}

// An accepted SYN from the link is answered with a SYN-ACK (the handler
// accepts), and its conntrack entry exists.
func TestAcceptedSYNGetsSYNACK(t *testing.T) {
	_, link, ct := newTestStack(t, accept)
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pkt := link.Read(ctx)
	if pkt == nil {
		t.Fatal("no answer to the SYN")
	}
	tcp := header.TCP(header.IPv4(pkt).Payload())
	if tcp.Flags() != header.TCPFlagSyn|header.TCPFlagAck || tcp.AckNumber() != 1001 {
		t.Fatalf("answer flags %v ack %d, want SYN-ACK 1001", tcp.Flags(), tcp.AckNumber())
	}
	if _, ok := ct.Get(conntrack.MakeTuple(conntrack.TCP, client, service)); !ok {
		t.Fatal("no conntrack entry for the accepted flow")
	}
}

// In-process clients go through the gate: an echo over DialContext, and a
// refused dial when admission rejects.
func TestDialContextThroughGate(t *testing.T) {
	st, _, ct := newTestStack(t, accept)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "tcp", service.String())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	c.Close()
	if ct.Stats().Inserted != 1 {
		t.Errorf("conntrack inserted %d entries, want 1", ct.Stats().Inserted)
	}
	st.SetAdmit(func(conntrack.Tuple) Decision { return Reject })
	if _, err := st.DialContext(ctx, "tcp", "10.96.0.11:80"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("dial to a rejected flow: %v, want connection refused", err)
	}
}

func TestBuildPortUnreachableIPv6(t *testing.T) {
	b := make([]byte, header.IPv6MinimumSize+header.UDPMinimumSize+4)
	src, dst := tcpip.AddrFrom16(netip.MustParseAddr("fd00::1").As16()), tcpip.AddrFrom16(netip.MustParseAddr("fd00:96::10").As16())
	header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: header.UDPMinimumSize + 4, TransportProtocol: header.UDPProtocolNumber, HopLimit: 64, SrcAddr: src, DstAddr: dst})
	out := buildPortUnreachable(b)
	ip := header.IPv6(out)
	if ip.SourceAddress() != dst || ip.DestinationAddress() != src || ip.NextHeader() != uint8(header.ICMPv6ProtocolNumber) {
		t.Fatalf("bad IPv6 header: %x", out)
	}
	icmp := header.ICMPv6(ip.Payload())
	if icmp.Type() != header.ICMPv6DstUnreachable || icmp.Code() != header.ICMPv6PortUnreachable {
		t.Fatalf("type %d code %d", icmp.Type(), icmp.Code())
	}
	xsum := header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(icmp)))
	if checksum.Checksum(icmp, xsum) != 0xffff {
		t.Error("bad ICMPv6 checksum")
	}
	if string(icmp[header.ICMPv6DstUnreachableMinimumSize:]) != string(b) {
		t.Error("quoted packet differs")
	}
}

func TestRejecterRateLimit(t *testing.T) {
	now := time.Unix(0, 0)
	r := newRejecter(1000, 50, func() time.Time { return now })
	n := 0
	for range 100 {
		if r.allow() {
			n++
		}
	}
	if n != 50 {
		t.Fatalf("burst allowed %d, want 50", n)
	}
	now = now.Add(10 * time.Millisecond) // 10 tokens
	n = 0
	for range 100 {
		if r.allow() {
			n++
		}
	}
	if n != 10 {
		t.Fatalf("after 10ms allowed %d, want 10", n)
	}
}

// A client that never completes its handshake (no ACK of the SYN-ACK) holds
// its in-flight slot only for HandshakeTimeout: the handshake is aborted and
// the handler's Accept fails.
func TestHandshakeTimeoutAborts(t *testing.T) {
	accepted := make(chan error, 1)
	st, link := newHandshakeStack(t, 100*time.Millisecond, handlerFunc(func(r *TCPRequest) {
		c, err := r.Accept()
		if c != nil {
			c.Close()
		}
		accepted <- err
	}))
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	select {
	case err := <-accepted:
		if err == nil {
			t.Fatal("Accept succeeded without the client's ACK")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handshake was not aborted")
	}
	waitUntil(t, func() bool { return st.Stats().TCPInFlight == 0 })
	if n := st.Stats().HandshakesAborted; n != 1 {
		t.Errorf("HandshakesAborted = %d, want 1", n)
	}
}

// HandshakeTimeout runs from the client's SYN, so the endpoint dial is
// part of it: a handler that dials for most of the timeout and then
// accepts, for a client that never ACKs, sees the handshake aborted about
// HandshakeTimeout after the SYN, well before HandshakeTimeout after the
// dial.
func TestHandshakeTimeoutIncludesDial(t *testing.T) {
	const timeout, dial = 2 * time.Second, 1500 * time.Millisecond
	type result struct {
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	st, link := newHandshakeStack(t, timeout, handlerFunc(func(r *TCPRequest) {
		time.Sleep(dial) // the endpoint dial
		c, err := r.Accept()
		if c != nil {
			c.Close()
		}
		done <- result{err, time.Now()}
	}))
	syn := time.Now()
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	var res result
	select {
	case res = <-done:
	case <-time.After(timeout + dial + 10*time.Second):
		t.Fatal("the handshake was not aborted")
	}
	if res.err == nil {
		t.Fatal("Accept succeeded without the client's ACK")
	}
	if took := res.at.Sub(syn); took < timeout || took >= timeout+dial {
		t.Errorf("handshake aborted %v after the SYN, want from %v (the timeout from the SYN) to before %v (the timeout from the dial's end)",
			took, timeout, timeout+dial)
	}
	waitUntil(t, func() bool { return st.Stats().TCPInFlight == 0 })
	if n := st.Stats().HandshakesAborted; n != 1 {
		t.Errorf("HandshakesAborted = %d, want 1", n)
	}
}

// A dial longer than HandshakeTimeout: the timeout fires while there is no
// SYN-ACK for a RST to hit, so Accept, when the dial returns, must refuse
// the client rather than start a handshake that holds the slot past the
// timeout (it used to, for as long as gVisor retransmits the SYN-ACK).
func TestHandshakeTimeoutDuringDial(t *testing.T) {
	const timeout, dial = 300 * time.Millisecond, 600 * time.Millisecond
	done := make(chan error, 1)
	st, link := newHandshakeStack(t, timeout, handlerFunc(func(r *TCPRequest) {
		time.Sleep(dial) // the endpoint dial
		c, err := r.Accept()
		if c != nil {
			c.Close()
		}
		done <- err
	}))
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Accept succeeded after the handshake timed out")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never returned")
	}
	if n := st.Stats().TCPInFlight; n != 0 {
		t.Errorf("%d handshakes still in flight right after Accept refused", n)
	}
	if n := st.Stats().HandshakesAborted; n != 1 {
		t.Errorf("HandshakesAborted = %d, want 1", n)
	}
}

// newHandshakeStack is a stack over a memory link that accepts every flow,
// hands it to h and times handshakes out after timeout.
func newHandshakeStack(t *testing.T, timeout time.Duration, h FlowHandler) (*Stack, *MemoryLink) {
	t.Helper()
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept, HandshakeTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.SetFlowHandler(h)
	return st, link
}

type handlerFunc func(*TCPRequest)

func (f handlerFunc) HandleTCP(r *TCPRequest) { f(r) }
func (handlerFunc) HandleUDP(r *UDPRequest)   { r.Conn.Close() }

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// The gate skips checksum verification only for packets the link says the
// kernel vouched for (tunlink_linux.go): a SYN with a wrong TCP checksum is
// admitted when so marked, and INVALID otherwise. (Past the gate, gVisor
// trusts the link's capabilities, which a MemoryLink does not offer.)
// Both ways in: a PacketBuffer marked RXChecksumValidated, and the bytes
// with trusted set (DeliverBytes, the Linux TUN's way).
func TestGateTrustsOnlyVouchedChecksums(t *testing.T) {
	for _, bytesIn := range []bool{false, true} {
		for _, vouched := range []bool{true, false} {
			st, _, ct := newTestStack(t, accept)
			b := tcpPacket(client, service, header.TCPFlagSyn, 1000, 0)
			b[header.IPv4MinimumSize+16] ^= 0x5a // the TCP checksum
			if bytesIn {
				st.gates[linkNIC].DeliverBytes(header.IPv4ProtocolNumber, b, vouched)
			} else {
				pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(b)})
				pb.RXChecksumValidated = vouched
				st.gates[linkNIC].DeliverNetworkPacket(header.IPv4ProtocolNumber, pb)
				pb.DecRef()
			}
			accepted, invalid := st.Stats().Accepted, ct.Stats().Invalid[conntrack.ReasonBadChecksum]
			_, tracked := ct.Get(conntrack.MakeTuple(conntrack.TCP, client, service))
			switch {
			case vouched && (accepted != 1 || invalid != 0 || !tracked):
				t.Errorf("bytes %v, vouched for: %d accepted, %d INVALID, tracked %v; want 1, 0, true", bytesIn, accepted, invalid, tracked)
			case !vouched && (accepted != 0 || invalid != 1 || tracked):
				t.Errorf("bytes %v, not vouched for: %d accepted, %d INVALID, tracked %v; want 0, 1, false", bytesIn, accepted, invalid, tracked)
			}
		}
	}
}

// The Linux TUN hands the gate the bytes it read (DeliverBytes), in a
// buffer it reuses for the next read; the gate makes gVisor's PacketBuffer
// of them only for a packet that goes on into gVisor. Through that entry,
// with the buffer overwritten after every call: an accepted SYN is
// answered with a SYN-ACK, a rejected one with a port unreachable quoting
// it, a stray ACK is INVALID and unanswered, and of a UDP flow the first
// datagram reaches the handler through gVisor and the second its bypass.
func TestDeliverBytes(t *testing.T) {
	buf := make([]byte, 2048)
	deliver := func(st *Stack, b []byte) {
		n := copy(buf, b)
		st.gates[linkNIC].DeliverBytes(header.IPv4ProtocolNumber, buf[:n], false)
		clear(buf) // as the next read would
	}
	read := func(link *MemoryLink, d time.Duration) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return link.Read(ctx)
	}
	syn := tcpPacket(client, service, header.TCPFlagSyn, 1000, 0)

	t.Run("accepted SYN", func(t *testing.T) {
		st, link, _ := newTestStack(t, accept)
		deliver(st, syn)
		pkt := read(link, 5*time.Second)
		if pkt == nil {
			t.Fatal("no answer to the SYN")
		}
		if tcp := header.TCP(header.IPv4(pkt).Payload()); tcp.Flags() != header.TCPFlagSyn|header.TCPFlagAck || tcp.AckNumber() != 1001 {
			t.Fatalf("answer flags %v ack %d, want SYN-ACK 1001", tcp.Flags(), tcp.AckNumber())
		}
	})
	t.Run("rejected SYN", func(t *testing.T) {
		st, link, _ := newTestStack(t, func(conntrack.Tuple) Decision { return Reject })
		deliver(st, syn)
		pkt := read(link, 5*time.Second)
		if pkt == nil {
			t.Fatal("no ICMP error")
		}
		if quoted := header.ICMPv4(header.IPv4(pkt).Payload())[header.ICMPv4MinimumSize:]; !bytes.Equal(quoted, syn) {
			t.Errorf("quoted %x, want the SYN %x", quoted, syn)
		}
	})
	t.Run("stray ACK", func(t *testing.T) {
		st, link, _ := newTestStack(t, accept)
		deliver(st, tcpPacket(client, service, header.TCPFlagAck, 1000, 2000))
		if pkt := read(link, 200*time.Millisecond); pkt != nil {
			t.Fatalf("a stray ACK was answered with %d bytes", len(pkt))
		}
		if got := st.Stats().InvalidIn; got != 1 {
			t.Errorf("InvalidIn = %d, want 1", got)
		}
	})
	t.Run("UDP", func(t *testing.T) {
		st, _, _ := newTestStack(t, accept)
		h := udpBypassHandler{got: make(chan string, 10), fromConn: make(chan string, 10), stopped: make(chan struct{}), stopAfter: 1}
		st.SetFlowHandler(h)
		dns := netip.MustParseAddrPort("10.96.0.53:53")
		for _, want := range []struct{ msg, via string }{{"one", "conn"}, {"two", "bypass"}} {
			if want.via == "bypass" {
				waitUntil(t, func() bool { return st.bypass.n.Load() == 1 })
			}
			deliver(st, udpDatagram(client, dns, []byte(want.msg)))
			ch := h.fromConn
			if want.via == "bypass" {
				ch = h.got
			}
			select {
			case got := <-ch:
				if got != want.msg {
					t.Fatalf("via %s: %q, want %q", want.via, got, want.msg)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("datagram %q did not arrive via %s", want.msg, want.via)
			}
		}
	})
}

// TestAppendHead: of a segment built as gVisor's TCP endpoint builds one,
// the gate copies the IP and TCP headers alone, and conntrack classifies
// them as it classifies the whole segment; a packet without those headers
// is copied whole.
func TestAppendHead(t *testing.T) {
	client6 := netip.MustParseAddrPort("[fd00::7]:40000")
	service6 := netip.MustParseAddrPort("[fd00:96::10]:80")
	mss := []byte{2, 4, 0x05, 0xb4}
	for _, v := range []struct {
		name    string
		c, s    netip.AddrPort
		opts    []byte
		headers int
	}{
		{"IPv4", client, service, nil, 40},
		{"IPv4 with options", client, service, mss, 44},
		{"IPv6", client6, service6, nil, 60},
		{"IPv6 with options", client6, service6, mss, 64},
	} {
		t.Run(v.name, func(t *testing.T) {
			pkt := gvisorSegment(v.s, v.c, 5001, 1001, v.opts, make([]byte, 3000))
			defer pkt.DecRef()
			head := appendHead(nil, pkt)
			whole := appendPacket(nil, pkt)
			if len(head) != v.headers || !bytes.Equal(head, whole[:v.headers]) {
				t.Fatalf("head %d bytes (%x), want the segment's first %d", len(head), head, v.headers)
			}
			// No table tracks the flow: both results are no_entry_reply,
			// and they carry the parsed segment, which must be the same.
			heads, err := conntrack.NewTable(conntrack.Config{})
			if err != nil {
				t.Fatal(err)
			}
			wholes, err := conntrack.NewTable(conntrack.Config{})
			if err != nil {
				t.Fatal(err)
			}
			rh := heads.ClassifyHead(head, pkt.Size(), conntrack.Reply)
			rw := wholes.Classify(whole, conntrack.Reply)
			if rh != rw || rh.Tuple != conntrack.MakeTuple(conntrack.TCP, v.c, v.s) {
				t.Errorf("head %v/%v %v, whole %v/%v %v", rh.Verdict, rh.Reason, rh.Tuple, rw.Verdict, rw.Reason, rw.Tuple)
			}
		})
	}
	// A TCP packet whose headers were never pushed (built whole, as the
	// gate builds its own), with the protocol set so that only the
	// headers' absence sends it to the whole copy.
	raw := append(tcpPacket(client, service, header.TCPFlagAck, 1, 1), make([]byte, 100)...)
	header.IPv4(raw).SetTotalLength(uint16(len(raw)))
	own := newPacket(raw, header.IPv4ProtocolNumber)
	defer own.DecRef()
	own.TransportProtocolNumber = header.TCPProtocolNumber
	if got := appendHead(nil, own); len(got) != own.Size() {
		t.Errorf("a TCP packet without gVisor's headers: %d of %d bytes copied", len(got), own.Size())
	}
}

// TestOutboundSegmentsClassifiedFromHeaders: the gate classifies gVisor's
// TCP segments from their headers (appendHead), and conntrack still counts
// every byte they carry, both ways, with nothing found INVALID: the window
// tracking of a 4 MiB echo depends on every payload's length.
func TestOutboundSegmentsClassifiedFromHeaders(t *testing.T) {
	st, _, ct := newTestStack(t, accept)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "tcp", service.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	out := make([]byte, size)
	for i := range out {
		out[i] = byte(i * 7)
	}
	go func() { _, _ = c.Write(out) }()
	in := make([]byte, size)
	if _, err := io.ReadFull(c, in); err != nil || !bytes.Equal(in, out) {
		t.Fatalf("echo of %d bytes: %v (equal %v)", size, err, bytes.Equal(in, out))
	}
	tuple := conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort(c.LocalAddr().String()), service)
	e, ok := ct.Get(tuple)
	if !ok {
		t.Fatalf("no entry for %v", tuple)
	}
	if e.Bytes[conntrack.Original] < size || e.Bytes[conntrack.Reply] < size {
		t.Errorf("entry bytes %v, want at least %d each way", e.Bytes, size)
	}
	if s := st.Stats(); s.InvalidOut != 0 || s.InvalidIn != 0 || ct.Stats().InvalidTotal != 0 {
		t.Errorf("INVALID: out %d, in %d, conntrack %d", s.InvalidOut, s.InvalidIn, ct.Stats().InvalidTotal)
	}
}

// TestLargeSegmentKeepsItsPayloadChunk: of a TCP segment with a large
// payload, newInboundPacket puts the headers in a chunk apart, so that the
// copy gVisor's IPv4 HandlePacket causes (it slices the network header
// while holding a view of it, and PullUp copies a shared chunk) copies that
// small chunk and leaves the payload where it is; the packet's bytes are
// the segment's. Small segments and other packets stay in one chunk.
func TestLargeSegmentKeepsItsPayloadChunk(t *testing.T) {
	payload := make([]byte, 60000)
	for i := range payload {
		payload[i] = byte(i * 13)
	}
	seg := tcpData(client, service, 1001, 5001, payload)
	pkt := newInboundPacket(seg, header.IPv4ProtocolNumber)
	defer pkt.DecRef()
	views := pkt.AsSlices()
	if len(views) != 2 || len(views[0]) != header.IPv4MinimumSize+header.TCPMinimumSize {
		t.Fatalf("views of %v bytes, want the headers' 40 and the payload's", lens(views))
	}
	if got := bytes.Join(views, nil); !bytes.Equal(got, seg) {
		t.Fatal("the packet's bytes differ from the segment's")
	}
	before := &views[1][0]
	// What ipv4's parseAndValidate and HandlePacket do with the header.
	if _, ok := pkt.NetworkHeader().Consume(header.IPv4MinimumSize); !ok {
		t.Fatal("Consume")
	}
	held := pkt.NetworkHeader().View()
	_ = pkt.NetworkHeader().Slice()
	held.Release()
	if after := pkt.AsSlices(); &after[1][0] != before || !bytes.Equal(bytes.Join(after, nil), seg) {
		t.Fatal("the payload's chunk was copied")
	}

	for _, b := range [][]byte{
		tcpData(client, service, 1001, 5001, payload[:splitPayload-1]),
		udpDatagram(client, service, payload),
		tcpPacket(client, service, header.TCPFlagAck, 1001, 5001),
	} {
		p := newInboundPacket(b, header.IPv4ProtocolNumber)
		if n := len(p.AsSlices()); n != 1 {
			t.Errorf("a %d-byte packet in %d views, want 1", len(b), n)
		}
		p.DecRef()
	}
}

func lens(views [][]byte) []int {
	var n []int
	for _, v := range views {
		n = append(n, len(v))
	}
	return n
}

// TestTCPHeadersLen: the IP and TCP headers' length of IPv4 (with options)
// and IPv6 segments, and 0 for other packets and cut headers.
func TestTCPHeadersLen(t *testing.T) {
	v4 := tcpPacket(client, service, header.TCPFlagAck, 1, 1)
	v4opts := append([]byte(nil), v4...)
	v4opts[0] = 0x46 // a 24-byte IP header: the TCP header then starts 4 bytes later
	v4opts = append(v4opts[:20], append(make([]byte, 4), v4opts[20:]...)...)
	v6 := make([]byte, 40+32)
	v6[0], v6[6], v6[40+12] = 0x60, 6, 8<<4
	for _, tc := range []struct {
		name string
		b    []byte
		want int
	}{
		{"IPv4", v4, 40},
		{"IPv4 with options", v4opts, 44},
		{"IPv6 with TCP options", v6, 72},
		{"UDP", udpDatagram(client, service, []byte("x")), 0},
		{"cut TCP header", v4[:30], 0},
		{"data offset past the end", v6[:60], 0},
	} {
		if got := tcpHeadersLen(tc.b); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestLargeSegmentReachesTheFlow: a 60,000-byte segment that the kernel
// vouched for (a GRO or TSO super-packet from the TUN), delivered as bytes
// (so newInboundPacket makes it of two views, as the test above checks),
// reaches the flow byte for byte.
func TestLargeSegmentReachesTheFlow(t *testing.T) {
	st, link, _ := newTestStack(t, accept)
	payload := make([]byte, 60000)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	st.SetFlowHandler(handlerFunc(func(r *TCPRequest) {
		c, err := r.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, len(payload))
		_, err = io.ReadFull(c, buf)
		if err != nil {
			buf = nil
		}
		got <- buf
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	link.Inject(tcpPacket(client, service, header.TCPFlagSyn, 1000, 0))
	synAck := link.Read(ctx)
	if synAck == nil {
		t.Fatal("no SYN-ACK")
	}
	iss := header.TCP(header.IPv4(synAck).Payload()).SequenceNumber()
	link.Inject(tcpPacket(client, service, header.TCPFlagAck, 1001, iss+1))
	st.gates[linkNIC].DeliverBytes(header.IPv4ProtocolNumber, tcpData(client, service, 1001, iss+1, payload), true)
	select {
	case b := <-got:
		if !bytes.Equal(b, payload) {
			t.Fatalf("the flow read %d bytes, not the segment's %d", len(b), len(payload))
		}
	case <-ctx.Done():
		t.Fatal("the flow did not read the segment")
	}
}

// A table full of handshakes whose clients never ACK (a SYN flood) makes
// room for a new client by aborting the one that has waited longest, at
// least evictAge, as the kernel prunes its SYN queue (forward.go,
// oldestHandshake): the first client's Accept fails, the second's stays,
// and the new client's retransmitted SYN is answered.
func TestFullTableEvictsOldestHandshake(t *testing.T) {
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		t.Fatal(err)
	}
	link := NewMemoryLink(0, 64)
	st, err := New(Options{Link: &link.Link, Conntrack: ct, Admit: accept, HandshakeTimeout: 30 * time.Second,
		MaxInFlight: 2, MaxInFlightPerClient: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	type result struct {
		client netip.AddrPort
		err    error
	}
	results := make(chan result, 3)
	st.SetFlowHandler(handlerFunc(func(r *TCPRequest) {
		c, err := r.Accept()
		if c != nil {
			c.Close()
		}
		results <- result{r.Client(), err}
	}))
	synAckTo := func(c netip.AddrPort) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for {
			pkt := link.Read(ctx)
			if pkt == nil {
				t.Fatalf("no SYN-ACK to %s", c)
			}
			tcp := header.TCP(pkt[header.IPv4(pkt).HeaderLength():])
			if tcp.Flags() == header.TCPFlagSyn|header.TCPFlagAck && tcp.DestinationPort() == c.Port() {
				return
			}
		}
	}
	first := netip.MustParseAddrPort("192.0.2.7:40001")
	second := netip.MustParseAddrPort("192.0.2.8:40002")
	third := netip.MustParseAddrPort("192.0.2.9:40003")
	link.Inject(tcpPacket(first, service, header.TCPFlagSyn, 1000, 0))
	synAckTo(first)
	link.Inject(tcpPacket(second, service, header.TCPFlagSyn, 2000, 0))
	synAckTo(second)
	time.Sleep(evictAge + 100*time.Millisecond)
	link.Inject(tcpPacket(third, service, header.TCPFlagSyn, 3000, 0)) // dropped, and the oldest aborted
	select {
	case r := <-results:
		if r.client != first || r.err == nil {
			t.Fatalf("%s's Accept ended (%v); want the first client's to fail", r.client, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no handshake was aborted to make room")
	}
	waitUntil(t, func() bool { return st.Stats().TCPInFlight == 1 })
	link.Inject(tcpPacket(third, service, header.TCPFlagSyn, 3000, 0)) // the retransmission
	synAckTo(third)
	select {
	case r := <-results:
		t.Fatalf("%s's Accept ended too (%v)", r.client, r.err)
	default:
	}
}

// TestGVisorTCPOptions: the proxy's gVisor stack runs SACK and RACK, and
// gVisor's NewReno: its CUBIC measured worse under loss (setTCPOptions).
func TestGVisorTCPOptions(t *testing.T) {
	st, _, _ := newTestStack(t, accept)
	var cc tcpip.CongestionControlOption
	if err := st.s.TransportProtocolOption(tcp.ProtocolNumber, &cc); err != nil || cc != "reno" {
		t.Errorf("congestion control %q (%v); want reno", cc, err)
	}
	var sack tcpip.TCPSACKEnabled
	if err := st.s.TransportProtocolOption(tcp.ProtocolNumber, &sack); err != nil || !bool(sack) {
		t.Errorf("SACK %v (%v); want on", sack, err)
	}
	var rec tcpip.TCPRecovery
	if err := st.s.TransportProtocolOption(tcp.ProtocolNumber, &rec); err != nil || rec&tcpip.TCPRACKLossDetection == 0 {
		t.Errorf("recovery %v (%v); want RACK", rec, err)
	}
}

package netstack

// How the stack is put together (New):
//
//  1. A gVisor stack with IPv4, IPv6, TCP, UDP and ICMP, promiscuous and
//     spoofing on every NIC so that it accepts packets for any service IP
//     and answers from it.
//  2. NIC 1 is the Link (TUN or in-memory), behind a gate (gate.go).
//  3. NIC 2 is an in-memory pipe to a second, private gVisor stack that
//     plays the client for DialContext and ListenPacket, behind its own gate:
//     in-process clients go through exactly the path TUN clients take.
//  4. The TCP and UDP forwarders (forward.go) hand new flows to the flow
//     handler.

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/translate"
)

// The addresses of the in-process client stack (DialContext, ListenPacket):
// link-local and unique-local addresses that no service CIDR should hold.
var (
	InProcessClientIPv4 = netip.MustParseAddr("169.254.77.1")
	InProcessClientIPv6 = netip.MustParseAddr("fd75:7365:7270::1")
)

const (
	linkNIC     tcpip.NICID = 1
	inProcNIC   tcpip.NICID = 2
	inProcMTU               = 65520
	clientNICID tcpip.NICID = 1
)

// Options configures a Stack.
type Options struct {
	// Link is where client packets come from (required). The Stack owns it.
	Link *Link
	// Conntrack is the table the gate classifies every packet with
	// (required).
	Conntrack *conntrack.Table
	// Reassembler reassembles the fragments the gate reads before they are
	// classified (defrag.go); nil means one with the kernel's defaults and
	// the system clock. Its owner calls Sweep now and then to free the
	// memory of timed out queues when no fragment arrives.
	Reassembler *conntrack.Reassembler
	// Admit decides new flows; nil rejects every flow until SetAdmit.
	Admit AdmitFunc
	// MaxInFlight bounds the TCP handshakes handed to the flow handler and
	// not yet completed; further SYNs are dropped (the client retries).
	// 0 means DefaultMaxInFlight.
	MaxInFlight int
	// MaxInFlightPerClient bounds one client address's share of
	// MaxInFlight, so a SYN flood from one client cannot starve others.
	// 0 means MaxInFlight/4 (at least 1).
	MaxInFlightPerClient int
	// ICMPPerSecond and ICMPBurst rate-limit the port unreachables of
	// rejected flows (the kernel's icmp_msgs_per_sec and icmp_msgs_burst);
	// 0 means 1000 and 50.
	ICMPPerSecond, ICMPBurst int
	// TranslateTCP carries TCP flows without gVisor when the flow handler
	// is a TranslatedHandler (translate.go).
	TranslateTCP bool
	// HandshakeTimeout bounds how long a client may take to complete its
	// handshake, counted from its SYN: the endpoint dial runs within it,
	// and the client's ACK of our SYN-ACK must come before it ends; then
	// the handshake is aborted and its in-flight slot and endpoint
	// connection freed. 0 means 10 s. (gVisor alone retransmits the SYN-ACK
	// for about two minutes.)
	HandshakeTimeout time.Duration
	// StrayResets is how long after New a client's TCP segment that finds
	// no flow and is not a SYN is answered with a RST, as a host answers a
	// segment for a connection it does not have (RFC 9293 3.10.7.1), and
	// not only dropped as INVALID (nf_conntrack_tcp_loose=0): for a start
	// after a proxy that crashed, whose clients' flows would otherwise
	// hang until their own timeouts. 0: never. The RSTs share the ICMP
	// errors' rate limit.
	StrayResets time.Duration
	// Now is the clock of the rate limiter and of the translator's
	// half-open handshakes' ages; nil means time.Now.
	Now func() time.Time
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// Stack is the userspace network stack behind the TUN device. Its methods
// are safe for concurrent use.
type Stack struct {
	s      *stack.Stack
	client *stack.Stack
	link   *Link
	ct     *conntrack.Table
	logger *zap.Logger
	now    func() time.Time

	admit    atomic.Pointer[AdmitFunc]
	handler  atomic.Pointer[handlerBox]
	counters gateCounters

	pipe        *asyncPipe
	tcpFwd      *tcp.Forwarder
	maxInFlight int
	perClient   int
	hsTimeout   time.Duration
	gates       map[tcpip.NICID]*gate
	bypass      udpBypass
	resets      resetting
	synAcks     synAckWrites
	acks        ackHolder // the link gate's (ackhold.go)
	xl          translator

	mu       sync.Mutex
	closed   bool
	inFlight map[stack.TransportEndpointID]*pending
	perAddr  map[netip.Addr]int
	// handshakes holds the requests whose SYN-ACK is out (Accept), in the
	// order it went (stack.TransportEndpointID): the oldest is at the front,
	// so a full table finds the one to evict without a scan.
	handshakes list.List
	handlers   sync.WaitGroup
	ctx        context.Context
	cancel     context.CancelFunc
	closeOnce  sync.Once
}

type handlerBox struct{ h FlowHandler }

// DefaultMaxInFlight is the default bound on TCP handshakes in flight: the
// kernel's default listen backlog (SOMAXCONN, 4096 since Linux 5.4), the
// most handshakes one listener of an endpoint queues. One client may hold a
// quarter: a test suite or a pod opening 256 connections at once (the
// harness's conn/s cell) lost a few to SYNs dropped at 128 and waited a
// second for each.
const DefaultMaxInFlight = 4096

// New builds the stack over opts.Link. On error the link is closed.
func New(opts Options) (*Stack, error) {
	if opts.Link == nil || opts.Conntrack == nil {
		return nil, errors.New("netstack: Options.Link and Options.Conntrack are required")
	}
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.MaxInFlightPerClient <= 0 {
		opts.MaxInFlightPerClient = max(1, opts.MaxInFlight/4)
	}
	if opts.ICMPPerSecond <= 0 {
		opts.ICMPPerSecond = 1000
	}
	if opts.ICMPBurst <= 0 {
		opts.ICMPBurst = 50
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Reassembler == nil {
		r, err := conntrack.NewReassembler(conntrack.ReassemblyConfig{})
		if err != nil {
			_ = opts.Link.close()
			return nil, fmt.Errorf("netstack: %w", err)
		}
		opts.Reassembler = r
	}
	st := &Stack{
		link:        opts.Link,
		ct:          opts.Conntrack,
		logger:      opts.Logger,
		now:         opts.Now,
		maxInFlight: opts.MaxInFlight,
		perClient:   opts.MaxInFlightPerClient,
		hsTimeout:   opts.HandshakeTimeout,
		gates:       make(map[tcpip.NICID]*gate),
		inFlight:    make(map[stack.TransportEndpointID]*pending),
		perAddr:     make(map[netip.Addr]int),
	}
	st.resets.ct = opts.Conntrack
	st.ctx, st.cancel = context.WithCancel(context.Background())
	st.SetAdmit(opts.Admit)
	if err := st.build(opts); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

func newGVisorStack() *stack.Stack {
	return stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
}

func (st *Stack) build(opts Options) error {
	st.s = newGVisorStack()
	if err := setTCPOptions(st.s); err != nil {
		return err
	}
	rej := newRejecter(opts.ICMPPerSecond, opts.ICMPBurst, opts.Now)
	admit := func() AdmitFunc { return *st.admit.Load() }

	st.pipe = newAsyncPipe(inProcMTU, 1024)
	ours, theirs := st.pipe.a, st.pipe.b
	st.gates[linkNIC] = newGate(opts.Link.ep, st.ct, admit, rej, &st.counters, &st.bypass, &st.resets)
	if opts.StrayResets > 0 {
		st.gates[linkNIC].strayUntil = opts.Now().Add(opts.StrayResets)
	}
	st.synAcks.limit = synAckWait
	st.gates[linkNIC].synAcks = &st.synAcks // the link's writes run the client's side (synack.go)
	lg := st.gates[linkNIC]
	st.acks.init(func(pl stack.PacketBufferList) { // ackhold.go
		if _, err := lg.child.WritePackets(pl); err != nil {
			st.counters.outboundWriteError.Add(1)
		}
	}, ackHold, time.Now)
	lg.acks = &st.acks
	if opts.TranslateTCP {
		st.xl = translator{st: st, perAddr: make(map[netip.Addr]int)}
		st.xl.kept.Store(translate.KeptTotal)
		lg.xl = &st.xl // translate.go
	}
	st.gates[inProcNIC] = newGate(ours, st.ct, admit, rej, &st.counters, &st.bypass, &st.resets)
	for _, g := range st.gates {
		g.defrag = opts.Reassembler
	}
	nics := []struct {
		id   tcpip.NICID
		ep   stack.LinkEndpoint
		name string
	}{
		{linkNIC, st.gates[linkNIC], opts.Link.name},
		{inProcNIC, st.gates[inProcNIC], "in-process"},
	}
	for _, n := range nics {
		if err := st.s.CreateNICWithOptions(n.id, n.ep, stack.NICOptions{Name: n.name}); err != nil {
			return fmt.Errorf("netstack: creating NIC %q: %s", n.name, err)
		}
		if err := st.s.SetPromiscuousMode(n.id, true); err != nil {
			return fmt.Errorf("netstack: promiscuous mode on %q: %s", n.name, err)
		}
		if err := st.s.SetSpoofing(n.id, true); err != nil {
			return fmt.Errorf("netstack: spoofing on %q: %s", n.name, err)
		}
		// Replies leave by the NIC their flow came in on: the forwarders'
		// endpoints are bound to it, and each NIC routes everything.
		st.s.AddRoute(tcpip.Route{Destination: header.IPv4EmptySubnet, NIC: n.id})
		st.s.AddRoute(tcpip.Route{Destination: header.IPv6EmptySubnet, NIC: n.id})
	}

	st.tcpFwd = tcp.NewForwarder(st.s, 0, st.maxInFlight, st.handleTCP)
	st.s.SetTransportProtocolHandler(tcp.ProtocolNumber, st.admitSYN)
	udpFwd := udp.NewForwarder(st.s, st.handleUDP)
	st.s.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)

	st.client = newGVisorStack()
	if err := st.client.CreateNIC(clientNICID, theirs); err != nil {
		return fmt.Errorf("netstack: creating the in-process client NIC: %s", err)
	}
	for _, a := range []netip.Addr{InProcessClientIPv4, InProcessClientIPv6} {
		addr, proto := fromAddr(a)
		pa := tcpip.ProtocolAddress{Protocol: proto, AddressWithPrefix: addr.WithPrefix()}
		if err := st.client.AddProtocolAddress(clientNICID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("netstack: in-process client address %s: %s", a, err)
		}
	}
	st.client.AddRoute(tcpip.Route{Destination: header.IPv4EmptySubnet, NIC: clientNICID})
	st.client.AddRoute(tcpip.Route{Destination: header.IPv6EmptySubnet, NIC: clientNICID})
	sack := tcpip.TCPSACKEnabled(true)
	st.client.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	return nil
}

// setTCPOptions sets the proxy stack's TCP options. SACK on (Linux's
// default; it keeps bulk transfers fast under loss); buffers that grow with
// the flow (moderation) up to 4 MiB, so that one flow can fill a fast link
// without costing idle connections more than the minimum; no TIME_WAIT at all
// in gVisor: conntrack keeps the kernel's TIME_WAIT for the flow, and a gVisor
// endpoint in TIME_WAIT passes a client's new SYN for the same ports only to
// a listening endpoint, never to the forwarder, so a client reusing its port
// waited a full SYN retransmission (1 s; measured on 1% of connections at 64
// concurrent clients); Nagle off, as the proxy writes what it reads. gVisor's
// default congestion control (NewReno) and loss detection (RACK) stay: its
// CUBIC was tried and cut the downloads under 1% loss, 1% corruption and
// reordering to a third (BENCHMARKS.md, issue 45, 2026-12-08).
func setTCPOptions(s *stack.Stack) error {
	opts := []tcpip.SettableTransportProtocolOption{
		ptr(tcpip.TCPSACKEnabled(true)),
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 128 << 10, Max: 4 << 20},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 128 << 10, Max: 4 << 20},
		ptr(tcpip.TCPModerateReceiveBufferOption(true)),
		ptr(tcpip.TCPTimeWaitTimeoutOption(0)),
		ptr(tcpip.TCPDelayEnabled(false)),
		// SYN-ACK retransmissions of a pending handshake: 3 (1+2+4 s, then
		// 8 s more) instead of gVisor's 6 (about 2 minutes). A flood of
		// SYNs that are never ACKed holds in-flight slots and the dialled
		// endpoint connections for that long; 15 s bounds it.
		ptr(tcpip.TCPSynRetriesOption(3)),
	}
	for _, o := range opts {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			return fmt.Errorf("netstack: TCP option %T: %s", o, err)
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// SetAdmit replaces the admission function; nil rejects every new flow.
func (st *Stack) SetAdmit(f AdmitFunc) {
	if f == nil {
		f = func(conntrack.Tuple) Decision { return Reject }
	}
	st.admit.Store(&f)
}

// SetFlowHandler sets the handler of new flows; until it is set, new TCP
// flows are refused with a RST and new UDP flows are dropped.
func (st *Stack) SetFlowHandler(h FlowHandler) {
	st.handler.Store(&handlerBox{h: h})
}

func (st *Stack) flowHandler() FlowHandler {
	if b := st.handler.Load(); b != nil {
		return b.h
	}
	return nil
}

// DialContext connects to address (an IP literal and port) through the
// stack, from the in-process client: the connection passes the gate and the
// forwarders exactly as one from the TUN does. network is "tcp", "tcp4",
// "tcp6", "udp", "udp4" or "udp6". It needs no TUN device and no privileges.
func (st *Stack) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, fmt.Errorf("netstack: dial %s %s: %w", network, address, err)
	}
	full, proto := fullAddr(ap)
	switch network {
	case "tcp", "tcp4", "tcp6":
		c, err := gonet.DialContextTCP(ctx, st.client, full, proto)
		if err != nil {
			return nil, fmt.Errorf("netstack: dial %s %s: %w", network, address, err)
		}
		return c, nil
	case "udp", "udp4", "udp6":
		c, err := gonet.DialUDP(st.client, nil, &full, proto)
		if err != nil {
			return nil, fmt.Errorf("netstack: dial %s %s: %w", network, address, err)
		}
		return c, nil
	}
	return nil, fmt.Errorf("netstack: dial: unsupported network %q", network)
}

// ListenPacket opens an unconnected UDP socket on the in-process client
// (network "udp4" or "udp6", any port), whose datagrams go through the stack.
func (st *Stack) ListenPacket(network string) (net.PacketConn, error) {
	var a netip.Addr
	switch network {
	case "udp", "udp4":
		a = InProcessClientIPv4
	case "udp6":
		a = InProcessClientIPv6
	default:
		return nil, fmt.Errorf("netstack: listen: unsupported network %q", network)
	}
	full, proto := fullAddr(netip.AddrPortFrom(a, 0))
	c, err := gonet.DialUDP(st.client, &full, nil, proto)
	if err != nil {
		return nil, fmt.Errorf("netstack: listen %s: %w", network, err)
	}
	return c, nil
}

// Stats is a snapshot of the stack's counters.
type Stats struct {
	// Packets read from the links and written to them (before the gate's
	// verdicts).
	PacketsIn, PacketsOut uint64
	// InvalidIn and InvalidOut are the packets the gate dropped as INVALID
	// (conntrack.Stats says why).
	InvalidIn, InvalidOut uint64
	// Rejected new flows (an ICMP unreachable was sent unless rate-limited),
	// and how many of those ICMP errors the rate limit suppressed.
	Rejected, RejectRateLimited uint64
	// Dropped new flows (admission said Drop).
	Dropped uint64
	// TableFull: new flows refused because the conntrack table was full.
	TableFull uint64
	// Accepted new flows.
	Accepted uint64
	// Oversized packets dropped (larger than 64 KiB).
	Oversized uint64
	// LinkUnsupported counts packets the TUN handed over that the link drops
	// unread: a virtio-net header asking for an offload it did not offer (a
	// GSO type other than TCP's), or a packet longer than 64 KiB.
	LinkUnsupported uint64
	// LinkQueueReads counts the packets each queue of a multi-queue TUN
	// handed over, by queue (nil for other links).
	LinkQueueReads []uint64
	// TCPInFlight is the number of TCP handshakes waiting for the handler;
	// InFlightLimited counts SYNs dropped by the global or per-client limit.
	TCPInFlight     int
	InFlightLimited uint64
	// HandlerPanics counts flow handler panics the stack recovered from.
	HandlerPanics uint64
	// FlowPanics counts translated flows ended (reset both ways) because
	// their TCP code panicked.
	FlowPanics uint64
	// TimerRTOFires and TimerAckFires count the wake-ups of translated
	// flows' timers: retransmission and window probes; held ACKs and looks
	// at a short window.
	TimerRTOFires, TimerAckFires uint64
	// HandshakesAborted counts handshakes aborted because the client did
	// not complete them within HandshakeTimeout (or at Close).
	HandshakesAborted uint64
	// ResetsAfterEntry counts the RSTs of TCP flows ended after their
	// conntrack entry had gone (flush, expiry) that the gate let out to the
	// client; SegmentsAfterEntry the client's segments of such flows it let
	// in, each of which gVisor answers with one more RST (reset.go).
	ResetsAfterEntry, SegmentsAfterEntry uint64
	// StrayResets counts the RSTs the gate sent for client segments of no
	// flow (Options.StrayResets).
	StrayResets uint64
	// SYNACKWaitsWritten counts the client segments the reader held back
	// until their flow's SYN-ACK write returned, SYNACKWaitsTimedOut those
	// it delivered when the wait's bound ran out first (synack.go).
	SYNACKWaitsWritten, SYNACKWaitsTimedOut uint64
	// AcksSuperseded, AcksExpired, AcksFlushed and AcksDropped count the
	// pure ACKs the link's gate held back, by how the hold ended: the flow's
	// next segment carried the acknowledgment, its time ran out, another
	// flow's data came, or the client's RST or the stack's close took it
	// (ackhold.go).
	AcksSuperseded, AcksExpired, AcksFlushed, AcksDropped uint64
}

// Stats returns a snapshot of the counters.
func (st *Stack) Stats() Stats {
	c := &st.counters
	st.mu.Lock()
	inflight := len(st.inFlight)
	st.mu.Unlock()
	var linkUnsupported uint64
	if st.link.unsupported != nil {
		linkUnsupported = st.link.unsupported.Load()
	}
	acks := &st.acks
	return Stats{
		PacketsIn: c.inbound.Load(), PacketsOut: c.outbound.Load(),
		InvalidIn: c.invalidIn.Load(), InvalidOut: c.invalidOut.Load(),
		Rejected: c.rejected.Load(), RejectRateLimited: c.rejectRateLimited.Load(),
		Dropped: c.dropped.Load(), TableFull: c.tableFull.Load(),
		Accepted: c.accepted.Load(), Oversized: c.oversized.Load(),
		LinkUnsupported: linkUnsupported, LinkQueueReads: st.link.queueReads(),
		TCPInFlight: inflight, InFlightLimited: c.inFlightLimited.Load(),
		HandlerPanics: c.handlerPanics.Load(), FlowPanics: c.flowPanics.Load(),
		TimerRTOFires: c.xlRTOFires.Load(), TimerAckFires: c.xlAckFires.Load(), HandshakesAborted: c.handshakesAborted.Load(),
		ResetsAfterEntry: c.resetsOut.Load(), SegmentsAfterEntry: c.resetsIn.Load(), StrayResets: c.strayResets.Load(),
		SYNACKWaitsWritten: st.synAcks.written.Load(), SYNACKWaitsTimedOut: st.synAcks.timedOut.Load(),
		AcksSuperseded: acks.superseded.Load(), AcksExpired: acks.expired.Load(),
		AcksFlushed: acks.flushed.Load(), AcksDropped: acks.dropped.Load(),
	}
}

// Close stops the stack: it cancels the requests' contexts, closes every
// endpoint (flows end with a RST), waits for the flow handlers to return,
// and closes the link. It is idempotent.
func (st *Stack) Close() {
	st.closeOnce.Do(func() {
		st.mu.Lock()
		st.closed = true
		var stuck []stack.TransportEndpointID
		for id := range st.inFlight {
			stuck = append(stuck, id)
		}
		st.mu.Unlock()
		st.cancel()
		// Handshakes waiting for a client's ACK would hold Close for as long
		// as gVisor retransmits: abort them.
		for _, id := range stuck {
			st.abortHandshake(id)
		}
		// Let the aborts land before the endpoints close: a handshake
		// whose endpoint is closed under it is never told, and its
		// handler would wait out gVisor's retransmissions.
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			st.mu.Lock()
			n := len(st.inFlight)
			st.mu.Unlock()
			if n == 0 {
				break
			}
		}
		if st.client != nil {
			st.client.Close()
		}
		if st.s != nil {
			st.s.Close()
		}
		st.handlers.Wait()
		if st.link.stopReads != nil {
			st.link.stopReads()
		}
		if st.s != nil {
			st.s.Wait()
		}
		if st.client != nil {
			st.client.Wait()
		}
		for _, g := range st.gates {
			g.closeOwn() // no UDP reply from the proxy reaches a closed link
		}
		st.acks.close() // nor a held ACK
		if st.pipe != nil {
			st.pipe.close()
		}
		if err := st.link.close(); err != nil {
			st.logger.Warn("closing the link", zap.String("link", st.link.name), zap.Error(err))
		}
		if st.s != nil {
			st.s.Destroy()
		}
		if st.client != nil {
			st.client.Destroy()
		}
	})
}

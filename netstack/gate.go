package netstack

// The gate: every packet between the link and gVisor passes here.
//
//  1. A packet from the link (client -> service) is read in place: the
//     Linux TUN hands over the bytes it read (DeliverBytes), and gVisor's
//     PacketBuffer is made of them only for a packet that goes on into
//     gVisor; a PacketBuffer of one view is read in place too, one of more
//     views copied into a pooled buffer first. A
//     fragment goes to the reassembler first, and a completed datagram goes
//     on in its place (defrag.go). The packet is classified by conntrack in
//     the Original direction, without verifying its checksums when the link
//     says the kernel vouched for them (tunlink_linux.go).
//  2. INVALID: dropped and counted; gVisor never sees it (it would answer a
//     stray ACK with a RST). For a while after a start that followed a
//     crashed proxy, a segment of no flow is answered with a RST instead
//     (Options.StrayResets), so that the crashed proxy's clients are not
//     left to hang. Packets conntrack tracks no flow for (ICMP echo,
//     other protocols) are dropped too, but counted by conntrack apart from
//     INVALID.
//  3. NEW: the admission function decides. Reject: an ICMP or ICMPv6 port
//     unreachable quoting the packet goes back to the link (rate-limited) and
//     the packet is dropped. Drop: dropped silently. Accept: the entry is
//     confirmed (a full table refuses the flow, counted) and the packet goes
//     on.
//  4. ESTABLISHED and RELATED packets go on into gVisor, but for datagrams
//     of UDP flows whose handler registered a bypass (bypass.go); a TCP
//     segment of a flow whose SYN-ACK is being written waits for that write
//     first (synack.go), and the link's gate notes the client's lone
//     segments for the held ACK (ackhold.go).
//  5. Packets gVisor writes to the link, and the UDP replies the gate builds
//     (udpreply.go), are classified in the Reply direction; INVALID ones are
//     dropped and counted, the rest are written, but for a pure ACK that
//     the link's gate holds for the flow's next segment to carry
//     (ackhold.go). The RST of a flow ended
//     after its entry went is let through, and so is the client's answer to
//     it (reset.go).

import (
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// Decision is the admission function's answer for a new flow.
type Decision uint8

const (
	// Accept lets the flow in: the forwarders will hand it to the flow
	// handler.
	Accept Decision = iota
	// Reject refuses the flow with an ICMP port unreachable, as iptables'
	// REJECT does (no service port, or no usable endpoints).
	Reject
	// Drop discards the packet silently, as iptables' DROP does
	// (internalTrafficPolicy Local without local endpoints).
	Drop
)

// AdmitFunc decides a new flow from its Original-direction tuple (client ->
// service). It is called on the packet path, concurrently: it must be quick
// and must not block.
type AdmitFunc func(flow conntrack.Tuple) Decision

// maxPacket is the largest packet the gate accepts, and the size of the
// buffers it copies packets (or their headers) into to classify them: the
// IPv4 and IPv6 (without jumbograms) maximum.
const maxPacket = 65535 + 40

// packetPool holds buffers of maxPacket bytes for classification.
var packetPool = sync.Pool{New: func() any { b := make([]byte, maxPacket); return &b }}

// gateCounters are shared by the gates of one Stack.
type gateCounters struct {
	inbound, outbound  atomic.Uint64
	invalidIn          atomic.Uint64
	invalidOut         atomic.Uint64
	rejected           atomic.Uint64
	rejectRateLimited  atomic.Uint64
	dropped            atomic.Uint64
	tableFull          atomic.Uint64
	oversized          atomic.Uint64
	accepted           atomic.Uint64
	outboundWriteError atomic.Uint64
	inFlightLimited    atomic.Uint64
	handlerPanics      atomic.Uint64
	flowPanics         atomic.Uint64 // translated flows ended by a panic in their TCP
	xlRTOFires         atomic.Uint64 // translated flows' retransmission and persist timers fired
	xlAckFires         atomic.Uint64 // translated flows' ACK timers fired
	handshakesAborted  atomic.Uint64
	resetsOut          atomic.Uint64 // RSTs of flows whose entry was gone
	resetsIn           atomic.Uint64 // client segments of such flows, for gVisor to answer
	strayResets        atomic.Uint64 // RSTs for client segments of no flow (Options.StrayResets)
}

// gate wraps a link endpoint; see the flow comment at the top of the file.
type gate struct {
	nested.Endpoint
	child    stack.LinkEndpoint
	ct       *conntrack.Table
	admit    func() AdmitFunc
	rejecter *rejecter
	counters *gateCounters
	bypass   *udpBypass
	resets   *resetting
	synAcks  *synAckWrites
	xl       *translator // the link's gate, when the stack translates TCP (translate.go)
	// strayUntil: until then a client's segment of no flow is answered
	// with a RST (Options.StrayResets); zero: never.
	strayUntil time.Time
	acks       *ackHolder             // the link's gate only (ackhold.go)
	defrag     *conntrack.Reassembler // set by the Stack before the NIC is created
	// bytesOut is child as a bytesWriter, if it is one (the Linux TUN):
	// writeOwnBytes writes through it.
	bytesOut bytesWriter
	// segmentOut is child as a segmentWriter that offloads, if it is one.
	segmentOut segmentWriter

	// own guards the writes that come from outside gVisor (UDP replies,
	// udpreply.go) against the link's closing: Stack.Close sets closed
	// under it before it closes the link.
	own struct {
		sync.RWMutex
		closed bool
	}
}

var _ stack.LinkEndpoint = (*gate)(nil)
var _ stack.NetworkDispatcher = (*gate)(nil)
var _ bytesDispatcher = (*gate)(nil)

func newGate(child stack.LinkEndpoint, ct *conntrack.Table, admit func() AdmitFunc, rej *rejecter, c *gateCounters, bp *udpBypass, rs *resetting) *gate {
	g := &gate{child: child, ct: ct, admit: admit, rejecter: rej, counters: c, bypass: bp, resets: rs}
	g.bytesOut, _ = child.(bytesWriter)
	if sw, ok := child.(segmentWriter); ok && sw.Offloads() {
		g.segmentOut = sw
	}
	g.Endpoint.Init(child, g)
	return g
}

// DeliverNetworkPacket receives a packet from the link (steps 1-4).
func (g *gate) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if !g.fromLink(pkt.Size()) {
		return
	}
	// A packet just read from a TUN is one view: classify it in place.
	var b []byte
	if vl, off := pkt.AsViewList(); vl.Front() != nil && vl.Front().Next() == nil {
		b = vl.Front().AsSlice()[off:]
	} else {
		bp := packetPool.Get().(*[]byte)
		defer packetPool.Put(bp)
		b = appendPacket((*bp)[:0], pkt)
	}
	// The link marks the packets whose checksums the kernel vouched for
	// (tunlink_linux.go); the NIC marks every packet again for gVisor after
	// the gate, so the mark means nothing else here.
	g.deliver(proto, pkt, b, pkt.RXChecksumValidated)
}

// DeliverBytes implements bytesDispatcher: a packet the link read into b,
// before any PacketBuffer was made for it. One is made only if the packet
// goes on into gVisor: a datagram the UDP bypass takes, or a packet the
// gate drops or answers itself, costs no PacketBuffer and no copy.
// trusted says the kernel vouched for the packet's checksums.
func (g *gate) DeliverBytes(proto tcpip.NetworkProtocolNumber, b []byte, trusted bool) {
	if g.fromLink(len(b)) {
		g.deliver(proto, nil, b, trusted)
	}
}

// fromLink counts a packet of size bytes from the link, and reports
// whether it may go on: one over maxPacket is dropped and counted.
func (g *gate) fromLink(size int) bool {
	g.counters.inbound.Add(1)
	if size > maxPacket {
		g.counters.oversized.Add(1)
		return false
	}
	return true
}

// deliver classifies the packet b and passes it on, dropping or answering
// it instead where conntrack and admission say so. pkt holds b, or is nil
// until gVisor is to get the packet (toStack).
func (g *gate) deliver(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer, b []byte, trusted bool) {
	if conntrack.IsFragment(b) {
		var release func()
		if pkt, b, release = g.reassemble(proto, pkt, b); b == nil {
			return // held or dropped
		}
		defer release()
		trusted = false // no device vouches for a datagram put together here
	}
	if g.resets.passIn(b) {
		g.counters.resetsIn.Add(1)
		g.toStack(proto, pkt, b, trusted)
		return
	}
	var res conntrack.Result
	if trusted {
		res = g.ct.ClassifyTrusted(b, conntrack.Original)
	} else {
		res = g.ct.Classify(b, conntrack.Original)
	}
	switch res.Verdict {
	case conntrack.Invalid:
		if !res.Reason.Unsupported() { // those are counted by conntrack, by protocol
			g.counters.invalidIn.Add(1)
		}
		if res.Reason == conntrack.ReasonNoEntryNotSYN && !g.strayUntil.IsZero() {
			g.resetStray(proto, b)
		}
		return
	case conntrack.New:
		switch g.admit()(res.Tuple) {
		case Reject:
			g.counters.rejected.Add(1)
			g.reject(proto, b)
			return
		case Drop:
			g.counters.dropped.Add(1)
			return
		}
		if err := g.ct.Confirm(&res); err != nil {
			g.counters.tableFull.Add(1)
			return
		}
		if res.Verdict == conntrack.Invalid {
			g.counters.invalidIn.Add(1)
			return
		}
		g.counters.accepted.Add(1)
		if g.xl != nil && res.Tuple.Proto() == conntrack.TCP && g.xl.syn(g, res.Tuple, proto, b) {
			return
		}
	case conntrack.Established:
		if res.Tuple.Proto() == conntrack.UDP && g.bypass.take(res.Tuple, b) {
			return
		}
		if g.xl != nil && res.Tuple.Proto() == conntrack.TCP {
			if t, ok := g.xl.lookup(res.Tuple); ok {
				if t != nil {
					t.input(b)
				}
				return // a request's retransmitted SYN, or an ended flow's late segment
			}
		}
		if res.Tuple.Proto() == conntrack.TCP && g.synAcks != nil {
			g.synAcks.wait(res.Tuple) // synack.go
		}
		if res.Tuple.Proto() == conntrack.TCP && g.acks != nil {
			g.acks.in(res.Tuple, b, res.LoneSegment()) // ackhold.go
		}
	}
	g.toStack(proto, pkt, b, trusted)
}

// toStack hands the packet to gVisor, making its PacketBuffer from b first
// if it has none yet (DeliverBytes).
func (g *gate) toStack(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer, b []byte, trusted bool) {
	if pkt == nil {
		pkt = newInboundPacket(b, proto)
		pkt.RXChecksumValidated = trusted
		defer pkt.DecRef()
	}
	g.Endpoint.DeliverNetworkPacket(proto, pkt)
}

// splitPayload is the smallest TCP payload whose segment newInboundPacket
// makes of two views.
const splitPayload = 4096

// newInboundPacket is newPacket for a packet from the link, b. A TCP segment
// with a payload of splitPayload or more gets its IP and TCP headers in a
// chunk of their own: gVisor's IPv4 and IPv6 HandlePacket read the network
// header again (pkt.NetworkHeader().Slice(), after the PREROUTING hook)
// while they still hold a view of it, and PullUp copies a shared chunk
// before it hands out a slice of it; with the headers apart, what it copies
// is their chunk, not the 64 KiB of a super-packet (BENCHMARKS.md).
func newInboundPacket(b []byte, proto tcpip.NetworkProtocolNumber) *stack.PacketBuffer {
	h := tcpHeadersLen(b)
	if h == 0 || len(b)-h < splitPayload {
		return newPacket(b, proto)
	}
	buf, payload := buffer.MakeWithData(b[:h]), buffer.MakeWithData(b[h:])
	buf.Merge(&payload) // its views as they are (Append would fill the headers' chunk with payload)
	return packetOf(buf, proto)
}

// tcpHeadersLen returns the length of the IP and TCP headers of b, a TCP
// segment in IPv4 or in IPv6 without extension headers, or 0 for any other
// packet or one whose headers do not fit it.
func tcpHeadersLen(b []byte) int {
	var ip int
	switch {
	case len(b) >= header.IPv4MinimumSize && b[0]>>4 == 4 && b[9] == uint8(header.TCPProtocolNumber):
		ip = int(b[0]&0x0f) * 4
	case len(b) >= header.IPv6MinimumSize && b[0]>>4 == 6 && b[6] == uint8(header.TCPProtocolNumber):
		ip = header.IPv6MinimumSize
	default:
		return 0
	}
	if ip < header.IPv4MinimumSize || len(b) < ip+header.TCPMinimumSize {
		return 0
	}
	h := ip + int(b[ip+12]>>4)*4
	if h < ip+header.TCPMinimumSize || h > len(b) {
		return 0
	}
	return h
}

// reject writes an ICMP port unreachable for the packet b to the link,
// bypassing classification (it belongs to no flow).
func (g *gate) reject(proto tcpip.NetworkProtocolNumber, b []byte) {
	if !g.rejecter.allow() {
		g.counters.rejectRateLimited.Add(1)
		return
	}
	reply := buildPortUnreachable(b)
	if reply == nil {
		return
	}
	pb := newPacket(reply, proto)
	var pl stack.PacketBufferList
	pl.PushBack(pb)
	if _, err := g.child.WritePackets(pl); err != nil {
		g.counters.outboundWriteError.Add(1)
	}
	pl.DecRef()
}

// resetStray answers the client's segment b of no flow with a RST while
// the stack's StrayResets window lasts, within the ICMP errors' rate
// limit; it bypasses classification (the RST belongs to no flow).
func (g *gate) resetStray(proto tcpip.NetworkProtocolNumber, b []byte) {
	if g.rejecter.now().After(g.strayUntil) {
		return
	}
	rst := buildStrayRST(b)
	if rst == nil {
		return
	}
	if !g.rejecter.allow() {
		g.counters.rejectRateLimited.Add(1)
		return
	}
	pb := newPacket(rst, proto)
	var pl stack.PacketBufferList
	pl.PushBack(pb)
	if _, err := g.child.WritePackets(pl); err != nil {
		g.counters.outboundWriteError.Add(1)
	} else {
		g.counters.strayResets.Add(1)
	}
	pl.DecRef()
}

// WritePackets classifies the stack's packets in the Reply direction and
// writes the valid ones to the link (step 5). Dropped packets count as
// written: to gVisor the link took them.
func (g *gate) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := pkts.Len()
	g.counters.outbound.Add(uint64(n))
	bp := packetPool.Get().(*[]byte)
	defer packetPool.Put(bp)
	var drop []bool
	for i, pkt := range pkts.AsSlice() {
		if pkt.Size() > len(*bp) {
			g.counters.oversized.Add(1)
			drop = markDrop(drop, n, i)
			continue
		}
		b := appendHead((*bp)[:0], pkt)
		if t, ok := g.resets.passOut(b); ok {
			g.counters.resetsOut.Add(1)
			if g.acks != nil {
				g.acks.resetOut(t) // ackhold.go
			}
			continue
		}
		res, ok := g.classifyOut(b, pkt.Size())
		if !ok {
			drop = markDrop(drop, n, i)
			continue
		}
		if g.synAcks != nil && res.Tuple.Proto() == conntrack.TCP && isSynAck(b) {
			defer g.synAcks.begin(res.Tuple)() // synack.go
		}
		if g.acks != nil && res.Tuple.Proto() == conntrack.TCP && g.acks.out(res.Tuple, b, pkt, n == 1 && res.Verdict == conntrack.Established) {
			drop = markDrop(drop, n, i) // held (ackhold.go)
			continue
		}
	}
	if drop == nil {
		return g.child.WritePackets(pkts)
	}
	var keep stack.PacketBufferList
	for i, pkt := range pkts.AsSlice() {
		if !drop[i] {
			keep.PushBack(pkt)
		}
	}
	if keep.Len() == 0 {
		return n, nil
	}
	if _, err := g.child.WritePackets(keep); err != nil {
		return 0, err
	}
	return n, nil
}

// appendHead appends to b what the gate classifies of pkt, a packet on its
// way out: a TCP segment's IP and TCP headers alone when gVisor set them,
// else the whole packet. conntrack only counts the payload
// (conntrack.ClassifyHead; outbound checksums are not verified), and a
// download's segments carry up to 64 KiB of it each.
func appendHead(b []byte, pkt *stack.PacketBuffer) []byte {
	if pkt.TransportProtocolNumber == header.TCPProtocolNumber {
		nh, th := pkt.NetworkHeader().Slice(), pkt.TransportHeader().Slice()
		// Not a full check (IPv6's header is 40 bytes): what is set at all
		// is gVisor's whole header, which conntrack then parses.
		if len(nh) >= header.IPv4MinimumSize && len(th) >= header.TCPMinimumSize {
			return append(append(b, nh...), th...)
		}
	}
	return appendPacket(b, pkt)
}

func markDrop(drop []bool, n, i int) []bool {
	if drop == nil {
		drop = make([]bool, n)
	}
	drop[i] = true
	return drop
}

// writeOwn is WritePackets for packets that do not come from gVisor, which
// Stack.Close does not wait for: it fails with ErrClosedForSend once the
// stack is closing, instead of writing to a link being closed.
func (g *gate) writeOwn(pkts stack.PacketBufferList) (int, tcpip.Error) {
	g.own.RLock()
	defer g.own.RUnlock()
	if g.own.closed {
		return 0, &tcpip.ErrClosedForSend{}
	}
	return g.WritePackets(pkts)
}

// writeOwnBytes is writeOwn for a packet the gate built whole in b (a UDP
// reply, a translated flow's segment), written through bytesOut (which must
// be set) without a PacketBuffer. It does what WritePackets does for such a
// packet: counted, a RST after its flow's entry let out (reset.go), else
// classified in the Reply direction, dropped and counted if INVALID, else
// written. What WritePackets does besides is for gVisor's own TCP segments,
// and the size check is the caller's (b fits the MTU).
func (g *gate) writeOwnBytes(b []byte) tcpip.Error {
	g.own.RLock()
	defer g.own.RUnlock()
	if g.own.closed {
		return &tcpip.ErrClosedForSend{}
	}
	g.counters.outbound.Add(1)
	if _, ok := g.resets.passOut(b); ok {
		g.counters.resetsOut.Add(1)
		return g.bytesOut.WriteBytes(b)
	}
	if _, ok := g.classifyOut(b, len(b)); !ok {
		return nil // dropped, as WritePackets reports a dropped packet
	}
	return g.bytesOut.WriteBytes(b)
}

// writeOwnSegment is writeOwn for a TCP segment the translator built whole
// in b (translate.go): through bytesOut where the link has it, else in a
// PacketBuffer. Failures are counted as the link's write errors.
func (g *gate) writeOwnSegment(b []byte, proto tcpip.NetworkProtocolNumber) {
	var err tcpip.Error
	if g.bytesOut != nil {
		err = g.writeOwnBytes(b)
	} else {
		pkt := newPacket(b, proto)
		var pl stack.PacketBufferList
		pl.PushBack(pkt)
		_, err = g.writeOwn(pl)
		pl.DecRef()
	}
	if err != nil {
		g.counters.outboundWriteError.Add(1)
	}
}

// writeOwnPartial is writeOwnSegment for a segment whose checksum the
// kernel completes, cut at mss where longer: only through a link that
// offloads (segmentOut, which the caller checked).
func (g *gate) writeOwnPartial(b []byte, v6 bool, ipLen, hdrLen, mss int) {
	g.own.RLock()
	defer g.own.RUnlock()
	if g.own.closed {
		return
	}
	g.counters.outbound.Add(1)
	if _, ok := g.classifyOut(b, len(b)); !ok {
		return
	}
	if g.segmentOut.WriteSegment(b, v6, ipLen, hdrLen, mss) != nil {
		g.counters.outboundWriteError.Add(1)
	}
}

// classifyOut classifies a packet on its way out from head (its headers, or
// all of it) and its size, and reports false, counted, for an INVALID one,
// which is to be dropped.
func (g *gate) classifyOut(head []byte, size int) (conntrack.Result, bool) {
	res := g.ct.ClassifyHead(head, size, conntrack.Reply)
	if res.Verdict != conntrack.Invalid {
		return res, true
	}
	if !res.Reason.Unsupported() { // counted by conntrack, by protocol
		g.counters.invalidOut.Add(1)
	}
	return res, false
}

// closeOwn makes later writeOwn calls fail, after those in progress.
func (g *gate) closeOwn() {
	g.own.Lock()
	g.own.closed = true
	g.own.Unlock()
}

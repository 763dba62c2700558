package netstack

// The link's part in a handover (package handover): the old process stops
// its TUN readers without closing the queues (PauseReads), hands the
// queues' descriptors over (QueueFDs), and reads again if the handover
// fails (ResumeReads); the new process opens a link on the descriptors it
// received (AdoptTUN), the device, its routes and the packets queued in
// it meanwhile as they were.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/translate"
)

// ErrNotPausable is a link whose readers cannot stop and start again: not
// a TUN device opened by OpenTUN's queues (the portable path, memory links).
var ErrNotPausable = errors.New("netstack: the link cannot hand its queues over")

// PauseReads stops the link's readers and waits for them: packets stay
// queued in the device until ResumeReads, or until the next process reads
// them. Writes go on.
func (l *Link) PauseReads() error {
	ep, ok := l.ep.(*tunEndpoint)
	if !ok {
		return ErrNotPausable
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed.Load() || ep.paused {
		return nil
	}
	ep.paused = true
	for _, q := range ep.queues {
		_ = q.f.SetReadDeadline(time.Unix(1, 0))
	}
	ep.readers.Wait()
	return nil
}

// ResumeReads starts the readers PauseReads stopped.
func (l *Link) ResumeReads() {
	ep, ok := l.ep.(*tunEndpoint)
	if !ok {
		return
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if !ep.paused || ep.closed.Load() {
		return
	}
	ep.paused = false
	for i, q := range ep.queues {
		_ = q.f.SetReadDeadline(time.Time{})
		ep.readers.Add(1)
		go ep.read(q, &ep.reads[i].n)
	}
}

// QueueFDs returns the descriptors of the device's queues, in order, for
// the next process; they stay this link's (and open) until it closes.
func (l *Link) QueueFDs() ([]int, error) {
	ep, ok := l.ep.(*tunEndpoint)
	if !ok {
		return nil, ErrNotPausable
	}
	fds := make([]int, len(ep.queues))
	for i, q := range ep.queues {
		fds[i] = q.fd
	}
	return fds, nil
}

// AdoptTUN makes a link of device name's queues, received from the
// process that read them before (with virtio-net headers when vnet, as
// that process opened them). The link owns the files from here on. Its
// readers start paused: ResumeReads starts them once the stack has its
// flow handler and the flows handed over (a packet read before would meet
// a stack that does not know them).
func AdoptTUN(name string, files []*os.File, mtu uint32, vnet bool) (*Link, error) {
	if len(files) == 0 {
		return nil, fmt.Errorf("netstack: adopting TUN device %q: no queues", name)
	}
	queues := make([]tunQueue, len(files))
	for i, f := range files {
		// The descriptor is read through the runtime's poller, as OpenTUN's
		// are: it is non-blocking already (the open file's flags came with
		// it), and File.Fd would make it blocking, so the raw number is
		// taken through Control.
		rc, err := f.SyscallConn()
		if err != nil {
			return nil, fmt.Errorf("netstack: adopting TUN device %q: %w", name, err)
		}
		var fd int
		if err := rc.Control(func(raw uintptr) { fd = int(raw) }); err != nil {
			return nil, fmt.Errorf("netstack: adopting TUN device %q: %w", name, err)
		}
		queues[i] = tunQueue{f: f, fd: fd}
	}
	ep := newTUNEndpoint(queues, mtu, vnet)
	ep.paused = true
	return tunLink(ep, name), nil
}

// Detach hands the flow to the next process: it stops, its timers with it,
// and its owner's wait for reads ends (wake); the owner then waits for
// Attached, and neither closes nor resets the socket, which the next
// process holds too. The flow's state is returned for the snapshot.
func (t *TranslatedFlow) Detach() (MovedTCP, error) {
	m, err := t.f.Detach()
	if err != nil {
		return m, err
	}
	ch := make(chan struct{})
	t.attached.Store(&ch)
	t.syncTimers()
	t.wake()
	return m, nil
}

// Reattach starts a detached flow: again, when the handover failed, or
// for the first time here, once the process it came from has committed
// (AdoptTranslated). An ACK with the window the socket allows goes out,
// then what the socket holds.
func (t *TranslatedFlow) Reattach() {
	defer t.contain()
	t.f.Reattach()
	if ch := t.attached.Swap(nil); ch != nil {
		close(*ch)
	}
	t.f.Resume()
	if t.syncTimers().Closed {
		t.wake()
	}
}

// Detached reports whether the flow was handed over, with the channel
// Reattach closes, for the owner to wait on.
func (t *TranslatedFlow) Detached() (bool, <-chan struct{}) {
	if ch := t.attached.Load(); ch != nil {
		return true, *ch
	}
	return false, nil
}

// Context is done when the stack closes: an owner of a detached flow
// stops waiting then.
func (t *TranslatedFlow) Context() context.Context { return t.r.x.st.ctx }

// AdoptTranslated registers a translated flow that the previous process
// carried (translate.Restore's state m, around sock) under its tuple, so
// that the client's next segments find it; its owner then runs it as
// Accept's (Readable, Writable, Forget). The flow's conntrack entry must be
// restored first. own runs the flow, on a goroutine the stack's Close
// waits for, as a handler's. The flow starts detached: it sends nothing,
// reads nothing and takes no segment until Reattach, which the caller
// makes once the process it came from has committed to the handover.
func (st *Stack) AdoptTranslated(tuple conntrack.Tuple, m MovedTCP, sock EndpointSocket, wake func(), waitWritable func(then func()), bytes *[2]atomic.Uint64, own func(*TranslatedFlow)) (*TranslatedFlow, error) {
	x := &st.xl
	g := st.gates[linkNIC]
	if x.st == nil || g == nil {
		return nil, errors.New("netstack: the stack does not translate TCP")
	}
	proto := header.IPv4ProtocolNumber
	if tuple.Is6() {
		proto = header.IPv6ProtocolNumber
	}
	e := &xlEntry{}
	r := &TranslateRequest{x: x, g: g, tuple: tuple, proto: proto, client: tuple.Src(), svc: tuple.Dst(), e: e, at: st.now()}
	r.released.Store(true) // no handshake, no in-flight slot
	r.once.Do(func() {})   // answered long ago
	w := r.writer()
	t := &TranslatedFlow{r: r, wake: wake, waitWritable: waitWritable}
	var partial func([]byte, int, int)
	if g.segmentOut != nil {
		v6 := proto == header.IPv6ProtocolNumber
		partial = func(p []byte, hdrLen, mss int) { g.writeOwnPartial(p, v6, w.IPLen(), hdrLen, mss) }
	}
	acks := &st.acks
	mss := int(g.MTU()) - w.IPLen() - header.TCPMinimumSize
	f, err := translate.Restore(translate.Config{
		Sock: sock, Writer: w, Emit: func(p []byte) { g.writeOwnSegment(p, proto) }, EmitPartial: partial,
		Held:  &translate.HeldCounts{Superseded: &acks.superseded, Expired: &acks.expired, Dropped: &acks.dropped},
		Bytes: bytes, Now: time.Now, KeptBudget: &x.kept, LinkMSS: uint16(min(mss, 0xffff)),
		HSDeadline: st.now().Add(st.hsTimeout), HSAborted: &st.counters.handshakesAborted,
	}, m)
	if err != nil {
		return nil, err
	}
	if _, err := f.Detach(); err != nil {
		return nil, err
	}
	ch := make(chan struct{})
	t.attached.Store(&ch)
	t.f = f
	t.timer = time.AfterFunc(time.Hour, t.onRTO)
	t.timer.Stop()
	t.ack = time.AfterFunc(time.Hour, t.flushAck)
	t.ack.Stop()
	e.flow.Store(t)
	if _, loaded := x.flows.LoadOrStore(tuple, e); loaded {
		return nil, fmt.Errorf("netstack: adopting %v: the tuple has a flow already", tuple)
	}
	x.n.Add(1)
	wake() // the owner waits for Reattach
	st.handlers.Add(1)
	go func() { defer st.handlers.Done(); own(t) }()
	return t, nil
}

// HandOffHandshakes answers, for a handover, every SYN the translator
// holds whose endpoint dial is still running: each is dropped here (its
// handler's Accept then returns nil, its Refuse does nothing) and its
// bytes returned, for the next process to read as if from the TUN
// (DeliverInbound). The TUN's readers must be paused first.
func (st *Stack) HandOffHandshakes() [][]byte {
	var out [][]byte
	st.xl.flows.Range(func(_, v any) bool {
		e := v.(*xlEntry)
		r := e.req
		if r == nil || e.flow.Load() != nil {
			return true
		}
		r.once.Do(func() {
			r.release()
			r.unregister()
			// Its entry goes: if the handover fails, the client's next SYN
			// is NEW again here and comes back to the translator.
			r.g.ct.DeleteFlow(r.tuple, nil)
			if p, ok := withTCPChecksum(r.raw); ok {
				out = append(out, p)
			}
		})
		return true
	})
	return out
}

// DeliverInbound takes packets as if the link had read them: SYNs the
// previous process handed over (HandOffHandshakes).
func (st *Stack) DeliverInbound(pkts [][]byte) {
	g := st.gates[linkNIC]
	for _, p := range pkts {
		if proto, ok := ipProtocol(p); ok {
			g.DeliverBytes(proto, p, false)
		}
	}
}

// ResetMoved sends the client of a flow handed over that this process
// could not adopt a RST at the flow's sequence numbers, so that it sees a
// reset rather than silence (its entry is gone: the RST passes as a
// closing flow's does, reset.go).
func (st *Stack) ResetMoved(tuple conntrack.Tuple, m MovedTCP) {
	g := st.gates[linkNIC]
	if g == nil {
		return
	}
	proto := header.IPv4ProtocolNumber
	if tuple.Is6() {
		proto = header.IPv6ProtocolNumber
	}
	st.resets.mark(tuple)
	w := translate.NewWriter(tuple.Dst(), tuple.Src())
	buf := make([]byte, w.IPLen()+header.TCPMinimumSize)
	n := w.Build(buf, m.SndMax, m.RcvNxt, tcpRST|tcpACK, 0, nil, nil)
	g.writeOwnSegment(buf[:n], proto)
}

// withTCPChecksum returns a copy of the IP packet p with its TCP checksum
// complete: a packet read with offloads may carry a partial one (the
// kernel's NEEDS_CSUM), which the next process, reading it untrusted,
// would drop. It reports false for what is not a plain TCP packet.
func withTCPChecksum(p []byte) ([]byte, bool) {
	p = bytes.Clone(p)
	var tcp header.TCP
	var src, dst tcpip.Address
	switch {
	case len(p) >= header.IPv4MinimumSize && p[0]>>4 == 4:
		ip := header.IPv4(p)
		hl, total := int(ip.HeaderLength()), int(ip.TotalLength())
		if ip.Protocol() != uint8(header.TCPProtocolNumber) || hl < header.IPv4MinimumSize || total > len(p) || total < hl+header.TCPMinimumSize {
			return nil, false
		}
		tcp, src, dst = header.TCP(p[hl:total]), ip.SourceAddress(), ip.DestinationAddress()
	case len(p) >= header.IPv6MinimumSize && p[0]>>4 == 6:
		ip := header.IPv6(p)
		total := header.IPv6MinimumSize + int(ip.PayloadLength())
		if ip.NextHeader() != uint8(header.TCPProtocolNumber) || total > len(p) || total < header.IPv6MinimumSize+header.TCPMinimumSize {
			return nil, false
		}
		tcp, src, dst = header.TCP(p[header.IPv6MinimumSize:total]), ip.SourceAddress(), ip.DestinationAddress()
	default:
		return nil, false
	}
	tcp.SetChecksum(0)
	tcp.SetChecksum(^tcp.CalculateChecksum(header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, uint16(len(tcp)))))
	return p, true
}

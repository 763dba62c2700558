package netstack

// New flows, from gVisor's forwarders to the flow handler:
//
//  1. TCP: a SYN for an unknown connection reaches admitSYN, which enforces
//     the in-flight bounds (global, and per client address) and passes it to
//     gVisor's TCP forwarder; the forwarder runs handleTCP on a new goroutine.
//  2. handleTCP wraps the request in a TCPRequest and calls the handler. The
//     handler dials the endpoint first, then calls Accept (completing the
//     client's handshake) or Refuse (RST). Whatever the handler does,
//     including panicking or returning early, the request is completed
//     exactly once: an uncompleted request is refused when the handler
//     returns.
//  3. UDP: the first datagram of a flow reaches handleUDP on the packet
//     path; it registers a connected endpoint for the flow (cheap, never
//     blocks) and starts the handler on its own goroutine.

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/userproxy/userproxy/conntrack"
)

// FlowHandler receives the flows the gate admitted. Its methods run on their
// own goroutines (one per flow) and may block for the life of the flow.
type FlowHandler interface {
	// HandleTCP must call exactly one of r.Accept, r.Refuse or r.Ignore;
	// if it returns without doing so, the stack refuses the connection.
	HandleTCP(r *TCPRequest)
	// HandleUDP owns r.Conn and must close it.
	HandleUDP(r *UDPRequest)
}

// TCPRequest is a client's connection attempt (its SYN), waiting for the
// handler's decision.
type TCPRequest struct {
	st     *Stack
	fr     *tcp.ForwarderRequest
	id     stack.TransportEndpointID
	client netip.AddrPort
	svc    netip.AddrPort
	once   sync.Once
}

// Client returns the client's address and port.
func (r *TCPRequest) Client() netip.AddrPort { return r.client }

// Service returns the address and port the client connected to.
func (r *TCPRequest) Service() netip.AddrPort { return r.svc }

// Tuple returns the flow's conntrack tuple (client -> service).
func (r *TCPRequest) Tuple() conntrack.Tuple {
	return conntrack.MakeTuple(conntrack.TCP, r.client, r.svc)
}

// Context is done when the stack closes; use it for the endpoint dial.
func (r *TCPRequest) Context() context.Context { return r.st.ctx }

// errCompleted is returned by Accept on a request already completed.
var errCompleted = errors.New("netstack: request already completed")

// Accept completes the client's handshake and returns the connection. It
// fails if the request was completed already or the handshake cannot be
// done (the client went away); the request is completed either way.
func (r *TCPRequest) Accept() (*TCPConn, error) {
	var (
		conn *TCPConn
		err  error = errCompleted
	)
	r.once.Do(func() {
		r.st.mu.Lock()
		pd := r.st.inFlight[r.id]
		aborted := pd != nil && pd.aborted
		if pd != nil && pd.elem == nil {
			pd.since = time.Now()
			pd.elem = r.st.handshakes.PushBack(r.id)
		}
		r.st.mu.Unlock()
		if aborted {
			// The handshake timed out while the endpoint was dialled:
			// answering now would hold the slot past the timeout.
			r.fr.Complete(true)
			r.st.release(r.id)
			err = errors.New("netstack: the handshake timed out before the endpoint answered")
			return
		}
		var wq waiter.Queue
		ep, terr := r.fr.CreateEndpoint(&wq)
		if terr != nil {
			r.fr.Complete(true)
			r.st.release(r.id)
			err = errors.New("netstack: completing the handshake: " + terr.String())
			return
		}
		r.fr.Complete(false)
		r.st.release(r.id)
		so := ep.SocketOptions()
		so.SetKeepAlive(true)
		conn, err = &TCPConn{TCPConn: gonet.NewTCPConn(&wq, ep), ep: ep, tuple: r.Tuple(), resets: &r.st.resets}, nil
	})
	return conn, err
}

// Refuse answers the SYN with a RST, as a closed port does.
func (r *TCPRequest) Refuse() { r.complete(true) }

// Ignore drops the SYN without an answer (the client will retry).
func (r *TCPRequest) Ignore() { r.complete(false) }

func (r *TCPRequest) complete(reset bool) {
	r.once.Do(func() {
		r.fr.Complete(reset)
		r.st.release(r.id)
	})
}

// TCPConn is an accepted client connection. Besides net.Conn it has
// CloseWrite and CloseRead (half-close) and Abort (close with a RST). Reads and
// writes on a connection the client reset fail with an error that matches
// syscall.ECONNRESET with errors.Is.
type TCPConn struct {
	*gonet.TCPConn
	ep     tcpip.Endpoint
	tuple  conntrack.Tuple
	resets *resetting
}

// Read reads from the client.
func (c *TCPConn) Read(b []byte) (int, error) {
	n, err := c.TCPConn.Read(b)
	return n, resetErr(err)
}

// Write writes to the client.
func (c *TCPConn) Write(b []byte) (int, error) {
	n, err := c.TCPConn.Write(b)
	return n, resetErr(err)
}

// Abort closes the connection with a RST (SO_LINGER 0). The RST reaches the
// client even when the flow's conntrack entry is already gone (reset.go).
func (c *TCPConn) Abort() error {
	c.ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true, Timeout: 0})
	c.resets.mark(c.tuple)
	return c.TCPConn.Close()
}

var resetText = (&tcpip.ErrConnectionReset{}).String()

// resetErr turns gonet's stringified "connection reset by peer" into an
// error wrapping syscall.ECONNRESET, so callers need no gVisor types.
func resetErr(err error) error {
	var op *net.OpError
	if err != nil && errors.As(err, &op) && op.Err != nil && op.Err.Error() == resetText {
		op.Err = syscall.ECONNRESET
	}
	return err
}

// UDPRequest is a new UDP flow: a connected socket that receives the
// client's datagrams and sends replies from the service address.
type UDPRequest struct {
	// Conn is connected to the client; its local address is the service
	// address. The handler owns it.
	Conn   net.Conn
	client netip.AddrPort
	svc    netip.AddrPort
	ctx    context.Context
	bypass *udpBypass
	ep     tcpip.Endpoint // the flow's gVisor endpoint, behind Conn
	wq     *waiter.Queue  // its waiter queue
	reply  bytes.Reader   // Reply's payload, reused
	out    *gate          // the gate of the NIC the flow came in on (udpreply.go)
	closed atomic.Bool    // Conn was closed
}

// Client returns the client's address and port.
func (r *UDPRequest) Client() netip.AddrPort { return r.client }

// Service returns the address and port the client sent to.
func (r *UDPRequest) Service() netip.AddrPort { return r.svc }

// Tuple returns the flow's conntrack tuple (client -> service).
func (r *UDPRequest) Tuple() conntrack.Tuple {
	return conntrack.MakeTuple(conntrack.UDP, r.client, r.svc)
}

// Context is done when the stack closes.
func (r *UDPRequest) Context() context.Context { return r.ctx }

func endpoints(id stack.TransportEndpointID) (client, svc netip.AddrPort) {
	return netip.AddrPortFrom(toAddr(id.RemoteAddress), id.RemotePort),
		netip.AddrPortFrom(toAddr(id.LocalAddress), id.LocalPort)
}

// admitSYN is the TCP protocol handler: it applies the in-flight bounds to
// new connection requests before gVisor's forwarder sees them (step 1).
func (st *Stack) admitSYN(id stack.TransportEndpointID, pkt *stack.PacketBuffer) bool {
	th := header.TCP(pkt.TransportHeader().Slice())
	if len(th) < header.TCPMinimumSize || th.Flags()&(header.TCPFlagSyn|header.TCPFlagAck) != header.TCPFlagSyn {
		return st.tcpFwd.HandlePacket(id, pkt)
	}
	client := toAddr(id.RemoteAddress)
	st.mu.Lock()
	if _, dup := st.inFlight[id]; dup {
		// A retransmitted SYN of a request the handler still holds. It is
		// not passed on: gVisor's forwarder may already have forgotten the
		// request (it does so in Complete, just before release runs here)
		// and would start a second handler for it.
		st.mu.Unlock()
		return true
	}
	if st.closed || len(st.inFlight) >= st.maxInFlight || st.perAddr[client] >= st.perClient {
		var victim stack.TransportEndpointID
		evict := !st.closed && len(st.inFlight) >= st.maxInFlight && st.oldestHandshake(&victim)
		st.mu.Unlock()
		st.counters.inFlightLimited.Add(1)
		if evict {
			// Full of handshakes that clients have not completed (a SYN
			// flood, typically from forged addresses): abort the one waiting
			// longest, as the kernel prunes its SYN queue, so that a real
			// client's retransmitted SYN finds room instead of waiting out
			// HandshakeTimeout.
			st.abortHandshake(victim)
		}
		return true // dropped: the client retransmits
	}
	pd := &pending{
		since:  time.Now(),
		rcvNxt: th.SequenceNumber() + 1,
		nic:    pkt.NICID,
		proto:  pkt.NetworkProtocolNumber,
	}
	pd.timer = time.AfterFunc(st.hsTimeout, func() { st.abortHandshake(id) })
	st.inFlight[id] = pd
	st.perAddr[client]++
	st.handlers.Add(1)
	st.mu.Unlock()
	if !st.tcpFwd.HandlePacket(id, pkt) {
		// Not taken (a bad checksum): undo.
		st.release(id)
		st.handlers.Done()
		return false
	}
	return true
}

// release returns a request's in-flight slot.
func (st *Stack) release(id stack.TransportEndpointID) {
	client := toAddr(id.RemoteAddress)
	st.mu.Lock()
	if pd, ok := st.inFlight[id]; ok {
		pd.timer.Stop()
		if pd.elem != nil {
			st.handshakes.Remove(pd.elem)
		}
		delete(st.inFlight, id)
		if st.perAddr[client]--; st.perAddr[client] <= 0 {
			delete(st.perAddr, client)
		}
	}
	st.mu.Unlock()
}

// pending is an in-flight handshake: what it takes to abort it.
type pending struct {
	since time.Time
	// elem is its place in Stack.handshakes once Accept sent the SYN-ACK
	// (only the client's ACK is missing); nil while the endpoint is dialled.
	elem    *list.Element
	aborted bool   // timed out or evicted: Accept refuses it
	rcvNxt  uint32 // the client's sequence number after its SYN
	nic     tcpip.NICID
	proto   tcpip.NetworkProtocolNumber
	timer   *time.Timer
}

// evictAge is how long a handshake must have waited for its client's ACK
// before a full in-flight table may evict it: a real client answers within a
// round trip, so only handshakes that will never complete are that old.
const evictAge = time.Second

// oldestHandshake finds the in-flight request that has waited longest (and
// at least evictAge) for its client's ACK. The caller holds st.mu.
//
// The handshakes are in the order their SYN-ACKs went: the first one not
// aborted already (an aborted one leaves at its release, soon after) is the
// oldest, without a scan of the table, which a SYN flood would make on
// every SYN it sends.
func (st *Stack) oldestHandshake(id *stack.TransportEndpointID) bool {
	cutoff := time.Now().Add(-evictAge)
	for e := st.handshakes.Front(); e != nil; e = e.Next() {
		k := e.Value.(stack.TransportEndpointID)
		pd := st.inFlight[k]
		if pd == nil || pd.aborted {
			continue
		}
		if !pd.since.Before(cutoff) {
			return false
		}
		*id = k
		return true
	}
	return false
}

// abortHandshake ends a handshake still in flight by delivering to gVisor,
// as if from the client, a RST at the sequence number it expects: the
// forwarder's CreateEndpoint then fails and the request completes, freeing
// its slot and the endpoint connection. The RST bypasses conntrack; the
// flow's entry expires on its own.
func (st *Stack) abortHandshake(id stack.TransportEndpointID) {
	st.mu.Lock()
	pd := st.inFlight[id]
	var dialling, again bool
	if pd != nil {
		dialling, again = pd.elem == nil, pd.aborted
		pd.aborted = true
	}
	st.mu.Unlock()
	if pd == nil || again { // the timer and an eviction may both come
		return
	}
	if dialling {
		// No SYN-ACK was sent yet: there is nothing for a RST to hit.
		// Accept refuses the request when the dial returns.
		st.counters.handshakesAborted.Add(1)
		return
	}
	g := st.gates[pd.nic]
	if g == nil {
		return
	}
	// The client's ACK may have arrived meanwhile: the gate saw it if the
	// flow's conntrack entry is ESTABLISHED; then the handshake completes
	// and must not be reset.
	client, svc := endpoints(id)
	if e, ok := st.ct.Get(conntrack.MakeTuple(conntrack.TCP, client, svc)); ok && e.State != conntrack.TCPSynSent && e.State != conntrack.TCPSynRecv && e.State != conntrack.TCPNone {
		return
	}
	rst := buildClientRST(id, pd.rcvNxt)
	if rst == nil {
		return
	}
	st.counters.handshakesAborted.Add(1)
	pb := newPacket(rst, pd.proto)
	g.Endpoint.DeliverNetworkPacket(pd.proto, pb)
	pb.DecRef()
}

// handleTCP runs on the goroutine gVisor's forwarder starts (step 2).
func (st *Stack) handleTCP(fr *tcp.ForwarderRequest) {
	defer st.handlers.Done()
	growStack(0)
	id := fr.ID()
	client, svc := endpoints(id)
	r := &TCPRequest{st: st, fr: fr, id: id, client: client, svc: svc}
	defer func() {
		if p := recover(); p != nil {
			st.counters.handlerPanics.Add(1)
			st.logger.Error("TCP flow handler panicked", zap.Any("panic", p),
				zap.Stringer("client", client), zap.Stringer("service", svc), zap.ByteString("stack", debug.Stack()))
		}
		r.Refuse() // a no-op when the handler completed the request
	}()
	h := st.flowHandler()
	if h == nil {
		return
	}
	h.HandleTCP(r)
}

// handleUDP is the UDP forwarder's handler, on the packet path (step 3).
func (st *Stack) handleUDP(fr *udp.ForwarderRequest) bool {
	h := st.flowHandler()
	st.mu.Lock()
	if st.closed || h == nil {
		st.mu.Unlock()
		return true // dropped
	}
	st.handlers.Add(1)
	st.mu.Unlock()
	wq := new(waiter.Queue)
	ep, err := fr.CreateEndpoint(wq)
	if err != nil {
		st.handlers.Done()
		st.logger.Debug("creating a UDP endpoint", zap.String("error", err.String()))
		return true
	}
	client, svc := endpoints(fr.ID())
	r := &UDPRequest{client: client, svc: svc, ctx: st.ctx, bypass: &st.bypass, ep: ep, wq: wq}
	if info, ok := ep.Info().(*stack.TransportEndpointInfo); ok {
		r.out = st.gates[info.BindNICID] // the forwarder bound the endpoint to the NIC the flow came in on
	}
	r.Conn = udpConn{Conn: gonet.NewUDPConn(wq, ep), closed: &r.closed}
	go st.runUDP(h, r)
	return true
}

func (st *Stack) runUDP(h FlowHandler, r *UDPRequest) { // UDP flow handler
	defer st.handlers.Done()
	defer func() {
		if p := recover(); p != nil {
			st.counters.handlerPanics.Add(1)
			st.logger.Error("UDP flow handler panicked", zap.Any("panic", p),
				zap.Stringer("client", r.client), zap.Stringer("service", r.svc), zap.ByteString("stack", debug.Stack()))
			_ = r.Conn.Close()
		}
	}()
	h.HandleUDP(r)
}

// handlerStack is the stack a TCP flow's handler goroutine grows to: the
// endpoint dial, then gVisor's half of the handshake with the gate and the
// TUN write below it, then the flow's endpoint -> client copier.
const handlerStack = 16 << 10

// growStack grows the calling goroutine's stack to handlerStack in one
// step while it holds few frames. A goroutine starts small; grown where it
// first runs deep (inside gVisor's handshake, before the SYN-ACK is
// written), the runtime copies the stack two or three times, each copy
// walking every frame on it (runtime.copystack: 4% of the connect cell's
// CPU, BENCHMARKS.md). The frame holds a little less than handlerStack, so
// that the runtime's doubling stops at it; the index keeps the array.
//
//go:noinline
func growStack(i int) byte {
	var pad [handlerStack - 4<<10]byte
	return pad[i%len(pad)]
}

package proxy

// UDP flows in a handover (handover.go). The old process:
//
//  1. detach: the flow's bypass is unregistered and its sender paused, so
//     that no client datagram reaches its socket any more; its socket
//     leaves the reply poller and a relay under way is waited for, so that
//     no reply is read from the socket or written to the client any more.
//     Its conntrack entry is saved then, and its socket's descriptor lent
//     to the handover: until reattach or forget nothing closes the socket
//     (its number must not be reused while it is on its way).
//  2. reattach, when the handover failed: the flow goes on as before, or,
//     if it ended meanwhile, its socket is closed now.
//  3. forget, once the next process has the flow: this process's
//     descriptor is closed, the flow leaves the live set, and its entry is
//     left to expire here (the next process has its copy).
//
// The new process (adoptUDP): the entry restored, the socket taken from
// its descriptor, the flow tracked and bound as HandleUDP's, but detached:
// StartAdopted attaches it (reattach) once the old process has committed.
// A flow whose replies a goroutine of its own relays (no poller: Run not
// running, or not Linux) does not move.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
)

// errNotMovable is detach's answer for a flow that ended, or whose
// replies the poller does not relay.
var errNotMovable = errors.New("proxy: the UDP flow cannot move")

var _ mover = (*udpFlow)(nil)

// detach implements mover (step 1).
func (u *udpFlow) detach(d *detaching) error {
	u.mu.Lock()
	if u.closed || u.detached || u.unpoll == nil || u.sender == nil {
		u.mu.Unlock()
		return errNotMovable
	}
	stopForward, unpoll := u.stopForward, u.unpoll
	u.stopForward, u.unpoll = nil, nil
	u.detached, u.lent = true, true
	u.mu.Unlock()
	stopForward()
	u.sender.pause(true) // waits for a datagram being sent
	unpoll()
	u.relayMu.Lock() // waits for a relay under way
	u.paused = true
	u.relayMu.Unlock()
	// Saved after the flow stopped: the entry has seen every datagram it
	// passed.
	saved, ok := u.p.ct.Save(u.flow.tuple)
	fd := -1
	err := u.rc.Control(func(raw uintptr) { fd = int(raw) })
	if !ok || err != nil {
		u.reattach() // an entry gone ends it as for any flow
		return fmt.Errorf("proxy: detaching UDP flow %v: entry saved %t: %w", u.flow.tuple, ok, errors.Join(err, errNotMovable))
	}
	d.UDP = append(d.UDP, MovedUDP{Entry: saved, Endpoint: u.flow.Endpoint, ServicePort: u.flow.ServicePort, ProxyProtocol: u.pp})
	d.udpFDs = append(d.udpFDs, fd)
	return nil
}

// reattach implements mover (step 2); StartAdopted starts an adopted flow
// with it too.
func (u *udpFlow) reattach() {
	u.mu.Lock()
	closed := u.closed
	u.detached, u.lent = false, false
	u.mu.Unlock()
	if closed { // ended while detached: finish left the socket to us
		_ = u.backend.Close()
		return
	}
	u.sender.pause(false)
	u.relayMu.Lock()
	u.paused = false
	u.relayMu.Unlock()
	if !u.attach(true) {
		u.finish(false) // no poller any more: nothing would relay its replies
	}
}

// forget implements mover (step 3).
func (u *udpFlow) forget() {
	u.mu.Lock()
	closed := u.closed
	u.closed, u.lent = true, false
	stopWatch := u.stopWatch
	u.mu.Unlock()
	_ = u.backend.Close() // this process's descriptor only: the next process holds its own
	if closed {
		return
	}
	if stopWatch != nil {
		stopWatch()
	}
	_ = u.r.Close()
	u.p.untrack(u.flow)
	u.p.udpSessions.Add(-1)
}

// adoptUDP takes one UDP flow the previous process handed over, with its
// endpoint socket in file, detached until StartAdopted. On failure the
// socket is closed and no entry is left.
func (p *Proxy) adoptUDP(st *netstack.Stack, m MovedUDP, file *os.File) error {
	c, err := net.FileConn(file)
	_ = file.Close() // c holds a descriptor of its own
	if err != nil {
		return fmt.Errorf("proxy: the endpoint socket: %w", err)
	}
	if !connectedTo(c, m.Endpoint) {
		_ = c.Close()
		return fmt.Errorf("proxy: the endpoint socket is not a UDP socket connected to %v", m.Endpoint)
	}
	tuple := m.Entry.Original
	if tuple.Proto() != conntrack.UDP {
		_ = c.Close()
		return fmt.Errorf("proxy: %v is not a UDP flow", tuple)
	}
	if p.udpSessions.Add(1) > int64(p.cfg.MaxUDPSessions) {
		p.udpSessions.Add(-1)
		_ = c.Close()
		return errors.New("proxy: the UDP session bound is reached")
	}
	if err := p.ct.Restore(m.Entry); err != nil {
		p.udpSessions.Add(-1)
		_ = c.Close()
		return err
	}
	r, err := st.AdoptUDP(tuple)
	if err != nil {
		p.udpSessions.Add(-1)
		p.ct.DeleteFlow(tuple, nil)
		_ = c.Close()
		return err
	}
	u := p.newUDPFlow(r, c, tuple, conntrack.Binding{Endpoint: m.Endpoint, ServicePort: m.ServicePort}, m.ProxyProtocol)
	u.sender = newUDPSender(c, &p.stats.bytes[0]) // a *net.UDPConn: never nil
	u.sender.prefix = p.udpPrefix(m.ProxyProtocol, tuple, m.ServicePort)
	u.rc = u.sender.rc
	u.sender.paused, u.paused, u.detached = true, true, true // until StartAdopted
	u.flow.count(p.adoptedPick(tuple, m.Endpoint, m.ServicePort))
	if !p.track(u.flow) {
		u.finish(false) // its entry goes with it
		return errors.New("proxy: the proxy is shutting down")
	}
	u.watch()
	p.adopted = append(p.adopted, u)
	return nil
}

// connectedTo reports whether c is a UDP socket connected to ep.
func connectedTo(c net.Conn, ep netip.AddrPort) bool {
	uc, ok := c.(*net.UDPConn)
	if !ok {
		return false
	}
	ra, ok := uc.RemoteAddr().(*net.UDPAddr)
	if !ok {
		return false
	}
	ap := ra.AddrPort()
	return ap.Addr().Unmap() == ep.Addr().Unmap() && ap.Port() == ep.Port()
}

// pollerOrWait returns Run's reply poller for u. Without one yet, and with
// wait, u waits for it (waiting): Run adds it as it starts (the flows a
// handover brought start before Run does).
func (p *Proxy) pollerOrWait(u *udpFlow, wait bool) (rp *replyPoller, waiting bool) {
	if rp := p.poller.Load(); rp != nil || !wait {
		return rp, false
	}
	p.pollMu.Lock()
	defer p.pollMu.Unlock()
	if rp := p.poller.Load(); rp != nil || p.pollerStarted {
		return rp, false
	}
	p.pollWait = append(p.pollWait, u)
	return nil, true
}

// startPoller makes rp Run's reply poller (nil: none could be made) and
// adds the flows that waited for it.
func (p *Proxy) startPoller(rp *replyPoller) {
	p.pollMu.Lock()
	if rp != nil {
		p.poller.Store(rp)
	}
	p.pollerStarted = true
	waiting := p.pollWait
	p.pollWait = nil
	p.pollMu.Unlock()
	for _, u := range waiting {
		u.pollLate(rp)
	}
}

// pollLate adds a flow that waited for the poller to rp; without one it
// ends: nothing would relay its replies.
func (u *udpFlow) pollLate(rp *replyPoller) {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return
	}
	if rp != nil {
		if remove, err := rp.add(u, u.rc); err == nil {
			u.unpoll = remove
			u.mu.Unlock()
			return
		}
	}
	u.mu.Unlock()
	u.finish(false)
}

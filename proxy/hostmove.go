package proxy

// Host TCP flows (NodePort connections: a client socket the proxy
// accepted, spliced to an endpoint socket it dialled) in a handover
// (handover.go). The old process:
//
//  1. detach: parking on, both sockets' deadlines set to now; each copier
//     stops in its read or write and reports the bytes it read and has not
//     written (tcp.go's parkAt), or has already returned at its source's
//     EOF. The flow's conntrack entry is saved, and both sockets'
//     descriptors lent to the handover with those bytes.
//  2. reattach, when the handover failed: deadlines cleared, the copiers go
//     on, the bytes they held first.
//  3. forget, once the next process has the flow: the copiers return
//     without a RST or a FIN, and the splice closes this process's
//     descriptors only (the next process holds its own).
//
// The new process (adoptHost) restores the entry and makes a splice of
// the two sockets, the held bytes written first, which StartAdopted
// starts once the old process has committed.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/userproxy/userproxy/conntrack"
)

// MovedHost is a host TCP flow on its way to the next process: its client
// and endpoint sockets travel beside it, after the UDP flows' sockets, two
// per flow, the client's first.
type MovedHost struct {
	Entry       conntrack.Saved
	Endpoint    netip.AddrPort
	ServicePort string
	// Pending is what each copier (0: client to endpoint, 1: endpoint to
	// client) had read and not written; EOF says a copier had reached its
	// source's end and half-closed its destination.
	Pending [2][]byte
	EOF     [2]bool
}

// maxPending bounds a copier's held bytes: its largest buffer.
const maxPending = bulkBuf

// parkWait bounds detach's wait for a copier to stop.
const parkWait = 2 * time.Second

// hostFlow is the mover of a host TCP flow.
type hostFlow struct {
	p     *Proxy
	s     *splice
	f     *flow
	start func() // an adopted flow's splice, started by its first reattach
	held  [2]bool
}

var _ mover = (*hostFlow)(nil)

// movable makes s's copiers parkable, and returns the mover of its flow f.
func movable(p *Proxy, s *splice, f *flow) *hostFlow {
	for dir := range 2 {
		s.parked[dir], s.resume[dir], s.exited[dir] = make(chan []byte, 1), make(chan bool, 1), make(chan struct{})
	}
	h := &hostFlow{p: p, s: s, f: f}
	f.mover = h
	return h
}

// detach implements mover (step 1).
func (h *hostFlow) detach(d *detaching) error {
	s := h.s
	if h.start != nil {
		return errNotMovable // adopted and not started: not this process's to give
	}
	s.parking.Store(true)
	now := time.Now()
	_ = s.client.SetDeadline(now)
	_ = s.backend.SetDeadline(now)
	var m MovedHost
	ok := true
	timeout := time.NewTimer(parkWait)
	defer timeout.Stop()
	for dir := range 2 {
		select {
		case b := <-s.parked[dir]:
			h.held[dir] = true
			m.Pending[dir] = b
		case <-s.exited[dir]:
			m.EOF[dir] = s.eof[dir].Load()
			ok = ok && m.EOF[dir] // else it ended on an error: the flow ends
		case <-timeout.C:
			ok = false
		}
	}
	var cfd, bfd int
	var saved conntrack.Saved
	if ok {
		var found, cok, bok bool
		saved, found = h.p.ct.Save(h.f.tuple)
		cfd, cok = rawFD(s.client)
		bfd, bok = rawFD(s.backend)
		ok = found && cok && bok
	}
	if !ok {
		h.reattach()
		return errNotMovable
	}
	m.Entry, m.Endpoint, m.ServicePort = saved, h.f.Endpoint, h.f.ServicePort
	d.Host = append(d.Host, m)
	d.hostFDs = append(d.hostFDs, cfd, bfd)
	return nil
}

// rawFD returns c's descriptor (it stays c's): a *net.TCPConn's or
// *net.TCPListener's, or a socket dialled by the proxy's own dialer
// (hostdial_linux.go).
func rawFD(c any) (int, bool) {
	var rc syscall.RawConn
	switch c := c.(type) {
	case interface{ rawConn() syscall.RawConn }:
		rc = c.rawConn()
	case interface {
		SyscallConn() (syscall.RawConn, error)
	}:
		var err error
		if rc, err = c.SyscallConn(); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	fd := -1
	if err := rc.Control(func(raw uintptr) { fd = int(raw) }); err != nil {
		return 0, false
	}
	return fd, fd >= 0
}

// reattach implements mover (step 2); for an adopted flow, the first
// starts its splice.
func (h *hostFlow) reattach() {
	if start := h.start; start != nil {
		h.start = nil
		start()
		return
	}
	s := h.s
	s.parking.Store(false)
	_ = s.client.SetDeadline(time.Time{})
	_ = s.backend.SetDeadline(time.Time{})
	for dir := range 2 {
		if h.held[dir] {
			h.held[dir] = false
			s.resume[dir] <- true
		}
	}
}

// forget implements mover (step 3). The flow leaves the live set at once:
// nothing here may end it (a RST would be set on the sockets the next
// process now holds).
func (h *hostFlow) forget() {
	h.p.untrack(h.f)
	for dir := range 2 {
		if h.held[dir] {
			h.held[dir] = false
			h.s.resume[dir] <- false
		}
	}
}

// adoptHost takes one host TCP flow the previous process handed over,
// its client and endpoint sockets in files, to be started by
// StartAdopted. On failure both sockets are reset and no entry is left.
func (p *Proxy) adoptHost(m MovedHost, client, backend *os.File) error {
	cc, cerr := net.FileConn(client)
	bc, berr := net.FileConn(backend)
	_, _ = client.Close(), backend.Close() // the conns hold descriptors of their own
	fail := func(err error) error {
		for _, c := range []net.Conn{cc, bc} {
			if c != nil {
				resetTCP(c)
			}
		}
		return err
	}
	if err := errors.Join(cerr, berr); err != nil {
		return fail(fmt.Errorf("proxy: a host flow's sockets: %w", err))
	}
	tuple := m.Entry.Original
	_, cok := cc.(*net.TCPConn)
	ra, bok := bc.RemoteAddr().(*net.TCPAddr)
	if !cok || !bok || tuple.Proto() != conntrack.TCP || ra.AddrPort().Addr().Unmap() != m.Endpoint.Addr().Unmap() || ra.AddrPort().Port() != m.Endpoint.Port() {
		return fail(fmt.Errorf("proxy: the host flow %v: sockets that are not its TCP connections to %v", tuple, m.Endpoint))
	}
	for dir := range 2 {
		if len(m.Pending[dir]) > maxPending {
			return fail(fmt.Errorf("proxy: the host flow %v holds %d bytes", tuple, len(m.Pending[dir])))
		}
	}
	if err := p.ct.Restore(m.Entry); err != nil {
		return fail(err)
	}
	s := &splice{client: cc, backend: bc, proxy: p, resetClient: func() { resetTCP(cc) }}
	s.pending = m.Pending
	s.eof[0].Store(m.EOF[0])
	s.eof[1].Store(m.EOF[1])
	f := newFlow(tuple, true, conntrack.Binding{Endpoint: m.Endpoint, ServicePort: m.ServicePort}, func(bool) { s.abort() })
	s.touch = func() { p.ct.Touch(tuple, conntrack.Original, f) }
	h := movable(p, s, f)
	f.count(p.adoptedPick(tuple, m.Endpoint, m.ServicePort))
	if !p.track(f) {
		p.ct.DeleteFlow(tuple, nil)
		return fail(errors.New("proxy: the proxy is shutting down"))
	}
	h.start = func() { go p.spliceHost(s, f) }
	p.adopted = append(p.adopted, h)
	return nil
}

// spliceHost runs a tracked host flow's splice to its end, then lets the
// flow go (nodeport.go, adoptHost).
func (p *Proxy) spliceHost(s *splice, f *flow) {
	defer p.untrack(f)
	s.run()
	p.ct.DeleteFlow(f.tuple, f) // no FIN passed the table: the entry goes with the flow
}

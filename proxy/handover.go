package proxy

// Flows handed to the next process (package handover; the binary's run
// command drives it): a translated TCP flow's whole state is its endpoint
// socket, which passes with SCM_RIGHTS, its TCP's sequence state and its
// conntrack entry. Flows terminated by gVisor's TCP (through the API
// server, to in-process servers) and UDP flows do not move in this
// version: the old process ends them once the new one has taken over
// (EndUnmoved), as a restart would.

import (
	"net/netip"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
)

// MovedFlow is a translated TCP flow on its way to the next process; its
// endpoint socket travels beside it, at the same index.
type MovedFlow struct {
	Entry       conntrack.Saved
	TCP         netstack.MovedTCP
	Endpoint    netip.AddrPort
	ServicePort string
}

// mover hands one flow over: detach stops it and returns its state and its
// socket's descriptor; reattach starts it again when the handover failed.
type mover interface {
	detach() (MovedFlow, int, error)
	reattach()
	forget()
}

// DetachFlows stops every translated flow for the next process and
// returns their states and their sockets' descriptors (which stay open
// here). The TUN's readers must be paused first, so that no client segment
// reaches a flow after its state is taken.
func (p *Proxy) DetachFlows() ([]MovedFlow, []int) {
	p.handoverCut.Lock() // no flow between its Accept and its track
	defer p.handoverCut.Unlock()
	p.flows.mu.Lock()
	var ms []mover
	for f := range p.flows.live {
		if f.mover != nil {
			ms = append(ms, f.mover)
		}
	}
	p.flows.mu.Unlock()
	var moved []MovedFlow
	var fds []int
	p.detached = p.detached[:0]
	for _, m := range ms {
		mf, fd, err := m.detach()
		if err != nil {
			continue // ended meanwhile: nothing to move
		}
		moved, fds = append(moved, mf), append(fds, fd)
		p.detached = append(p.detached, m)
	}
	return moved, fds
}

// ForgetDetached drops the flows DetachFlows stopped from the live set:
// the next process confirmed it has them, and nothing here may end them
// (Shutdown would wait for them).
func (p *Proxy) ForgetDetached() {
	for _, m := range p.detached {
		m.forget()
	}
	p.detached = nil
}

// ReattachFlows starts the flows DetachFlows stopped again: the handover
// failed and this process serves on.
func (p *Proxy) ReattachFlows() {
	for _, m := range p.detached {
		m.reattach()
	}
	p.detached = nil
}

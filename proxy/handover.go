package proxy

// Flows handed to the next process (package handover; the binary's run
// command drives it): a translated TCP flow's whole state is its endpoint
// socket, which passes with SCM_RIGHTS, its TCP's sequence state and its
// conntrack entry; a UDP flow's is its endpoint socket and its conntrack
// entry (udpmove.go). Flows terminated by gVisor's TCP (through the API
// server, to in-process servers) do not move in this version: the old
// process ends them once the new one has taken over, as a restart would.

import (
	"net/netip"
	"slices"

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

// MovedUDP is a UDP flow on its way to the next process; its endpoint
// socket travels beside it, after the TCP flows' sockets, at its index
// among the UDP flows.
type MovedUDP struct {
	Entry       conntrack.Saved
	Endpoint    netip.AddrPort
	ServicePort string
	// ProxyProtocol is the PROXY protocol header every datagram to the
	// endpoint starts with (ProxyProtocolNone for none).
	ProxyProtocol ProxyProtocol
}

// Moved is the flows DetachFlows stopped, or AdoptFlows takes.
type Moved struct {
	TCP  []MovedFlow
	UDP  []MovedUDP
	Host []MovedHost // hostmove.go
}

// sockets is how many descriptors travel with m: one per translated TCP
// and UDP flow, two per host flow.
func (m *Moved) sockets() int { return len(m.TCP) + len(m.UDP) + 2*len(m.Host) }

// detaching collects what DetachFlows stops: the flows' states and their
// sockets' descriptors, by kind (translated TCP, UDP, host TCP: in that
// order on the wire).
type detaching struct {
	Moved
	tcpFDs, udpFDs, hostFDs []int
}

// mover hands one flow over: detach stops it and adds its state and its
// socket's descriptor to d; reattach starts it again when the handover
// failed; forget lets it go once the next process has it.
type mover interface {
	detach(d *detaching) error
	reattach()
	forget()
}

// DetachFlows stops every translated TCP flow and every UDP flow for the
// next process and returns their states and their sockets' descriptors,
// the TCP flows' first (the descriptors stay open here). The TUN's readers
// must be paused first, so that no client packet reaches a flow after its
// state is taken.
func (p *Proxy) DetachFlows() (Moved, []int) {
	p.handoverCut.Lock() // no flow between its Accept (or track) and its start
	defer p.handoverCut.Unlock()
	p.flows.mu.Lock()
	var ms []mover
	for f := range p.flows.live {
		if f.mover != nil {
			ms = append(ms, f.mover)
		}
	}
	p.flows.mu.Unlock()
	var d detaching
	p.detached = p.detached[:0]
	for _, m := range ms {
		if err := m.detach(&d); err != nil {
			continue // ended meanwhile, or cannot move: nothing to move
		}
		p.detached = append(p.detached, m)
	}
	return d.Moved, slices.Concat(d.tcpFDs, d.udpFDs, d.hostFDs)
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

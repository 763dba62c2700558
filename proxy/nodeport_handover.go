package proxy

// NodePort listeners in a handover: the old process lends its TCP
// NodePort listeners (their descriptors pass beside the flows'), and its
// accept loops wait meanwhile, so that a connection arriving in the pause
// waits in the listener's queue for whichever process serves next: the
// new one on the commit, this one again if the handover fails. The new
// process serves a NodePort on the listener it inherited instead of
// binding the port, which the old one still holds. UDP NodePort sockets
// are not lent: their flows end with the old process, and the new one
// binds them once the old one has closed them.

import (
	"net"
	"os"
	"time"
)

// LentListener is a TCP NodePort listener lent to the next process: Name
// says which ("TCP 127.0.0.1:30080"), FD is its descriptor (this process
// keeps it open until it closes the NodePorts).
type LentListener struct {
	Name string
	FD   int
}

// lendWait bounds Lend's wait for the connections accepted before it to
// be set up (their endpoints dialled): set up, they move with the flows.
const lendWait = 2 * time.Second

// Lend stops the TCP NodePort listeners' accept loops and returns their
// descriptors, once the connections already accepted are set up (or
// lendWait has passed): each is then a flow that DetachFlows moves. Unlend
// starts the loops again.
func (n *NodePorts) Lend() []LentListener {
	lent := n.lend()
	// Every accept loop parked: what it accepted before holds its
	// in-flight token already. Then those connections' set-ups end.
	for deadline := time.Now().Add(lendWait); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		n.mu.Lock()
		parked := n.parked >= len(lent)
		n.mu.Unlock()
		if parked && len(n.inFlight) == 0 {
			break
		}
	}
	return lent
}

func (n *NodePorts) lend() []LentListener {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.lending.Store(true)
	var out []LentListener
	for k, s := range n.open {
		ln, ok := s.(*net.TCPListener)
		if !ok {
			continue
		}
		_ = ln.SetDeadline(time.Unix(1, 0)) // an accept under way returns at once
		if fd, ok := rawFD(ln); ok {
			out = append(out, LentListener{Name: k.String(), FD: fd})
		}
	}
	return out
}

// Unlend starts the accept loops again: the handover failed.
func (n *NodePorts) Unlend() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, s := range n.open {
		if ln, ok := s.(*net.TCPListener); ok {
			_ = ln.SetDeadline(time.Time{})
		}
	}
	n.lending.Store(false)
	n.lendCond.Broadcast()
}

// waitLent parks an accept loop while the listeners are lent; it reports
// false once the NodePorts are closed.
func (n *NodePorts) waitLent() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.parked++
	for n.lending.Load() && !n.closed {
		n.lendCond.Wait()
	}
	n.parked--
	return !n.closed
}

// Inherit gives the NodePorts the listeners a previous process lent, by
// name: Sync serves a NodePort on its inherited listener instead of
// binding the port. The files are the NodePorts'; those no Sync takes are
// closed by Close (or by DropInherited).
func (n *NodePorts) Inherit(files map[string]*os.File) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.inherited = files
}

// DropInherited closes the inherited listeners no NodePort took: the new
// table has no such NodePort.
func (n *NodePorts) DropInherited() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, f := range n.inherited {
		_ = f.Close()
		delete(n.inherited, name)
	}
}

// inheritedListener returns the listener inherited for k, if any; n.mu is
// held.
func (n *NodePorts) inheritedListener(k npKey) (net.Listener, bool) {
	f, ok := n.inherited[k.String()]
	if !ok {
		return nil, false
	}
	delete(n.inherited, k.String())
	ln, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		n.log.Warn("an inherited NodePort listener cannot serve: binding the port instead")
		return nil, false
	}
	return ln, true
}

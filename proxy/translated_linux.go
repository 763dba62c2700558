package proxy

// Translated TCP flows (netstack/translate.go, --tcp-translate): the proxy
// routes and dials as for HandleTCP, then hands the endpoint socket to the
// translator instead of splicing it to a gVisor connection.
//
//  1. route; a Service served in this process, a dial that is not direct
//     (the API server's way), or a Config.Dialer: back to gVisor
//     (Fallback), where HandleTCP takes the flow.
//  2. dial the endpoint; a failed dial refuses the client with a RST.
//  3. accept: the translator answers the client's SYN with the socket.
//  4. track the flow on its conntrack entry, whose end aborts it.
//  5. run: wait for the socket's reads and report them, until the flow
//     ends; the translator does the rest on the packet path.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// HandleTranslated proxies one translated TCP flow (implements
// netstack.TranslatedHandler).
func (p *Proxy) HandleTranslated(r *netstack.TranslateRequest) {
	tuple := r.Tuple()
	if p.closing.Load() {
		r.Refuse()
		return
	}
	if p.cfg.Via != ViaDirect || p.cfg.Dialer != Dialer(defaultDialer) {
		r.Fallback() // 1
		return
	}
	pk, v := p.route(service.TCP, tuple)
	port := pk.port
	if port == nil {
		switch {
		case p.localFor(p.table.Load(), r.Service()) != nil:
			r.Fallback()
		case v.Drop():
			r.Ignore()
		default:
			r.Refuse()
		}
		return
	}
	backend, way, err := p.dialTCP(r.Context(), &pk, tuple) // 2
	if err != nil {
		r.Refuse()
		return
	}
	hc, ok := backend.(*hostConn)
	var (
		sock netstack.EndpointSocket
		wnd  uint32
	)
	if ok {
		sock, wnd, err = hc.translatable()
	}
	if !ok || err != nil {
		// Not a socket the translator can carry: gVisor's TCP takes the
		// flow, and dials again (TranslateSupported makes this rare).
		pk.release()
		resetTCP(backend)
		r.Fallback()
		return
	}
	x := p.newXLOwner(hc, tuple, conntrack.Binding{Endpoint: pk.endpoint, ServicePort: port.Name.String()})
	x.f.count(pk)
	x.f.noteWay(p.cfg.Via, way)
	// Accepted and tracked in one step against a handover's cut
	// (DetachFlows), which would otherwise miss a flow between the two.
	p.handoverCut.RLock()
	if x.t = r.Accept(sock, wnd, x.wake, x.waitWritable, &p.stats.bytes); x.t == nil { // 3
		// The SYN went to the next process with the TUN (a handover):
		// that process dials for it.
		p.handoverCut.RUnlock()
		pk.release()
		resetTCP(backend)
		return
	}
	tracked := x.start()
	p.handoverCut.RUnlock()
	if !tracked {
		return
	}
	p.stats.count(conntrack.TCP, ResultProxied)
	p.stats.countWay(conntrack.TCP, way)
	if ce := p.logger.Check(zap.DebugLevel, "TCP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("service", r.Service()),
			zap.Stringer("servicePort", port.Name), zap.Stringer("endpoint", pk.endpoint), zap.Stringer("way", way),
			zap.Bool("translated", true))
	}
	x.run() // 5
}

// xlOwner runs one translated flow: it tracks the flow, waits for its
// socket's reads and reports them until the flow ends, and hands it over
// when the process does (handover.go).
type xlOwner struct {
	p     *Proxy
	hc    *hostConn
	t     *netstack.TranslatedFlow
	f     *flow
	tuple conntrack.Tuple
}

func (p *Proxy) newXLOwner(hc *hostConn, tuple conntrack.Tuple, b conntrack.Binding) *xlOwner {
	x := &xlOwner{p: p, hc: hc, tuple: tuple}
	x.f = newFlow(tuple, true, b, func(bool) { x.t.Abort() })
	x.f.mover = x
	return x
}

// wake ends the owner's wait for the socket's reads.
func (x *xlOwner) wake() { _ = x.hc.SetReadDeadline(time.Unix(1, 0)) }

// waitWritable waits for the full socket to take bytes again. The poller's
// readiness is an edge, and RawConn.Write forgets one that came before it
// began: the socket is asked first, then waited on.
func (x *xlOwner) waitWritable(then func()) {
	_ = x.hc.rawConn().Write(func(uintptr) bool { return x.hc.writable() })
	then()
}

// start tracks the flow on its conntrack entry, whose end aborts it (4);
// a flow whose entry is gone already is ended, and false returned.
func (x *xlOwner) start() bool {
	if x.p.track(x.f) {
		return true
	}
	x.t.Abort()
	x.t.Forget()
	x.p.untrack(x.f)
	_ = x.hc.Close()
	return false
}

// run reads until the flow ends (5). A flow handed to the next process
// waits, its socket open and untouched, until this process exits, or until
// the handover fails and it goes on.
func (x *xlOwner) run() {
	t, hc := x.t, x.hc
	defer t.Forget()
	defer keepAliveLater(hc, endpointKeepAlive)()
	defer x.p.untrack(x.f)
	stop := context.AfterFunc(t.Context(), t.Abort)
	defer stop()
	rc := hc.rawConn()
	for !t.Ended() {
		err := rc.Read(func(uintptr) bool { return t.Readable() })
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Abort()
			break
		}
		if err == nil || t.Ended() {
			continue
		}
		// Woken, the flow not over: it was detached for a handover (and
		// may be attached again already, the handover failed).
		if detached, attached := t.Detached(); detached {
			select {
			case <-attached:
			case <-t.Context().Done():
				return // the next process's now: its socket is left as it is
			}
		}
		_ = hc.SetReadDeadline(time.Time{})
	}
	_ = hc.Close()
}

// detach implements mover: the flow stops first, then its entry is saved,
// so that the entry has seen every segment the flow sent.
func (x *xlOwner) detach(d *detaching) error {
	m, err := x.t.Detach()
	if err != nil {
		return err
	}
	saved, ok := x.p.ct.Save(x.tuple)
	if !ok {
		x.t.Reattach() // its end comes as for any flow whose entry went
		return errors.New("proxy: the flow's conntrack entry is gone")
	}
	d.TCP = append(d.TCP, MovedFlow{Entry: saved, TCP: m, Endpoint: x.f.Endpoint, ServicePort: x.f.ServicePort})
	d.tcpFDs = append(d.tcpFDs, x.hc.fd)
	return nil
}

// reattach implements mover.
func (x *xlOwner) reattach() { x.t.Reattach() }

// forget implements mover.
func (x *xlOwner) forget() { x.p.untrack(x.f) }

// AdoptFlows takes the flows the previous process handed over (moved,
// with their sockets in files: the TCP flows' first, each list in order)
// into st. Each flow's conntrack entry is restored and the flow counted on
// its endpoint and persistence template (balancing.go: RestoreBalancing
// goes first). A translated TCP flow's TCP is registered under its tuple,
// and an owner runs it as if it had been accepted here; a UDP flow is
// tracked around its socket (udpmove.go). Both start once StartAdopted
// says the previous process has committed (until then nothing goes out,
// and nothing is read). A TCP flow that cannot be adopted is reset (its
// socket closed with a RST; the client's next segment meets the gate with
// no entry) and its client sent a RST by StartAdopted; a UDP flow that
// cannot be adopted is dropped (its socket closed, its entry gone: the
// client's next datagram is new). The files are this process's either
// way. It returns how many flows of each protocol were adopted.
func (p *Proxy) AdoptFlows(st *netstack.Stack, moved Moved, files []*os.File) (tcp, udp int, err error) {
	if moved.sockets() != len(files) {
		for _, f := range files {
			_ = f.Close()
		}
		p.unadopted = append(p.unadopted, moved.TCP...)
		return 0, 0, fmt.Errorf("proxy: %d TCP, %d UDP and %d host flows handed over with %d sockets", len(moved.TCP), len(moved.UDP), len(moved.Host), len(files))
	}
	var errs []error
	for i, m := range moved.TCP {
		if err := p.adopt(st, m, files[i]); err != nil {
			p.unadopted = append(p.unadopted, m)
			errs = append(errs, fmt.Errorf("%v: %w", m.Entry.Original, err))
			continue
		}
		tcp++
	}
	for i, m := range moved.UDP {
		if err := p.adoptUDP(st, m, files[len(moved.TCP)+i]); err != nil {
			errs = append(errs, fmt.Errorf("%v: %w", m.Entry.Original, err))
			continue
		}
		udp++
	}
	hostFiles := files[len(moved.TCP)+len(moved.UDP):]
	for i, m := range moved.Host {
		if err := p.adoptHost(m, hostFiles[2*i], hostFiles[2*i+1]); err != nil {
			errs = append(errs, fmt.Errorf("%v: %w", m.Entry.Original, err))
			continue
		}
		tcp++
	}
	return tcp, udp, errors.Join(errs...)
}

func (p *Proxy) adopt(st *netstack.Stack, m MovedFlow, file *os.File) error {
	hc, err := adoptHostConn(file, m.Endpoint)
	if err != nil {
		_ = file.Close()
		return err
	}
	sock, err := hc.adoptedSocket()
	if err != nil {
		resetTCP(hc)
		return err
	}
	tuple := m.Entry.Original
	if err := p.ct.Restore(m.Entry); err != nil {
		resetTCP(hc)
		return err
	}
	x := p.newXLOwner(hc, tuple, conntrack.Binding{Endpoint: m.Endpoint, ServicePort: m.ServicePort})
	pk := p.adoptedPick(tuple, m.Endpoint, m.ServicePort) // balancing.go
	x.f.count(pk)
	// own starts on the stack's handler goroutine once x.t is set.
	ready := make(chan struct{})
	t, err := st.AdoptTranslated(tuple, m.TCP, sock, x.wake, x.waitWritable, &p.stats.bytes, func(*netstack.TranslatedFlow) {
		<-ready
		if x.start() {
			x.run()
		}
	})
	if err != nil {
		pk.release()
		p.ct.DeleteFlow(tuple, nil)
		resetTCP(hc)
		return err
	}
	x.t = t
	close(ready)
	p.adopted = append(p.adopted, x)
	return nil
}

// StartAdopted starts the flows AdoptFlows took, and resets the clients
// of the TCP flows it could not take: the process they came from has
// committed to the handover (before, it might take them back).
func (p *Proxy) StartAdopted(st *netstack.Stack) {
	for _, m := range p.adopted {
		m.reattach()
	}
	for _, m := range p.unadopted {
		st.ResetMoved(m.Entry.Original, m.TCP)
	}
	p.adopted, p.unadopted = nil, nil
}

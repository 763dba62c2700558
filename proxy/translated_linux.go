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
	rc := hc.rawConn()
	wake := func() { _ = hc.SetReadDeadline(time.Unix(1, 0)) }
	// The poller's readiness is an edge, and RawConn.Write forgets one that
	// came before it began: the socket is asked first, then waited on.
	waitWritable := func(then func()) {
		_ = rc.Write(func(uintptr) bool { return hc.writable() })
		then()
	}
	t := r.Accept(sock, wnd, wake, waitWritable, &p.stats.bytes) // 3
	defer t.Forget()
	defer keepAliveLater(backend, endpointKeepAlive)()
	p.stats.count(conntrack.TCP, ResultProxied)
	p.stats.countWay(conntrack.TCP, way)

	f := newFlow(tuple, true, conntrack.Binding{Endpoint: pk.endpoint, ServicePort: port.Name.String()}, func(bool) { t.Abort() }) // 4
	f.count(pk)
	f.noteWay(p.cfg.Via, way)
	defer p.untrack(f)
	if !p.track(f) {
		t.Abort()
		_ = backend.Close()
		return
	}
	if ce := p.logger.Check(zap.DebugLevel, "TCP flow started"); ce != nil {
		ce.Write(zap.Stringer("client", r.Client()), zap.Stringer("service", r.Service()),
			zap.Stringer("servicePort", port.Name), zap.Stringer("endpoint", pk.endpoint), zap.Stringer("way", way),
			zap.Bool("translated", true))
	}
	stop := context.AfterFunc(r.Context(), t.Abort)
	defer stop()
	for !t.Ended() { // 5
		err := rc.Read(func(uintptr) bool { return t.Readable() })
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Abort()
		}
		if err != nil {
			break
		}
	}
	_ = backend.Close()
}

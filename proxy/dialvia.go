package proxy

// How a flow reaches its endpoint once it is picked (Config.Via,
// --dial-via). Only the dial differs: the lottery, affinity, schedulers,
// conntrack and the splice are the same whichever way a flow goes.
//
//  1. direct: the host dials the endpoint's address (Config.Dialer).
//  2. apiserver: Config.PodDialer carries the connection to the port of
//     the endpoint's Pod (its EndpointSlice targetRef): the API server's
//     pods/portforward. An endpoint that names no Pod cannot go this way:
//     it is refused and counted (no_way_to_endpoint).
//  3. auto: the way remembered for the endpoint, while the memory lasts
//     (ViaMemory); else a short direct attempt (DirectAttempt) and, if the
//     address did not answer (a timeout, an unreachable network or host),
//     the API server within what is left of DialTimeout. The way that
//     worked is remembered, so only the first flow to an endpoint pays the
//     direct attempt. A refused direct dial is an answer: the address is
//     routable, the pod just is not listening.
//  4. UDP (pods/portforward carries TCP only) goes direct, or not at all:
//     admission rejects a UDP flow with an ICMP port unreachable when every
//     endpoint it could pick is reached through the API server only
//     (udpNoWay); a flow that picks one such endpoint among others is
//     refused without a reply (the pick comes after admission). Both are
//     counted. Under auto, UDP to an address not yet remembered goes
//     direct, and a TCP probe of it tells the next flows.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/userproxy/userproxy/service"
)

// DialVia is the policy for reaching endpoints (--dial-via).
type DialVia uint8

// Dial policies.
const (
	// ViaDirect dials every endpoint from the host.
	ViaDirect DialVia = iota
	// ViaAPIServer carries every TCP flow through the PodDialer.
	ViaAPIServer
	// ViaAuto tries direct first and remembers, per endpoint, which way
	// worked.
	ViaAuto
)

var viaNames = [...]string{"direct", "apiserver", "auto"}

func (v DialVia) String() string {
	if int(v) < len(viaNames) {
		return viaNames[v]
	}
	return fmt.Sprintf("DialVia(%d)", v)
}

// ParseDialVia parses "direct", "apiserver" or "auto".
func ParseDialVia(s string) (DialVia, error) {
	for i, n := range viaNames {
		if s == n {
			return DialVia(i), nil
		}
	}
	return 0, fmt.Errorf("dial way %q: want direct, apiserver or auto", s)
}

// Way is the way one flow went: the `way` label of the dial metrics.
type Way uint8

// Ways.
const (
	WayDirect Way = iota
	WayAPIServer
	NumWays
)

var wayNames = [NumWays]string{"direct", "apiserver"}

func (w Way) String() string { return wayNames[w] }

// PodDialer opens TCP connections to a port of a Pod by its name rather
// than its address: the API server's pods/portforward (source/kube). It is
// safe for concurrent use. DialPod returns once the stream is open or ctx
// is done. The connection's Close ends the stream; if it has CloseWrite,
// that half-closes it; a Read or Write on a stream that broke (the tunnel,
// the API server, the kubelet) fails with an error other than io.EOF, so
// the splice resets the client.
type PodDialer interface {
	DialPod(ctx context.Context, pod service.PodRef, port uint16) (net.Conn, error)
}

// ErrNoPod is the dial error of an endpoint that must be reached through
// the API server and whose EndpointSlice names no Pod.
var ErrNoPod = errors.New("the endpoint names no Pod (no targetRef of kind Pod) to reach through the API server")

// errNoPodDialer: a way that needs the PodDialer, without one.
var errNoPodDialer = errors.New("no API server to reach the endpoint through")

// dialEndpoint dials pk's endpoint by the configured policy within ctx
// (steps 1-3) and reports the way it went.
func (p *Proxy) dialEndpoint(ctx context.Context, pk *pick) (net.Conn, Way, error) {
	switch p.cfg.Via {
	case ViaAPIServer:
		c, err := p.dialWay(ctx, WayAPIServer, pk)
		return c, WayAPIServer, err
	case ViaAuto:
		return p.dialAuto(ctx, pk)
	}
	c, err := p.dialWay(ctx, WayDirect, pk)
	return c, WayDirect, err
}

// dialAuto is step 3.
func (p *Proxy) dialAuto(ctx context.Context, pk *pick) (net.Conn, Way, error) {
	now := p.cfg.Clock.Now()
	if w, ok := p.ways.recall(pk.endpoint.Addr(), now); ok {
		c, err := p.dialWay(ctx, w, pk)
		if err != nil && w == WayDirect && unanswered(err) && !pk.pod.IsZero() {
			p.ways.forget(pk.endpoint.Addr()) // the next flow tries again, both ways
		}
		return c, w, err
	}
	if pk.pod.IsZero() || p.cfg.PodDialer == nil { // nothing else to try
		c, err := p.dialWay(ctx, WayDirect, pk)
		return c, WayDirect, err
	}
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DirectAttempt)
	start := time.Now()
	c, err := p.dialer(dctx, WayDirect, pk)
	cancel()
	if err == nil || !unanswered(err) || ctx.Err() != nil {
		p.stats.observeDial(WayDirect, time.Since(start), err == nil)
		if err == nil || errors.Is(err, syscall.ECONNREFUSED) {
			p.ways.remember(pk.endpoint.Addr(), WayDirect, now, p.cfg.ViaMemory)
		}
		return c, WayDirect, err
	}
	// The address did not answer: an expected step of this policy, counted
	// apart from the failures.
	p.stats.fallbacks.Add(1)
	c, err = p.dialWay(ctx, WayAPIServer, pk)
	if err == nil {
		p.ways.remember(pk.endpoint.Addr(), WayAPIServer, now, p.cfg.ViaMemory)
	}
	return c, WayAPIServer, err
}

// dialWay dials pk's endpoint one way, timing and counting the dial.
func (p *Proxy) dialWay(ctx context.Context, w Way, pk *pick) (net.Conn, error) {
	if w == WayAPIServer && pk.pod.IsZero() {
		return nil, ErrNoPod
	}
	start := time.Now()
	c, err := p.dialer(ctx, w, pk)
	p.stats.observeDial(w, time.Since(start), err == nil)
	return c, err
}

// dialer dials pk's endpoint one way (through the API server: pk has a
// Pod, dialWay checked).
func (p *Proxy) dialer(ctx context.Context, w Way, pk *pick) (net.Conn, error) {
	switch {
	case w == WayDirect:
		return p.direct(ctx, pk.endpoint)
	case p.cfg.PodDialer == nil:
		return nil, errNoPodDialer
	}
	c, err := p.cfg.PodDialer.DialPod(ctx, pk.pod, pk.endpoint.Port())
	if err != nil {
		return nil, fmt.Errorf("through the API server to pod %s port %d: %w", pk.pod, pk.endpoint.Port(), err)
	}
	return c, nil
}

// unanswered reports whether a direct dial failed without an answer from
// the address: it timed out, or no route leads there.
func unanswered(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.EHOSTDOWN) || errors.Is(err, syscall.ETIMEDOUT) ||
		errors.Is(err, syscall.EADDRNOTAVAIL)
}

// udpWay reports whether a UDP flow may go to endpoint: only directly
// (step 4). Under auto, an address nothing is remembered for goes direct,
// and if it has a Pod a TCP probe of its port finds out for the next flows
// (probe).
func (p *Proxy) udpWay(endpoint netip.AddrPort, pod service.PodRef) bool {
	switch p.cfg.Via {
	case ViaAPIServer:
		return false
	case ViaAuto:
		w, ok := p.ways.recall(endpoint.Addr(), p.cfg.Clock.Now())
		if !ok && !pod.IsZero() && p.cfg.PodDialer != nil {
			p.probe(endpoint)
		}
		return !ok || w == WayDirect
	}
	return true
}

// probe learns whether the host reaches endpoint's address, for UDP flows,
// which cannot tell: a TCP dial of the same port within DirectAttempt. An
// answer, even a refusal (a RST: nothing listens on TCP there), means
// direct; silence means the API server. One probe per address at a time,
// on its own goroutine; Run waits for them.
func (p *Proxy) probe(endpoint netip.AddrPort) {
	if !p.ways.startProbe(endpoint.Addr()) {
		return
	}
	p.probes.Add(1)
	go func() { // UDP endpoint prober
		defer p.probes.Done()
		defer p.ways.endProbe(endpoint.Addr())
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.DirectAttempt)
		c, err := p.direct(ctx, endpoint)
		cancel()
		now := p.cfg.Clock.Now()
		switch {
		case err == nil:
			_ = c.Close()
			p.ways.remember(endpoint.Addr(), WayDirect, now, p.cfg.ViaMemory)
		case errors.Is(err, syscall.ECONNREFUSED):
			p.ways.remember(endpoint.Addr(), WayDirect, now, p.cfg.ViaMemory)
		case unanswered(err):
			p.ways.remember(endpoint.Addr(), WayAPIServer, now, p.cfg.ViaMemory)
		}
	}()
}

// udpNoWay reports whether no endpoint of tg can take a UDP flow: the gate
// then rejects it (step 4).
func (p *Proxy) udpNoWay(tg *target) bool {
	if p.cfg.Via == ViaDirect {
		return false
	}
	eps, _ := tg.endpoints()
	for i := range eps {
		if p.udpWay(eps[i].Addr, eps[i].Pod) {
			return false
		}
	}
	return len(eps) > 0
}

// maxRemembered bounds the auto policy's memory; when it is full, expired
// entries go, and if none has, the whole memory is forgotten (the next
// flows probe again: slower, never wrong).
const maxRemembered = 1 << 16

// wayMemory is what the auto policy remembers per endpoint address: whether
// the host reaches an address does not depend on the port, so a UDP flow
// learns from the TCP flows to the same pod.
type wayMemory struct {
	mu      sync.RWMutex // read on every new UDP flow's admission
	m       map[netip.Addr]remembered
	probing map[netip.Addr]bool
}

type remembered struct {
	way   Way
	until time.Time
}

// recall returns the way remembered for ep, if it has not expired
// (expired entries are overwritten or swept by remember).
func (wm *wayMemory) recall(ep netip.Addr, now time.Time) (Way, bool) {
	wm.mu.RLock()
	r, ok := wm.m[ep]
	wm.mu.RUnlock()
	if !ok || !now.Before(r.until) {
		return 0, false
	}
	return r.way, true
}

// startProbe reports whether no probe of ep runs, and marks one running.
func (wm *wayMemory) startProbe(ep netip.Addr) bool {
	wm.mu.Lock()
	defer wm.mu.Unlock()
	if wm.probing[ep] || len(wm.probing) >= maxProbes {
		return false
	}
	if wm.probing == nil {
		wm.probing = map[netip.Addr]bool{}
	}
	wm.probing[ep] = true
	return true
}

func (wm *wayMemory) endProbe(ep netip.Addr) {
	wm.mu.Lock()
	delete(wm.probing, ep)
	wm.mu.Unlock()
}

// maxProbes bounds the probes running at once.
const maxProbes = 256

// remember records w for ep, from now for d.
func (wm *wayMemory) remember(ep netip.Addr, w Way, now time.Time, d time.Duration) {
	wm.mu.Lock()
	defer wm.mu.Unlock()
	if wm.m == nil {
		wm.m = make(map[netip.Addr]remembered)
	}
	if _, ok := wm.m[ep]; !ok && len(wm.m) >= maxRemembered {
		for k, r := range wm.m {
			if !now.Before(r.until) {
				delete(wm.m, k)
			}
		}
		if len(wm.m) >= maxRemembered {
			clear(wm.m)
		}
	}
	wm.m[ep] = remembered{way: w, until: now.Add(d)}
}

func (wm *wayMemory) forget(ep netip.Addr) {
	wm.mu.Lock()
	delete(wm.m, ep)
	wm.mu.Unlock()
}

// RememberedWay is one endpoint the auto policy remembers, for /debug.
type RememberedWay struct {
	Endpoint netip.Addr
	Way      Way
	Left     time.Duration
}

// RememberedWays returns what the auto policy remembers now, sorted by
// endpoint.
func (p *Proxy) RememberedWays() []RememberedWay {
	now := p.cfg.Clock.Now()
	p.ways.mu.RLock()
	out := make([]RememberedWay, 0, len(p.ways.m))
	for ep, r := range p.ways.m {
		if now.Before(r.until) {
			out = append(out, RememberedWay{Endpoint: ep, Way: r.way, Left: r.until.Sub(now)})
		}
	}
	p.ways.mu.RUnlock()
	slices.SortFunc(out, func(a, b RememberedWay) int { return a.Endpoint.Compare(b.Endpoint) })
	return out
}

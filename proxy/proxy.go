package proxy

// What the proxy does for a new flow (DESIGN.md section 2):
//
//  1. Admit (on the packet path, for the gate): the flow's destination is
//     looked up in the current service.Table: Forward -> accept; no service
//     port, unknown port or no endpoints -> reject (ICMP unreachable);
//     internalTrafficPolicy Local without local endpoints -> drop.
//  2. HandleTCP / HandleUDP (one goroutine per flow, from netstack): look up
//     again (the table may have changed), pick the endpoint (affinity, else
//     the lottery), dial it first, and only then complete the client's
//     handshake (tcp.go) or start the relay (udp.go).
//  3. The conntrack entry records the binding; when it leaves the table
//     (timeout, flush, endpoint removal), OnConntrackRemove ends the flow.
//  4. SetTable swaps in a new service table; endpoints that left UDP service
//     ports lose their conntrack entries (so the next datagram picks a live
//     endpoint), and affinity lists of departed endpoints are dropped.
//  5. Local servers (local.go): a flow to an address registered with
//     SetLocal that no service port claims is served in-process.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/service"
)

// Dialer opens host connections to endpoints; *net.Dialer is one.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config configures a Proxy.
type Config struct {
	// Conntrack is the table the gate classifies with (required). Its
	// OnRemove must call Proxy.OnConntrackRemove.
	Conntrack *conntrack.Table
	// DialTimeout bounds the dial of an endpoint; 0 means 5 s.
	DialTimeout time.Duration
	// AffinityListSize is xt_recent's ip_list_tot; 0 means 100.
	AffinityListSize int
	// MaxUDPSessions bounds the concurrent UDP flows; 0 means 65536.
	MaxUDPSessions int
	// Dialer; nil means a net.Dialer with 15 s keep-alives.
	Dialer Dialer
	// Rand is the lottery's random source; nil means balancer.RuntimeSource.
	Rand balancer.Source
	// Clock for affinity; nil means the system clock.
	Clock balancer.Clock
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
}

// Proxy answers admission for the gate and handles the flows netstack hands
// it. Its methods are safe for concurrent use.
type Proxy struct {
	cfg     Config
	ct      *conntrack.Table
	lottery *balancer.Lottery
	logger  *zap.Logger

	table   atomic.Pointer[service.Table]
	pickers atomic.Pointer[map[pickerKey]*balancer.Picker]
	syncMu  sync.Mutex // serializes SetTable

	flowsMu sync.Mutex
	flows   map[conntrack.Tuple]*flow

	udpSessions atomic.Int64
	stats       counters
	// locals maps the addresses of local servers to their handlers
	// (copy-on-write; see SetLocal).
	locals  atomic.Pointer[map[netip.AddrPort]LocalHandler]
	closing atomic.Bool
}

var _ netstack.FlowHandler = (*Proxy)(nil)

// pickerKey names the affinity and lottery state of one service port of one
// family: kube-proxy runs one proxier per family.
type pickerKey struct {
	name     service.PortName
	protocol service.Protocol
	family   service.Family
}

func keyOf(p *service.Port) pickerKey {
	return pickerKey{name: p.Name, protocol: p.Protocol, family: p.Family}
}

// New returns a Proxy without a table: every flow is rejected until SetTable.
func New(cfg Config) (*Proxy, error) {
	if cfg.Conntrack == nil {
		return nil, errors.New("proxy: Config.Conntrack is required")
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.AffinityListSize <= 0 {
		cfg.AffinityListSize = balancer.DefaultListSize
	}
	if cfg.MaxUDPSessions <= 0 {
		cfg.MaxUDPSessions = 65536
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &net.Dialer{KeepAlive: 15 * time.Second}
	}
	if cfg.Rand == nil {
		cfg.Rand = balancer.RuntimeSource{}
	}
	if cfg.Clock == nil {
		cfg.Clock = balancer.SystemClock{}
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	p := &Proxy{
		cfg:     cfg,
		ct:      cfg.Conntrack,
		lottery: balancer.NewLottery(64),
		logger:  cfg.Logger,
		flows:   make(map[conntrack.Tuple]*flow),
	}
	empty := map[pickerKey]*balancer.Picker{}
	p.pickers.Store(&empty)
	return p, nil
}

// Table returns the current service table, nil before the first SetTable.
func (p *Proxy) Table() *service.Table { return p.table.Load() }

// SetTable makes t the table new flows are looked up in (step 4). changes
// says what differs from the previous table (the Tracker's OnSync gives both).
func (p *Proxy) SetTable(t *service.Table, changes service.Changes) {
	p.syncMu.Lock()
	defer p.syncMu.Unlock()
	old := *p.pickers.Load()
	next := make(map[pickerKey]*balancer.Picker, len(old))
	for _, port := range t.Ports() {
		k := keyOf(port)
		if pk := old[k]; pk != nil && sameAffinity(pk, port) {
			next[k] = pk
			continue
		}
		next[k] = p.newPicker(port)
	}
	p.pickers.Store(&next)
	p.table.Store(t)

	for _, c := range changes.Ports {
		if pk := next[pickerKey{c.Name, c.Protocol, c.Family}]; pk != nil && pk.Affinity() != nil && c.New != nil {
			pk.Affinity().Retain(c.New.EndpointKeys)
		}
		if c.Protocol != service.UDP {
			continue
		}
		for _, key := range c.EndpointsRemoved {
			ep, err := parseAddrPort(key)
			if err != nil {
				continue
			}
			n := p.ct.Delete(conntrack.Filter{Protocol: conntrack.UDP, Endpoint: ep.Addr(), EndpointPort: ep.Port(), ServicePort: c.Name.String()})
			if n > 0 {
				p.logger.Debug("flushed UDP flows of a removed endpoint", zap.Stringer("servicePort", c.Name), zap.String("endpoint", key), zap.Int("entries", n))
			}
		}
	}
}

func sameAffinity(pk *balancer.Picker, port *service.Port) bool {
	a := pk.Affinity()
	if !port.Affinity.ClientIP {
		return a == nil
	}
	return a != nil && a.Timeout() == port.Affinity.Timeout
}

func (p *Proxy) newPicker(port *service.Port) *balancer.Picker {
	var aff *balancer.Affinity
	if port.Affinity.ClientIP {
		aff = balancer.NewAffinity(balancer.AffinityConfig{Timeout: port.Affinity.Timeout, ListSize: p.cfg.AffinityListSize, Clock: p.cfg.Clock})
	}
	return balancer.NewPicker(p.lottery, p.cfg.Rand, aff)
}

// Admit is the gate's admission function (step 1).
func (p *Proxy) Admit(flow conntrack.Tuple) netstack.Decision {
	if p.closing.Load() {
		return netstack.Reject
	}
	proto := service.TCP
	if flow.Proto() == conntrack.UDP {
		proto = service.UDP
	}
	t := p.table.Load()
	if t == nil {
		p.stats.count(flow.Proto(), ResultRejectedNoService)
		return netstack.Reject
	}
	_, v := t.Lookup(proto, flow.DstAddr(), flow.DstPort())
	switch v {
	case service.Forward:
		return netstack.Accept
	case service.NoLocalEndpoints:
		p.stats.count(flow.Proto(), ResultDroppedLocalPolicy)
		return netstack.Drop
	case service.NoEndpoints:
		p.stats.count(flow.Proto(), ResultRejectedNoEndpoints)
		return netstack.Reject
	default:
		if p.localFor(t, netip.AddrPortFrom(flow.DstAddr(), flow.DstPort())) != nil {
			return netstack.Accept
		}
		p.stats.count(flow.Proto(), ResultRejectedNoService)
		return netstack.Reject
	}
}

// route finds the endpoint for a flow admitted earlier (step 2): the table
// is looked up again because it may have changed since the SYN was admitted.
func (p *Proxy) route(proto service.Protocol, flow conntrack.Tuple) (*service.Port, int, bool, service.Verdict) {
	t := p.table.Load()
	if t == nil {
		return nil, -1, false, service.NotService
	}
	port, v := t.Lookup(proto, flow.DstAddr(), flow.DstPort())
	if v != service.Forward {
		return nil, -1, false, v
	}
	pk := (*p.pickers.Load())[keyOf(port)]
	if pk == nil { // a table swap in progress: a stateless picker
		pk = balancer.NewPicker(p.lottery, p.cfg.Rand, nil)
	}
	i, byAffinity := pk.Pick(port.EndpointKeys, flow.SrcAddr())
	if byAffinity {
		p.stats.affinityHits.Add(1)
	}
	return port, i, byAffinity, v
}

// Run drives conntrack expiry: it sweeps the table every interval until ctx
// is done.
func (p *Proxy) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Second
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.ct.Sweep()
		}
	}
}

// flow is a live proxied flow, found by its tuple when its conntrack entry
// leaves the table.
type flow struct {
	id    uint64 // the conntrack entry's ID, 0 if unknown
	close func()
	drain func() // half-closes both sides (TCP); nil for UDP
}

// Shutdown stops admitting flows (new ones are rejected), half-closes every
// TCP flow both ways so that peers see a FIN rather than a RST, closes UDP
// flows, and waits until the flows have ended or ctx is done. The caller
// then closes the stack, which resets whatever is left.
func (p *Proxy) Shutdown(ctx context.Context) {
	p.closing.Store(true)
	p.flowsMu.Lock()
	flows := make([]*flow, 0, len(p.flows))
	for _, f := range p.flows {
		flows = append(flows, f)
	}
	p.flowsMu.Unlock()
	for _, f := range flows {
		if f.drain != nil {
			f.drain()
		} else {
			f.close()
		}
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for p.Flows() > 0 {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (p *Proxy) register(t conntrack.Tuple, f *flow) {
	if info, ok := p.ct.Get(t); ok {
		f.id = info.ID
	}
	p.flowsMu.Lock()
	p.flows[t] = f
	p.flowsMu.Unlock()
}

func (p *Proxy) unregister(t conntrack.Tuple, f *flow) {
	p.flowsMu.Lock()
	if p.flows[t] == f {
		delete(p.flows, t)
	}
	p.flowsMu.Unlock()
}

// OnConntrackRemove ends the flow whose conntrack entry left the table (step
// 3). Wire it as the conntrack table's OnRemove.
func (p *Proxy) OnConntrackRemove(info conntrack.EntryInfo, why conntrack.RemoveReason) {
	p.flowsMu.Lock()
	f := p.flows[info.Original]
	if f != nil && (f.id == 0 || f.id == info.ID) {
		delete(p.flows, info.Original)
	} else {
		f = nil
	}
	p.flowsMu.Unlock()
	if f != nil {
		f.close()
	}
}

// Flows returns the number of live proxied flows.
func (p *Proxy) Flows() int {
	p.flowsMu.Lock()
	defer p.flowsMu.Unlock()
	return len(p.flows)
}

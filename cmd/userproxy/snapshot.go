package main

// The handover's snapshot (package handover's container): what the
// running process hands the next one besides descriptors. Two sections:
//
//	link   the TUN device: name, MTU, offloads, its queues (the first
//	       descriptors, in order), whether run created it, and the routes
//	       run added (the next process removes them when it exits)
//	flows  the translated TCP flows: each one's conntrack entry, its TCP
//	       state, its endpoint and service port (its socket is the
//	       descriptor after the queues, at its index)
//	syns   SYNs whose endpoint dial was still running: the new process
//	       reads them as if from the TUN, and dials
//	balancing  the ClientIP affinity lists, persistence templates and
//	       rr/wrr positions per service port (proxy.Balancing); the new
//	       process restores them before it adopts the flows
//	udp    the UDP flows: each one's conntrack entry, its endpoint, service
//	       port and PROXY protocol setting (its socket is the descriptor
//	       after the TCP flows', at its index)
//
// Format 1 of package handover; a field added is a new format. A section
// added is not: a reader picks the sections it knows by id and skips the
// rest, and reads a missing balancing or udp section as no state, so a
// process of this build takes over from an older one (and loses only the
// pins). The other way round, an older taker counts descriptors it does
// not expect when UDP flows come with them, and refuses the handover: the
// old process serves on.

import (
	"bytes"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/handover"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

const (
	sectionLink      = 1
	sectionFlows     = 2
	sectionSYNs      = 3
	sectionBalancing = 4
	sectionUDP       = 5
	sectionHost      = 6
	sectionListeners = 7
)

// maxSYN bounds a SYN read from a snapshot: IP and TCP headers with every
// option.
const maxSYN = 40 + 60 + 60

// linkState is the snapshot's link section.
type linkState struct {
	name    string
	mtu     uint32
	vnet    bool
	queues  int
	created bool
	routes  []netip.Prefix
	// listeners names the listeners lent (listenerLender), in the order
	// of their descriptors, after the flows' (the listeners section).
	listeners []string
	// balancing is the balancing section. It rides with the link to
	// adoptFlows (takeOver hands the link on as to.link), which restores
	// it into the proxy.
	balancing proxy.Balancing
}

// maxTimer bounds a timer read from a snapshot: the longest conntrack
// timeout there is (kube-proxy's --conntrack-tcp-timeout-established can
// be days) with room to spare.
const maxTimer = 365 * 24 * time.Hour

func encodeSnapshot(l linkState, moved proxy.Moved, syns [][]byte) []byte {
	flows := moved.TCP
	var s handover.Snapshot
	s.Section(sectionLink, func(e *handover.Enc) {
		e.String(l.name)
		e.U32(l.mtu)
		e.Bool(l.vnet)
		e.U32(uint32(l.queues))
		e.Bool(l.created)
		e.U32(uint32(len(l.routes)))
		for _, p := range l.routes {
			e.Addr(p.Addr())
			e.U8(uint8(p.Bits()))
		}
	})
	s.Section(sectionFlows, func(e *handover.Enc) {
		e.U32(uint32(len(flows)))
		for i := range flows {
			encodeFlow(e, &flows[i])
		}
	})
	syns = slices.DeleteFunc(slices.Clone(syns), func(p []byte) bool { return len(p) > maxSYN }) // with data: the client sends it again
	s.Section(sectionSYNs, func(e *handover.Enc) {
		e.U32(uint32(len(syns)))
		for _, p := range syns {
			e.Bytes(p)
		}
	})
	s.Section(sectionBalancing, func(e *handover.Enc) { encodeBalancing(e, &l.balancing) })
	s.Section(sectionUDP, func(e *handover.Enc) {
		e.U32(uint32(len(moved.UDP)))
		for i := range moved.UDP {
			encodeUDPFlow(e, &moved.UDP[i])
		}
	})
	s.Section(sectionListeners, func(e *handover.Enc) {
		e.U32(uint32(len(l.listeners)))
		for _, name := range l.listeners {
			e.String(name)
		}
	})
	s.Section(sectionHost, func(e *handover.Enc) {
		e.U32(uint32(len(moved.Host)))
		for i := range moved.Host {
			encodeHostFlow(e, &moved.Host[i])
		}
	})
	return s.Bytes()
}

// encodeEntry writes a saved conntrack entry's fields but its TCP state.
func encodeEntry(e *handover.Enc, en *conntrack.Saved) {
	e.U8(uint8(en.Original.Proto()))
	e.AddrPort(en.Original.Src())
	e.AddrPort(en.Original.Dst())
	e.U8(uint8(en.Status))
	for _, v := range [4]uint64{en.Packets[0], en.Packets[1], en.Bytes[0], en.Bytes[1]} {
		e.U64(v)
	}
	e.Duration(en.Age)
	e.Duration(en.Idle)
	e.Duration(en.Timeout)
}

func encodeUDPFlow(e *handover.Enc, f *proxy.MovedUDP) {
	encodeEntry(e, &f.Entry)
	e.AddrPort(f.Endpoint)
	e.String(f.ServicePort)
	e.U8(uint8(f.ProxyProtocol))
}

func encodeFlow(e *handover.Enc, f *proxy.MovedFlow) {
	en := &f.Entry
	encodeEntry(e, en)
	e.Bytes(en.TCP[:])
	m := &f.TCP
	e.Bool(m.SynRcvd)
	for _, v := range [...]uint32{m.IRS, m.RcvNxt, m.RcvAdv, m.RcvWnd, m.ISS, m.SndUna, m.SndNxt, m.SndMax, m.SndWnd, m.MaxSndWnd,
		m.Recover, m.SndWl1, m.SndWl2, m.TSRecent, m.TSNow, m.Cwnd, m.Ssthresh} {
		e.U32(v)
	}
	e.U8(m.RcvShift)
	e.U8(m.SndShift)
	e.U8(uint8(m.PeerWS))
	e.U16(m.AdvMSS)
	e.U16(m.MSS)
	e.U16(m.DupThresh)
	e.U8(m.ReoMult)
	for _, b := range [...]bool{m.FinIn, m.SockFull, m.FinSent, m.FinSeen, m.SackOK, m.TS, m.Measured, m.ReoSeen} {
		e.Bool(b)
	}
	for _, d := range [...]time.Duration{m.SRTT, m.RTTVar, m.MinRTT, m.ReoDelay} {
		e.Duration(d)
	}
	e.AddrPort(f.Endpoint)
	e.String(f.ServicePort)
}

// decodeSnapshot reads a snapshot; every field is bounded, and what the
// flows' own checks (conntrack.Restore, translate.Restore) refuse is
// refused there, flow by flow.
func decodeSnapshot(b []byte) (linkState, proxy.Moved, [][]byte, error) {
	secs, err := handover.Sections(b)
	if err != nil {
		return linkState{}, proxy.Moved{}, nil, err
	}
	var l linkState
	d := handover.NewDec(secs[sectionLink])
	l.name = d.String()
	l.mtu = d.U32()
	l.vnet = d.Bool()
	l.queues = int(d.U32())
	l.created = d.Bool()
	for n := d.Count(2); n > 0; n-- {
		a := d.Addr()
		bits := int(d.U8())
		p, err := a.Prefix(bits)
		if err != nil || !a.IsValid() {
			d.Fail("a route of %v/%d", a, bits)
			break
		}
		l.routes = append(l.routes, p)
	}
	if err := d.End(); err != nil {
		return linkState{}, proxy.Moved{}, nil, fmt.Errorf("link section: %w", err)
	}
	if l.name == "" || l.queues < 1 || l.queues > 1024 || l.mtu < 576 || l.mtu > 65535 {
		return linkState{}, proxy.Moved{}, nil, fmt.Errorf("%w: link %q, %d queues, MTU %d", handover.ErrCorrupt, l.name, l.queues, l.mtu)
	}
	d = handover.NewDec(secs[sectionFlows])
	flows := decodeFlows(d, 64, decodeFlow, func(f *proxy.MovedFlow) conntrack.Tuple { return f.Entry.Original })
	if err := d.End(); err != nil {
		return linkState{}, proxy.Moved{}, nil, fmt.Errorf("flows section: %w", err)
	}
	d = handover.NewDec(secs[sectionSYNs])
	var syns [][]byte
	for n := d.Count(4); n > 0 && d.Err() == nil; n-- {
		p := d.Bytes()
		if len(p) < 40 || len(p) > maxSYN {
			d.Fail("a SYN of %d bytes", len(p))
		}
		syns = append(syns, bytes.Clone(p))
	}
	if err := d.End(); err != nil {
		return linkState{}, proxy.Moved{}, nil, fmt.Errorf("SYNs section: %w", err)
	}
	if b, ok := secs[sectionBalancing]; ok { // none from a build before it
		d = handover.NewDec(b)
		l.balancing = decodeBalancing(d)
		if err := d.End(); err != nil {
			return linkState{}, proxy.Moved{}, nil, fmt.Errorf("balancing section: %w", err)
		}
	}
	var udp []proxy.MovedUDP
	if b, ok := secs[sectionUDP]; ok { // none from a build before it
		d = handover.NewDec(b)
		udp = decodeFlows(d, minUDPFlow, decodeUDPFlow, func(f *proxy.MovedUDP) conntrack.Tuple { return f.Entry.Original })
		if err := d.End(); err != nil {
			return linkState{}, proxy.Moved{}, nil, fmt.Errorf("UDP section: %w", err)
		}
	}
	if b, ok := secs[sectionListeners]; ok { // none from a build before it
		d = handover.NewDec(b)
		for n := d.Count(4); n > 0 && d.Err() == nil; n-- {
			name := d.String()
			if len(name) == 0 || len(name) > 128 || slices.Contains(l.listeners, name) {
				d.Fail("a listener named %q", name)
			}
			l.listeners = append(l.listeners, name)
		}
		if err := d.End(); err != nil {
			return linkState{}, proxy.Moved{}, nil, fmt.Errorf("listeners section: %w", err)
		}
	}
	var host []proxy.MovedHost
	if b, ok := secs[sectionHost]; ok { // none from a build before it
		d = handover.NewDec(b)
		host = decodeFlows(d, minHostFlow, decodeHostFlow, func(f *proxy.MovedHost) conntrack.Tuple { return f.Entry.Original })
		if err := d.End(); err != nil {
			return linkState{}, proxy.Moved{}, nil, fmt.Errorf("host flows section: %w", err)
		}
	}
	return l, proxy.Moved{TCP: flows, UDP: udp, Host: host}, syns, nil
}

// A host TCP flow (a NodePort connection: hostmove.go) is its conntrack
// entry with its TCP state, its endpoint and service port, and per
// direction the bytes its copier held and whether it had reached EOF.

func encodeHostFlow(e *handover.Enc, f *proxy.MovedHost) {
	encodeEntry(e, &f.Entry)
	e.Bytes(f.Entry.TCP[:])
	e.AddrPort(f.Endpoint)
	e.String(f.ServicePort)
	for dir := range 2 {
		e.Bytes(f.Pending[dir])
		e.Bool(f.EOF[dir])
	}
}

// minHostFlow is the least bytes a flow of the host section takes.
const minHostFlow = minUDPFlow - 1 + 4 + 2*(4+1)

// maxHostPending bounds a host flow's held bytes per direction: a
// copier's largest buffer (proxy's bulk buffer).
const maxHostPending = 1 << 20

func decodeHostFlow(d *handover.Dec) proxy.MovedHost {
	var f proxy.MovedHost
	en := &f.Entry
	if decodeEntry(d, en, conntrack.TCP); d.Err() != nil {
		return f
	}
	if tcp := d.Bytes(); len(tcp) == len(en.TCP) {
		copy(en.TCP[:], tcp)
	} else {
		d.Fail("TCP conntrack state of %d bytes", len(tcp))
	}
	f.Endpoint = d.AddrPort()
	f.ServicePort = d.String()
	for dir := range 2 {
		p := d.Bytes()
		if len(p) > maxHostPending {
			d.Fail("a host flow holding %d bytes", len(p))
		}
		if len(p) > 0 {
			f.Pending[dir] = bytes.Clone(p)
		}
		f.EOF[dir] = d.Bool()
	}
	if d.Err() == nil && !f.Endpoint.IsValid() {
		d.Fail("a host flow to %v", f.Endpoint)
	}
	return f
}

// decodeEntry reads what encodeEntry wrote, of a flow of protocol want.
func decodeEntry(d *handover.Dec, en *conntrack.Saved, want conntrack.Protocol) {
	proto := conntrack.Protocol(d.U8())
	src, dst := d.AddrPort(), d.AddrPort()
	if proto != want || !src.IsValid() || !dst.IsValid() || src.Addr().Is4() != dst.Addr().Is4() {
		d.Fail("a flow of protocol %d from %v to %v", proto, src, dst)
		return
	}
	en.Original = conntrack.MakeTuple(proto, src, dst)
	en.Status = conntrack.Status(d.U8())
	en.Packets[0], en.Packets[1], en.Bytes[0], en.Bytes[1] = d.U64(), d.U64(), d.U64(), d.U64()
	en.Age, en.Idle, en.Timeout = d.Duration(maxTimer), d.Duration(maxTimer), d.Duration(maxTimer)
}

// minUDPFlow is the least bytes a UDP flow of the udp section takes.
const minUDPFlow = 1 + 2*3 + 1 + 4*8 + 3*8 + 3 + 4 + 1

// decodeFlows reads a count and that many flows of at least each bytes
// (decode reads one), and fails on a flow (by its tuple, key) twice.
func decodeFlows[F any](d *handover.Dec, each int, decode func(*handover.Dec) F, key func(*F) conntrack.Tuple) []F {
	n := d.Count(each)
	flows := make([]F, 0, n)
	seen := make(map[conntrack.Tuple]bool, n)
	for range n {
		f := decode(d)
		if d.Err() != nil {
			break
		}
		k := key(&f)
		if seen[k] {
			d.Fail("flow %v twice", k)
			break
		}
		seen[k] = true
		flows = append(flows, f)
	}
	return flows
}

func decodeUDPFlow(d *handover.Dec) proxy.MovedUDP {
	var f proxy.MovedUDP
	decodeEntry(d, &f.Entry, conntrack.UDP)
	f.Endpoint = d.AddrPort()
	f.ServicePort = d.String()
	f.ProxyProtocol = proxy.ProxyProtocol(d.U8())
	if d.Err() == nil && (!f.Endpoint.IsValid() || f.ProxyProtocol > proxy.ProxyProtocolV2) {
		d.Fail("a UDP flow to %v with PROXY protocol %d", f.Endpoint, f.ProxyProtocol)
	}
	return f
}

func decodeFlow(d *handover.Dec) proxy.MovedFlow {
	var f proxy.MovedFlow
	en := &f.Entry
	if decodeEntry(d, en, conntrack.TCP); d.Err() != nil {
		return f
	}
	if tcp := d.Bytes(); len(tcp) == len(en.TCP) {
		copy(en.TCP[:], tcp)
	} else {
		d.Fail("TCP conntrack state of %d bytes", len(tcp))
	}
	m := &f.TCP
	m.SynRcvd = d.Bool()
	for _, p := range [...]*uint32{&m.IRS, &m.RcvNxt, &m.RcvAdv, &m.RcvWnd, &m.ISS, &m.SndUna, &m.SndNxt, &m.SndMax, &m.SndWnd, &m.MaxSndWnd,
		&m.Recover, &m.SndWl1, &m.SndWl2, &m.TSRecent, &m.TSNow, &m.Cwnd, &m.Ssthresh} {
		*p = d.U32()
	}
	m.RcvShift, m.SndShift, m.PeerWS = d.U8(), d.U8(), int8(d.U8())
	m.AdvMSS, m.MSS, m.DupThresh = d.U16(), d.U16(), d.U16()
	m.ReoMult = d.U8()
	for _, p := range [...]*bool{&m.FinIn, &m.SockFull, &m.FinSent, &m.FinSeen, &m.SackOK, &m.TS, &m.Measured, &m.ReoSeen} {
		*p = d.Bool()
	}
	for _, p := range [...]*time.Duration{&m.SRTT, &m.RTTVar, &m.MinRTT, &m.ReoDelay} {
		*p = d.Duration(maxTimer)
	}
	f.Endpoint = d.AddrPort()
	f.ServicePort = d.String()
	return f
}

// The balancing section: per service port its name, protocol, family and
// scheduler, its xt_recent lists (endpoint key, then clients and ages),
// and its IPVS endpoint sets (which set, rr's or wrr's position, the
// persistence templates). The proxy and balancer check what the values
// mean (RestoreBalancing); the decoder checks their bounds.

func encodeBalancing(e *handover.Enc, b *proxy.Balancing) {
	e.U32(uint32(len(b.Ports)))
	for i := range b.Ports {
		p := &b.Ports[i]
		e.String(p.Name.Namespace)
		e.String(p.Name.Name)
		e.String(p.Name.Port)
		e.U8(uint8(p.Protocol))
		e.U8(uint8(p.Family))
		e.String(p.Scheduler)
		e.U32(uint32(len(p.Affinity)))
		for _, l := range p.Affinity {
			e.String(l.Endpoint)
			e.U32(uint32(len(l.Clients)))
			for _, c := range l.Clients {
				e.Addr(c.Addr)
				e.Duration(c.Age)
			}
		}
		e.U32(uint32(len(p.Sets)))
		for _, s := range p.Sets {
			e.U8(s.Set)
			e.Bool(s.Scheduler != nil)
			if v := s.Scheduler; v != nil {
				e.String(v.Name)
				e.U32(uint32(len(v.Endpoints)))
				for _, ep := range v.Endpoints {
					e.AddrPort(ep.Addr)
					e.U32(uint32(ep.Weight))
				}
				e.Int(int64(v.Cursor))
				e.Int(v.Weight)
			}
			e.U32(uint32(len(s.Templates)))
			for _, t := range s.Templates {
				e.Addr(t.Client)
				e.AddrPort(t.Dest)
				e.Duration(t.Idle)
				e.U32(uint32(t.Controls))
				e.Duration(t.Released)
				e.Bool(t.Rechecked)
			}
		}
	}
}

// The least bytes each item of the balancing section takes, for Count.
const (
	minBalancingPort = 3*4 + 2 + 4 + 4 + 4
	minSavedList     = 4 + 4
	minSavedClient   = 1 + 8
	minSavedSet      = 1 + 1 + 4
	minSavedEndpoint = 1 + 2 + 4
	minSavedTemplate = 1 + 3 + 8 + 4 + 8 + 1
)

func decodeBalancing(d *handover.Dec) proxy.Balancing {
	var b proxy.Balancing
	for n := d.Count(minBalancingPort); n > 0 && d.Err() == nil; n-- {
		var p proxy.PortBalancing
		p.Name.Namespace, p.Name.Name, p.Name.Port = d.String(), d.String(), d.String()
		p.Protocol, p.Family = service.Protocol(d.U8()), service.Family(d.U8())
		p.Scheduler = d.String()
		if (p.Protocol != service.TCP && p.Protocol != service.UDP) || (p.Family != service.IPv4 && p.Family != service.IPv6) {
			d.Fail("service port %v of protocol %d, family %d", p.Name, p.Protocol, p.Family)
		}
		for n := d.Count(minSavedList); n > 0 && d.Err() == nil; n-- {
			l := balancer.SavedList{Endpoint: d.String()}
			for n := d.Count(minSavedClient); n > 0 && d.Err() == nil; n-- {
				l.Clients = append(l.Clients, balancer.ClientAge{Addr: d.Addr(), Age: d.Duration(maxTimer)})
			}
			p.Affinity = append(p.Affinity, l)
		}
		for n := d.Count(minSavedSet); n > 0 && d.Err() == nil; n-- {
			p.Sets = append(p.Sets, decodeSavedSet(d))
		}
		b.Ports = append(b.Ports, p)
	}
	return b
}

func decodeSavedSet(d *handover.Dec) proxy.SetBalancing {
	s := proxy.SetBalancing{Set: d.U8()}
	if s.Set > 2 {
		d.Fail("endpoint set %d", s.Set)
	}
	if d.Bool() {
		v := balancer.SavedScheduler{Name: d.String()}
		for n := d.Count(minSavedEndpoint); n > 0 && d.Err() == nil; n-- {
			v.Endpoints = append(v.Endpoints, balancer.Endpoint{Addr: d.AddrPort(), Weight: int32(d.U32())})
		}
		cursor := d.Int()
		if cursor < -1 || cursor >= int64(len(v.Endpoints)) {
			d.Fail("a cursor of %d in %d endpoints", cursor, len(v.Endpoints))
		}
		v.Cursor, v.Weight = int(cursor), d.Int()
		s.Scheduler = &v
	}
	for n := d.Count(minSavedTemplate); n > 0 && d.Err() == nil; n-- {
		t := balancer.SavedTemplate{Client: d.Addr(), Dest: d.AddrPort(), Idle: d.Duration(maxTimer)}
		controls := d.U32()
		if controls > math.MaxInt32 {
			d.Fail("a template with %d connections", controls)
		}
		t.Controls, t.Released, t.Rechecked = int(controls), d.Duration(maxTimer), d.Bool()
		s.Templates = append(s.Templates, t)
	}
	return s
}

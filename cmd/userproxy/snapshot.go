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
//
// Format 1 of package handover; a field added is a new format.

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/handover"
	"github.com/userproxy/userproxy/proxy"
)

const (
	sectionLink  = 1
	sectionFlows = 2
	sectionSYNs  = 3
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
}

// maxTimer bounds a timer read from a snapshot: the longest conntrack
// timeout there is (kube-proxy's --conntrack-tcp-timeout-established can
// be days) with room to spare.
const maxTimer = 365 * 24 * time.Hour

func encodeSnapshot(l linkState, flows []proxy.MovedFlow, syns [][]byte) []byte {
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
	return s.Bytes()
}

func encodeFlow(e *handover.Enc, f *proxy.MovedFlow) {
	en := &f.Entry
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
func decodeSnapshot(b []byte) (linkState, []proxy.MovedFlow, [][]byte, error) {
	secs, err := handover.Sections(b)
	if err != nil {
		return linkState{}, nil, nil, err
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
		return linkState{}, nil, nil, fmt.Errorf("link section: %w", err)
	}
	if l.name == "" || l.queues < 1 || l.queues > 1024 || l.mtu < 576 || l.mtu > 65535 {
		return linkState{}, nil, nil, fmt.Errorf("%w: link %q, %d queues, MTU %d", handover.ErrCorrupt, l.name, l.queues, l.mtu)
	}
	d = handover.NewDec(secs[sectionFlows])
	n := d.Count(64)
	flows := make([]proxy.MovedFlow, 0, n)
	seen := make(map[conntrack.Tuple]bool, n)
	for range n {
		f := decodeFlow(d)
		if d.Err() != nil {
			break
		}
		if seen[f.Entry.Original] {
			d.Fail("flow %v twice", f.Entry.Original)
			break
		}
		seen[f.Entry.Original] = true
		flows = append(flows, f)
	}
	if err := d.End(); err != nil {
		return linkState{}, nil, nil, fmt.Errorf("flows section: %w", err)
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
		return linkState{}, nil, nil, fmt.Errorf("SYNs section: %w", err)
	}
	return l, flows, syns, nil
}

func decodeFlow(d *handover.Dec) proxy.MovedFlow {
	var f proxy.MovedFlow
	en := &f.Entry
	proto := conntrack.Protocol(d.U8())
	src, dst := d.AddrPort(), d.AddrPort()
	if proto != conntrack.TCP || !src.IsValid() || !dst.IsValid() || src.Addr().Is4() != dst.Addr().Is4() {
		d.Fail("a flow of protocol %d from %v to %v", proto, src, dst)
		return f
	}
	en.Original = conntrack.MakeTuple(proto, src, dst)
	en.Status = conntrack.Status(d.U8())
	en.Packets[0], en.Packets[1], en.Bytes[0], en.Bytes[1] = d.U64(), d.U64(), d.U64(), d.U64()
	en.Age, en.Idle, en.Timeout = d.Duration(maxTimer), d.Duration(maxTimer), d.Duration(maxTimer)
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

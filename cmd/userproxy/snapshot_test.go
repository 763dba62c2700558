package main

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/handover"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
)

// testSnapshot is a link and two flows with every field set.
func testSnapshot() (linkState, []proxy.MovedFlow) {
	l := linkState{name: "userproxy0", mtu: 65520, vnet: true, queues: 2, created: true,
		routes: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:96::/112")}}
	var flows []proxy.MovedFlow
	for i, c := range []struct{ src, dst, ep string }{
		{"10.0.0.7:40000", "10.96.0.10:80", "10.244.1.5:8080"},
		{"[fd00::7]:40001", "[fd00:96::10]:443", "[fd00:244::5]:8443"},
	} {
		f := proxy.MovedFlow{
			Entry: conntrack.Saved{
				Original: conntrack.MakeTuple(conntrack.TCP, netip.MustParseAddrPort(c.src), netip.MustParseAddrPort(c.dst)),
				Status:   conntrack.StatusSeenReply | conntrack.StatusAssured, Packets: [2]uint64{10, 20}, Bytes: [2]uint64{1000, 20000},
				Age: time.Minute, Idle: time.Second, Timeout: 24 * time.Hour,
			},
			TCP: netstack.MovedTCP{IRS: 1, RcvNxt: 2, RcvAdv: 3, RcvWnd: 4, RcvShift: 7, FinIn: true, SockFull: true,
				ISS: 5, SndUna: 6, SndNxt: 7, SndMax: 8, SndWnd: 9, MaxSndWnd: 10, Recover: 11, SndWl1: 12, SndWl2: 13,
				SndShift: 7, PeerWS: -1, AdvMSS: 1460, MSS: 1400, FinSent: true, FinSeen: true, DupThresh: 3,
				SackOK: true, TS: true, TSRecent: 14, TSNow: 15, Cwnd: 16, Ssthresh: 17, SRTT: time.Millisecond,
				RTTVar: 2 * time.Millisecond, Measured: true, MinRTT: 3 * time.Millisecond, ReoDelay: 4 * time.Millisecond,
				ReoSeen: true, ReoMult: 2},
			Endpoint: netip.MustParseAddrPort(c.ep), ServicePort: "default/web:http",
		}
		f.Entry.TCP[0] = byte(i + 1)
		f.TCP.SynRcvd = i == 1
		flows = append(flows, f)
	}
	return l, flows
}

// TestSnapshotRoundTrip: the link and every field of every flow read back
// as written.
func TestSnapshotRoundTrip(t *testing.T) {
	l, flows := testSnapshot()
	syns := [][]byte{make([]byte, 60), make([]byte, 80)}
	syns[0][0], syns[1][0] = 0x45, 0x60
	gotL, gotFlows, gotSYNs, err := decodeSnapshot(encodeSnapshot(l, flows, syns))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotSYNs, syns) {
		t.Errorf("SYNs: %x, want %x", gotSYNs, syns)
	}
	if !reflect.DeepEqual(gotL, l) {
		t.Errorf("link: %+v, want %+v", gotL, l)
	}
	if !reflect.DeepEqual(gotFlows, flows) {
		t.Errorf("flows:\n%+v\nwant\n%+v", gotFlows, flows)
	}
}

// TestSnapshotDecodeRefuses: a link the taker cannot use, and a flow that
// is not TCP, are refused as corrupt.
func TestSnapshotDecodeRefuses(t *testing.T) {
	l, flows := testSnapshot()
	bad := l
	bad.queues = 0
	if _, _, _, err := decodeSnapshot(encodeSnapshot(bad, flows, nil)); !errors.Is(err, handover.ErrCorrupt) {
		t.Errorf("no queues: %v", err)
	}
	if _, _, _, err := decodeSnapshot(encodeSnapshot(l, []proxy.MovedFlow{flows[0], flows[0]}, nil)); !errors.Is(err, handover.ErrCorrupt) {
		t.Errorf("a flow twice: %v", err)
	}
	udp := flows[0]
	udp.Entry.Original = conntrack.MakeTuple(conntrack.UDP, udp.Entry.Original.Src(), udp.Entry.Original.Dst())
	if _, _, _, err := decodeSnapshot(encodeSnapshot(l, []proxy.MovedFlow{udp}, nil)); !errors.Is(err, handover.ErrCorrupt) {
		t.Errorf("a UDP flow: %v", err)
	}
}

// FuzzDecodeSnapshot: any bytes, and any body in a valid container, decode
// to an error or to values within their bounds, never a panic.
func FuzzDecodeSnapshot(f *testing.F) {
	l, flows := testSnapshot()
	f.Add(encodeSnapshot(l, flows, [][]byte{make([]byte, 60)}))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, wrapBody(b)} {
			l, flows, syns, err := decodeSnapshot(in)
			if err != nil {
				continue
			}
			if l.queues < 1 || l.queues > 1024 || len(flows) > len(in) || len(syns) > len(in) {
				t.Fatalf("decoded %d queues, %d flows from %d bytes", l.queues, len(flows), len(in))
			}
		}
	})
}

// wrapBody puts b in a snapshot's header, so that the fuzzer's bytes reach
// the sections.
func wrapBody(b []byte) []byte {
	var s handover.Snapshot
	if len(b) >= 2 {
		s.Section(sectionLink, func(e *handover.Enc) {
			e.String("userproxy0")
			e.U32(1500)
			e.Bool(true)
			e.U32(1)
			e.Bool(false)
			e.U32(0)
		})
		s.Section(sectionFlows, func(e *handover.Enc) { e.U32(uint32(b[0])); appendRaw(e, b[1:]) })
		s.Section(sectionSYNs, func(e *handover.Enc) { e.U32(0) })
	}
	return s.Bytes()
}

func appendRaw(e *handover.Enc, b []byte) {
	for _, c := range b {
		e.U8(c)
	}
}

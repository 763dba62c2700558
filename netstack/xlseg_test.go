package netstack

import (
	"bytes"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

func testSegWriter(t *testing.T, svc, client string) *segWriter {
	t.Helper()
	s, c := netip.MustParseAddrPort(svc), netip.MustParseAddrPort(client)
	w := &segWriter{v6: s.Addr().Is6(), sport: s.Port(), dport: c.Port()}
	w.src, w.dst = tcpip.AddrFromSlice(s.Addr().AsSlice()), tcpip.AddrFromSlice(c.Addr().AsSlice())
	return w
}

// TestSegmentRoundTrip: what build writes, parseClientSeg reads back, and its
// checksums are the ones a receiving kernel verifies.
func TestSegmentRoundTrip(t *testing.T) {
	for _, tc := range []struct{ svc, client string }{
		{"10.96.0.10:80", "10.0.0.7:40000"},
		{"[fd00:96::10]:443", "[fd00::7]:40001"},
	} {
		w := testSegWriter(t, tc.svc, tc.client)
		payload := []byte("hello, client")
		opts := tsOption(nil, 0x01020304, 0xa0b0c0d0)
		p := make([]byte, 200)
		n := w.build(p, 1000, 2000, tcpACK|0x08, 512, opts, payload)
		p = p[:n]

		if w.v6 {
			ip := header.IPv6(p)
			if ip.PayloadLength() != uint16(n-header.IPv6MinimumSize) || ip.HopLimit() != replyTTL {
				t.Fatalf("%s: IPv6 header %x", tc.svc, p[:40])
			}
		} else {
			ip := header.IPv4(p)
			if !ip.IsChecksumValid() || int(ip.TotalLength()) != n || ip.TTL() != replyTTL {
				t.Fatalf("%s: IPv4 header %x", tc.svc, p[:20])
			}
		}
		th := header.TCP(p[w.ipLen():])
		if !th.IsChecksumValid(w.src, w.dst, checksum.Checksum(payload, 0), uint16(len(payload))) {
			t.Errorf("%s: TCP checksum not valid", tc.svc)
		}
		if th.SourcePort() != w.sport || th.DestinationPort() != w.dport {
			t.Errorf("%s: ports %d -> %d", tc.svc, th.SourcePort(), th.DestinationPort())
		}

		s, ok := parseClientSeg(p)
		if !ok {
			t.Fatalf("%s: not parsed", tc.svc)
		}
		if s.seq != 1000 || s.ack != 2000 || s.flags != tcpACK|0x08 || s.wnd != 512 {
			t.Errorf("%s: fields %+v", tc.svc, s)
		}
		if !s.ts || s.tsVal != 0x01020304 || s.tsEcr != 0xa0b0c0d0 || s.mss != 0 || s.ws != -1 {
			t.Errorf("%s: options %+v", tc.svc, s)
		}
		if !bytes.Equal(s.payload, payload) {
			t.Errorf("%s: payload %q", tc.svc, s.payload)
		}
		// Link padding after the IP datagram is not payload.
		if s, _ := parseClientSeg(append(p[:n:n], 0, 0, 0, 0)); !bytes.Equal(s.payload, payload) {
			t.Errorf("%s: padded payload %q", tc.svc, s.payload)
		}
	}
}

// TestSynAckOptions: the SYN-ACK offers window scaling and timestamps only
// when the SYN did (RFC 7323 1.3, 3.2), as gVisor's parser of a SYN-ACK
// reads them.
func TestSynAckOptions(t *testing.T) {
	w := testSegWriter(t, "10.96.0.10:80", "10.0.0.7:40000")
	full := clientSeg{ws: 7, ts: true, tsVal: 99}
	bare := clientSeg{ws: -1}
	for _, tc := range []struct {
		name string
		syn  clientSeg
	}{{"full", full}, {"bare", bare}} {
		opts := synAckOptions(nil, tc.syn, 1460, 9, 5000)
		if len(opts)%4 != 0 {
			t.Fatalf("%s: options of %d bytes", tc.name, len(opts))
		}
		p := make([]byte, 100)
		n := w.build(p, 1, 100, tcpSYN|tcpACK, 65535, opts, nil)
		th := header.TCP(p[header.IPv4MinimumSize:n])
		got := header.ParseSynOptions(th.Options(), true)
		if got.MSS != 1460 {
			t.Errorf("%s: MSS %d", tc.name, got.MSS)
		}
		wantWS := -1
		if tc.syn.ws >= 0 {
			wantWS = 9
		}
		if got.WS != wantWS {
			t.Errorf("%s: window scale %d, want %d", tc.name, got.WS, wantWS)
		}
		if got.TS != tc.syn.ts || (got.TS && (got.TSVal != 5000 || got.TSEcr != 99)) {
			t.Errorf("%s: timestamps %v %d %d", tc.name, got.TS, got.TSVal, got.TSEcr)
		}
		if got.SACKPermitted {
			t.Errorf("%s: SACK offered", tc.name)
		}
	}
}

// TestParseSegmentOptions: a SYN's options, a window scale over 14 read as
// 14 (RFC 7323 2.3), and malformed options read no further than they are
// whole.
func TestParseSegmentOptions(t *testing.T) {
	w := testSegWriter(t, "10.96.0.10:80", "10.0.0.7:40000")
	for _, tc := range []struct {
		name string
		opts []byte
		want clientSeg
	}{
		{"syn", []byte{2, 4, 0x05, 0xb4, 4, 2, 1, 3, 3, 7}, clientSeg{mss: 1460, sackOK: true, ws: 7}},
		{"big shift", []byte{1, 3, 3, 15}, clientSeg{ws: 14}},
		{"cut length", []byte{2, 4, 0x05, 0xb4, 8, 10, 0, 0}, clientSeg{mss: 1460, ws: -1}},
		{"zero length", []byte{8, 0, 2, 4}, clientSeg{ws: -1}},
		{"end of list", []byte{0, 0, 2, 4, 0x05, 0xb4, 1, 1}, clientSeg{ws: -1}},
	} {
		opts := append([]byte(nil), tc.opts...)
		for len(opts)%4 != 0 {
			opts = append(opts, 0)
		}
		p := make([]byte, 100)
		n := w.build(p, 1, 0, tcpSYN, 1000, opts, nil)
		s, ok := parseClientSeg(p[:n])
		if !ok {
			t.Fatalf("%s: not parsed", tc.name)
		}
		if s.mss != tc.want.mss || s.ws != tc.want.ws || s.sackOK != tc.want.sackOK || s.ts != tc.want.ts {
			t.Errorf("%s: %+v, want %+v", tc.name, s, tc.want)
		}
	}
	// A data offset past the segment is not a segment.
	p := make([]byte, 100)
	n := w.build(p, 1, 0, tcpSYN, 1000, nil, nil)
	p[header.IPv4MinimumSize+12] = 15 << 4
	if _, ok := parseClientSeg(p[:n]); ok {
		t.Error("a data offset of 60 bytes in a 20-byte header parsed")
	}
}

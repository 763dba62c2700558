package translate

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
)

// TestSegmentRoundTrip: what Build writes, Parse reads back, and its
// checksums sum to zero as a receiving kernel checks them (the tests' own
// RFC 1071 sum). netstack's tests hold the same segments against gVisor's
// parsers.
func TestSegmentRoundTrip(t *testing.T) {
	for _, tc := range []struct{ svc, client string }{
		{"10.96.0.10:80", "10.0.0.7:40000"},
		{"[fd00:96::10]:443", "[fd00::7]:40001"},
	} {
		w := testWriter(tc.svc, tc.client)
		payload := []byte("hello, client")
		opts := tsOption(nil, 0x01020304, 0xa0b0c0d0)
		p := make([]byte, 200)
		n := w.Build(p, 1000, 2000, tcpACK|tcpPSH, 512, opts, payload)
		p = p[:n]
		svc, client := netip.MustParseAddrPort(tc.svc), netip.MustParseAddrPort(tc.client)
		var pseudo []byte
		if w.v6 {
			if p[0]>>4 != 6 || int(binary.BigEndian.Uint16(p[4:])) != n-40 || p[6] != 6 || p[7] != ttl {
				t.Fatalf("%s: IPv6 header %x", tc.svc, p[:40])
			}
			a, b := svc.Addr().As16(), client.Addr().As16()
			pseudo = append(append(pseudo, a[:]...), b[:]...)
		} else {
			if naiveChecksum(p[:20]) != 0xffff || int(binary.BigEndian.Uint16(p[2:])) != n || p[8] != ttl || p[9] != 6 {
				t.Fatalf("%s: IPv4 header %x", tc.svc, p[:20])
			}
			a, b := svc.Addr().As4(), client.Addr().As4()
			pseudo = append(append(pseudo, a[:]...), b[:]...)
		}
		tcp := p[w.IPLen():]
		pseudo = append(pseudo, 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
		if naiveChecksum(append(pseudo, tcp...)) != 0xffff {
			t.Errorf("%s: TCP checksum not valid", tc.svc)
		}
		if binary.BigEndian.Uint16(tcp) != svc.Port() || binary.BigEndian.Uint16(tcp[2:]) != client.Port() {
			t.Errorf("%s: ports %x", tc.svc, tcp[:4])
		}
		s, ok := parseIP(p)
		if !ok {
			t.Fatalf("%s: not parsed", tc.svc)
		}
		if s.seq != 1000 || s.ack != 2000 || s.flags != tcpACK|tcpPSH || s.wnd != 512 {
			t.Errorf("%s: fields %+v", tc.svc, s)
		}
		if !s.ts || s.tsVal != 0x01020304 || s.tsEcr != 0xa0b0c0d0 || s.mss != 0 || s.ws != -1 {
			t.Errorf("%s: options %+v", tc.svc, s)
		}
		if !bytes.Equal(s.payload, payload) {
			t.Errorf("%s: payload %q", tc.svc, s.payload)
		}
		// Link padding after the IP datagram is not payload.
		if s, _ := parseIP(append(p[:n:n], 0, 0, 0, 0)); !bytes.Equal(s.payload, payload) {
			t.Errorf("%s: padded payload %q", tc.svc, s.payload)
		}
	}
}

// TestParseOptions: a SYN's options, a window scale over 14 read as 14
// (RFC 7323 2.3), SACK blocks (RFC 2018 3), and malformed options read no
// further than they are whole.
func TestParseOptions(t *testing.T) {
	w := testWriter("10.0.0.7:40000", "10.96.0.10:80")
	for _, tc := range []struct {
		name string
		opts []byte
		want Segment
	}{
		{"syn", []byte{2, 4, 0x05, 0xb4, 4, 2, 1, 3, 3, 7}, Segment{mss: 1460, sackOK: true, ws: 7}},
		{"big shift", []byte{1, 3, 3, 15}, Segment{ws: 14}},
		{"cut length", []byte{2, 4, 0x05, 0xb4, 8, 10, 0, 0}, Segment{mss: 1460, ws: -1}},
		{"zero length", []byte{8, 0, 2, 4}, Segment{ws: -1}},
		{"end of list", []byte{0, 0, 2, 4, 0x05, 0xb4, 1, 1}, Segment{ws: -1}},
		{"sack", []byte{1, 1, 5, 18, 0, 0, 0, 10, 0, 0, 0, 20, 0, 0, 0, 30, 0, 0, 0, 40}, Segment{ws: -1, nSack: 2, sack: [4]seqRange{{10, 20}, {30, 40}}}},
		{"sack odd length", []byte{1, 1, 5, 14, 0, 0, 0, 10, 0, 0, 0, 20, 0, 0, 0, 30}, Segment{ws: -1}},
	} {
		opts := append([]byte(nil), tc.opts...)
		for len(opts)%4 != 0 {
			opts = append(opts, 0)
		}
		p := make([]byte, 100)
		n := w.Build(p, 1, 0, tcpSYN, 1000, opts, nil)
		s, ok := parseIP(p[:n])
		if !ok {
			t.Fatalf("%s: not parsed", tc.name)
		}
		if s.mss != tc.want.mss || s.ws != tc.want.ws || s.sackOK != tc.want.sackOK || s.ts != tc.want.ts || s.nSack != tc.want.nSack || s.sack != tc.want.sack {
			t.Errorf("%s: %+v, want %+v", tc.name, s, tc.want)
		}
	}
	// A data offset past the segment is not a segment.
	p := make([]byte, 100)
	n := w.Build(p, 1, 0, tcpSYN, 1000, nil, nil)
	p[20+12] = 15 << 4
	if _, ok := parseIP(p[:n]); ok {
		t.Error("a data offset of 60 bytes in a 20-byte header parsed")
	}
	if _, ok := Parse(make([]byte, 19)); ok {
		t.Error("19 bytes parsed as a segment")
	}
}

// TestChecksumSum: the writer's sum, eight bytes at a time, agrees with
// the naive one on every length and alignment.
func TestChecksumSum(t *testing.T) {
	b := make([]byte, 300)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	for off := range 3 {
		for n := 0; off+n <= len(b); n += 13 {
			if got, want := fold(sum(0, b[off:off+n])), naiveChecksum(b[off:off+n]); got != want && !(got == 0xffff && want == 0) && !(got == 0 && want == 0xffff) {
				t.Fatalf("offset %d, %d bytes: %#x, want %#x", off, n, got, want)
			}
		}
	}
}

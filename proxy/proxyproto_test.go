package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/userproxy/userproxy/service"
)

// The encoder's tests hold it against hand-written bytes and against a
// receiver written here from HAProxy's proxy-protocol.txt (sections 2.1,
// 2.2), which shares no code with proxyproto.go: it does not print or parse
// addresses with netip, and it is as strict as the spec lets a receiver be.

// ppHeader is what the test receiver read from one header.
type ppHeader struct {
	version  int    // 1 or 2
	command  byte   // v2: 0x1 PROXY (v1 has only PROXY)
	proto    string // TCP4, TCP6, UDP4, UDP6
	src, dst netip.AddrPort
	tlvs     int // v2: bytes after the address block
	length   int // bytes the whole header took
}

var ppSignature = []byte("\r\n\r\n\x00\r\nQUIT\n")

// ppParse decodes the one header at the start of b, telling the versions
// apart as section 2.2 says a receiver of both does.
func ppParse(b []byte) (ppHeader, error) {
	switch {
	case len(b) >= 16 && bytes.Equal(b[:12], ppSignature) && b[12]>>4 == 2:
		return ppParseV2(b)
	case len(b) >= 8 && string(b[:5]) == "PROXY":
		return ppParseV1(b)
	}
	return ppHeader{}, fmt.Errorf("not a PROXY protocol header: % x", b[:min(len(b), 16)])
}

// ppParseV1 decodes a section 2.1 line: CRLF within the first 107 bytes, no
// lone CR or LF before it, fields separated by exactly one space.
func ppParseV1(b []byte) (ppHeader, error) {
	end := bytes.Index(b[:min(len(b), 107)], []byte("\r\n"))
	if end < 0 {
		return ppHeader{}, errors.New("v1: no CRLF in the first 107 bytes")
	}
	line := string(b[:end])
	if strings.ContainsAny(line, "\r\n") {
		return ppHeader{}, fmt.Errorf("v1: lone CR or LF in %q", line)
	}
	f := strings.Split(line, " ")
	if len(f) != 6 || f[0] != "PROXY" {
		return ppHeader{}, fmt.Errorf("v1: %q is not PROXY and five fields", line)
	}
	var parseAddr func(string) (netip.Addr, error)
	switch f[1] {
	case "TCP4":
		parseAddr = ppParseIPv4
	case "TCP6":
		parseAddr = ppParseIPv6
	default: // UNKNOWN is legal, but nothing here should send it
		return ppHeader{}, fmt.Errorf("v1: protocol %q", f[1])
	}
	h := ppHeader{version: 1, command: 0x1, proto: f[1], length: end + 2}
	var addrs [2]netip.Addr
	var ports [2]uint16
	for i := range 2 {
		var err error
		if addrs[i], err = parseAddr(f[2+i]); err != nil {
			return ppHeader{}, fmt.Errorf("v1 %s: %w", f[1], err)
		}
		if ports[i], err = ppParsePort(f[4+i]); err != nil {
			return ppHeader{}, fmt.Errorf("v1: %w", err)
		}
	}
	h.src, h.dst = netip.AddrPortFrom(addrs[0], ports[0]), netip.AddrPortFrom(addrs[1], ports[1])
	return h, nil
}

// ppDecimal parses a decimal number of 1 to maxDigits digits, refusing
// leading zeros ("heading zeroes are not permitted").
func ppDecimal(s string, maxDigits int, limit uint64) (uint64, error) {
	if s == "" || len(s) > maxDigits || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("number %q: empty, too long or a leading zero", s)
	}
	var n uint64
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("number %q: not decimal", s)
		}
		n = n*10 + uint64(c-'0')
	}
	if n > limit {
		return 0, fmt.Errorf("number %q above %d", s, limit)
	}
	return n, nil
}

func ppParsePort(s string) (uint16, error) {
	n, err := ppDecimal(s, 5, 65535)
	return uint16(n), err
}

// ppParseIPv4 reads exactly four decimal numbers 0..255 joined by dots.
func ppParseIPv4(s string) (netip.Addr, error) {
	parts := strings.Split(s, ".")
	if len(parts) != 4 {
		return netip.Addr{}, fmt.Errorf("IPv4 %q: not four numbers", s)
	}
	var a [4]byte
	for i, p := range parts {
		n, err := ppDecimal(p, 3, 255)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("IPv4 %q: %w", s, err)
		}
		a[i] = byte(n)
	}
	return netip.AddrFrom4(a), nil
}

// ppParseIPv6 reads groups of hexadecimal digits joined by colons, with at
// most one "::" standing for a run of zero groups, 128 bits in all. The spec
// says "sets of 4 hexadecimal digits"; HAProxy's own sender writes
// inet_ntop's form, whose groups drop leading zeros, so 1 to 4 digits are
// taken here. The "::" must stand for the longest run of zero groups (the
// spec's "largest acceptable range"). No dotted IPv4 tail: the encoder
// unmaps addresses, so none should reach a TCP6 line.
func ppParseIPv6(s string) (netip.Addr, error) {
	groups := func(part string) ([]uint16, error) {
		if part == "" {
			return nil, nil
		}
		var out []uint16
		for _, g := range strings.Split(part, ":") {
			if g == "" || len(g) > 4 {
				return nil, fmt.Errorf("group %q", g)
			}
			n, err := strconv.ParseUint(g, 16, 16)
			if err != nil {
				return nil, fmt.Errorf("group %q", g)
			}
			out = append(out, uint16(n))
		}
		return out, nil
	}
	var all []uint16
	elided, elidedAt := 0, -1
	switch strings.Count(s, "::") {
	case 0:
		g, err := groups(s)
		if err != nil || len(g) != 8 {
			return netip.Addr{}, fmt.Errorf("IPv6 %q: want 8 groups (%v)", s, err)
		}
		all = g
	case 1:
		head, tail, _ := strings.Cut(s, "::")
		hg, err1 := groups(head)
		tg, err2 := groups(tail)
		if err := errors.Join(err1, err2); err != nil || len(hg)+len(tg) > 7 {
			return netip.Addr{}, fmt.Errorf("IPv6 %q: bad groups around :: (%v)", s, err)
		}
		elided, elidedAt = 8-len(hg)-len(tg), len(hg)
		all = append(append(append(all, hg...), make([]uint16, elided)...), tg...)
	default:
		return netip.Addr{}, fmt.Errorf("IPv6 %q: more than one ::", s)
	}
	longest, run := 0, 0
	for i, g := range all {
		if g == 0 && (i < elidedAt || i >= elidedAt+elided) {
			run++
			longest = max(longest, run)
		} else {
			run = 0
		}
	}
	if elided > 0 && longest > elided {
		return netip.Addr{}, fmt.Errorf("IPv6 %q: :: replaces %d zero groups, not the longest run (%d)", s, elided, longest)
	}
	var a [16]byte
	for i, g := range all {
		binary.BigEndian.PutUint16(a[2*i:], g)
	}
	return netip.AddrFrom16(a), nil
}

// ppParseV2 decodes a section 2.2 header: signature, version 2, command,
// family and transport, length, then the address block (and any TLVs,
// counted and skipped).
func ppParseV2(b []byte) (ppHeader, error) {
	h := ppHeader{version: 2, command: b[12] & 0x0F}
	if h.command != 0x1 {
		return ppHeader{}, fmt.Errorf("v2: command %#x, want 0x1 (PROXY)", h.command)
	}
	n := int(binary.BigEndian.Uint16(b[14:16]))
	if len(b) < 16+n {
		return ppHeader{}, fmt.Errorf("v2: length %d but %d bytes follow", n, len(b)-16)
	}
	h.length = 16 + n
	var size int
	switch b[13] >> 4 {
	case 0x1:
		size, h.proto = 4, "4"
	case 0x2:
		size, h.proto = 16, "6"
	default:
		return ppHeader{}, fmt.Errorf("v2: family %#x", b[13]>>4)
	}
	switch b[13] & 0x0F {
	case 0x1:
		h.proto = "TCP" + h.proto
	case 0x2:
		h.proto = "UDP" + h.proto
	default:
		return ppHeader{}, fmt.Errorf("v2: transport %#x", b[13]&0x0F)
	}
	block := b[16 : 16+n]
	if len(block) < 2*size+4 {
		return ppHeader{}, fmt.Errorf("v2: %d address bytes, want %d", len(block), 2*size+4)
	}
	sa, _ := netip.AddrFromSlice(block[:size])
	da, _ := netip.AddrFromSlice(block[size : 2*size])
	h.src = netip.AddrPortFrom(sa, binary.BigEndian.Uint16(block[2*size:]))
	h.dst = netip.AddrPortFrom(da, binary.BigEndian.Uint16(block[2*size+2:]))
	h.tlvs = len(block) - (2*size + 4)
	return h, nil
}

// ppRead reads one header from a stream as a receiver does, no byte past
// it: 16 bytes decide the version (every header here is longer); a v2
// header then says its length, a v1 line ends at CRLF within 107 bytes.
func ppRead(r *bufio.Reader) (ppHeader, error) {
	first, err := r.Peek(16)
	if err != nil {
		return ppHeader{}, fmt.Errorf("reading the header: %w", err)
	}
	var raw []byte
	if bytes.Equal(first[:12], ppSignature) {
		raw = make([]byte, 16)
		if _, err := io.ReadFull(r, raw); err != nil {
			return ppHeader{}, err
		}
		raw = append(raw, make([]byte, binary.BigEndian.Uint16(raw[14:]))...)
		if _, err := io.ReadFull(r, raw[16:]); err != nil {
			return ppHeader{}, err
		}
	} else {
		for len(raw) < 107 && !bytes.HasSuffix(raw, []byte("\r\n")) {
			c, err := r.ReadByte()
			if err != nil {
				return ppHeader{}, err
			}
			raw = append(raw, c)
		}
	}
	h, err := ppParse(raw)
	if err == nil && h.length != len(raw) {
		err = fmt.Errorf("header of %d bytes in %d read", h.length, len(raw))
	}
	return h, err
}

// ppWant is the header a receiver should read for a flow the encoder
// accepts: addresses unmapped and without zone.
func ppWant(v ProxyProtocol, proto service.Protocol, src, dst netip.AddrPort) ppHeader {
	unmap := func(ap netip.AddrPort) netip.AddrPort {
		return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
	}
	h := ppHeader{version: int(v), command: 0x1, src: unmap(src), dst: unmap(dst)}
	h.proto = proto.String() + "6"
	if h.src.Addr().Is4() {
		h.proto = proto.String() + "4"
	}
	return h
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const ppSigHex = "0d0a0d0a 000d0a51 5549540a"

// proxyCases are flows with their bytes, written out by hand from the spec.
var proxyCases = []struct {
	name     string
	v        ProxyProtocol
	proto    service.Protocol
	src, dst string
	want     string // v1: the line; v2: hex, spaces ignored
}{
	{"v1 TCP4", ProxyProtocolV1, service.TCP, "192.168.0.1:56324", "10.96.0.10:443",
		"PROXY TCP4 192.168.0.1 10.96.0.10 56324 443\r\n"},
	{"v1 TCP6", ProxyProtocolV1, service.TCP, "[2001:db8::1]:40000", "[fd00:10:96::a]:80",
		"PROXY TCP6 2001:db8::1 fd00:10:96::a 40000 80\r\n"},
	{"v1 TCP4 from mapped addresses", ProxyProtocolV1, service.TCP, "[::ffff:192.0.2.7]:1234", "10.96.0.1:53",
		"PROXY TCP4 192.0.2.7 10.96.0.1 1234 53\r\n"},
	{"v1 TCP6 zone dropped, port 0", ProxyProtocolV1, service.TCP, "[fe80::1%eth0]:0", "[fe80::2]:65535",
		"PROXY TCP6 fe80::1 fe80::2 0 65535\r\n"},
	{"v1 TCP6 longest line", ProxyProtocolV1, service.TCP,
		"[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535", "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535",
		"PROXY TCP6 ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff 65535 65535\r\n"},
	{"v2 TCP4", ProxyProtocolV2, service.TCP, "192.168.0.1:56324", "10.96.0.10:443",
		ppSigHex + " 21 11 000c  c0a80001 0a60000a  dc04 01bb"},
	{"v2 UDP4", ProxyProtocolV2, service.UDP, "10.244.1.5:5353", "10.96.0.10:53",
		ppSigHex + " 21 12 000c  0af40105 0a60000a  14e9 0035"},
	{"v2 TCP6", ProxyProtocolV2, service.TCP, "[2001:db8::1]:40000", "[fd00:10:96::a]:80",
		ppSigHex + " 21 21 0024  20010db8 00000000 00000000 00000001  fd000010 00960000 00000000 0000000a  9c40 0050"},
	{"v2 UDP6", ProxyProtocolV2, service.UDP, "[2001:db8::53]:33000", "[fd00:10:96::a]:53",
		ppSigHex + " 21 22 0024  20010db8 00000000 00000000 00000053  fd000010 00960000 00000000 0000000a  80e8 0035"},
	{"v2 TCP4 from mapped addresses", ProxyProtocolV2, service.TCP, "[::ffff:192.0.2.7]:1", "[::ffff:10.96.0.1]:2",
		ppSigHex + " 21 11 000c  c0000207 0a600001  0001 0002"},
}

func TestProxyHeaderGolden(t *testing.T) {
	for _, c := range proxyCases {
		t.Run(c.name, func(t *testing.T) {
			want := []byte(c.want)
			if c.v == ProxyProtocolV2 {
				want = unhex(t, c.want)
			}
			prefix := []byte("already here")
			got, err := AppendProxyHeader(bytes.Clone(prefix), c.v, c.proto, ap(c.src), ap(c.dst))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(got, prefix) {
				t.Fatalf("the bytes already in b were changed: %q", got)
			}
			if got = got[len(prefix):]; !bytes.Equal(got, want) {
				t.Fatalf("header\n got % x\nwant % x", got, want)
			}
			if len(got) > proxyHeaderMax {
				t.Errorf("%d bytes, more than proxyHeaderMax %d", len(got), proxyHeaderMax)
			}
			h, err := ppParse(got)
			if err != nil {
				t.Fatalf("the test receiver refused it: %v", err)
			}
			wantH := ppWant(c.v, c.proto, ap(c.src), ap(c.dst))
			wantH.length = len(want)
			if h != wantH {
				t.Errorf("the test receiver read %+v, want %+v", h, wantH)
			}
		})
	}
}

// The longest line is the 104 bytes section 2.1 counts: proxyHeaderMax,
// the most a header buffer has to hold.
func TestProxyHeaderLongest(t *testing.T) {
	max6 := ap("[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535")
	if got, _ := AppendProxyHeader(nil, ProxyProtocolV1, service.TCP, max6, max6); len(got) != proxyHeaderMax {
		t.Errorf("longest v1 line is %d bytes, want %d", len(got), proxyHeaderMax)
	}
	if got, _ := AppendProxyHeader(nil, ProxyProtocolV2, service.UDP, max6, max6); len(got) != 16+36 {
		t.Errorf("v2 IPv6 header is %d bytes, want 52", len(got))
	}
}

func TestParseProxyProtocol(t *testing.T) {
	for _, c := range []struct {
		in   string
		want ProxyProtocol
	}{{"", ProxyProtocolNone}, {"v1", ProxyProtocolV1}, {"v2", ProxyProtocolV2}} {
		got, err := ParseProxyProtocol(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseProxyProtocol(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"V1", "1", "v3", "none", " v1", "v2 ", "true"} {
		_, err := ParseProxyProtocol(in)
		if !errors.Is(err, ErrProxyProtocol) {
			t.Errorf("ParseProxyProtocol(%q) = %v, want ErrProxyProtocol", in, err)
			continue
		}
		for _, part := range []string{strconv.Quote(in), `"v1"`, `"v2"`, AnnotationProxyProtocol} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("ParseProxyProtocol(%q): %q does not say %s", in, err, part)
			}
		}
	}
	for v, s := range map[ProxyProtocol]string{ProxyProtocolNone: "none", ProxyProtocolV1: "v1", ProxyProtocolV2: "v2", 7: "ProxyProtocol(7)"} {
		if v.String() != s {
			t.Errorf("ProxyProtocol(%d).String() = %q, want %q", v, v.String(), s)
		}
	}
}

func TestProxyProtocolCheck(t *testing.T) {
	for _, c := range []struct {
		v     ProxyProtocol
		proto service.Protocol
		ok    bool
	}{
		{ProxyProtocolNone, service.TCP, true},
		{ProxyProtocolNone, service.UDP, true},
		{ProxyProtocolV1, service.TCP, true},
		{ProxyProtocolV1, service.UDP, false}, // v1 has no UDP line
		{ProxyProtocolV2, service.TCP, true},
		{ProxyProtocolV2, service.UDP, true},
		{ProxyProtocolV2, 132, false}, // SCTP
		{3, service.TCP, false},
	} {
		err := c.v.Check(c.proto)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrProxyProtocol)) {
			t.Errorf("%v.Check(%v) = %v, want ok=%v", c.v, c.proto, err, c.ok)
		}
	}
}

// Flows no header can describe are refused, b comes back unchanged, and
// ProxyProtocolNone appends nothing.
func TestProxyHeaderRefused(t *testing.T) {
	v4, v6 := ap("10.0.0.1:1"), ap("[2001:db8::1]:2")
	for _, c := range []struct {
		name     string
		v        ProxyProtocol
		proto    service.Protocol
		src, dst netip.AddrPort
	}{
		{"v1 UDP", ProxyProtocolV1, service.UDP, v4, v4},
		{"v2 SCTP", ProxyProtocolV2, 132, v4, v4},
		{"v1 no protocol", ProxyProtocolV1, 0, v4, v4},
		{"v2 client v4, destination v6", ProxyProtocolV2, service.TCP, v4, v6},
		{"v1 client v6, destination v4", ProxyProtocolV1, service.TCP, v6, v4},
		{"v2 mapped v4 against v6", ProxyProtocolV2, service.TCP, ap("[::ffff:10.0.0.1]:1"), v6},
		{"v2 zero source", ProxyProtocolV2, service.TCP, netip.AddrPort{}, v4},
		{"v1 zero destination", ProxyProtocolV1, service.TCP, v6, netip.AddrPort{}},
		{"unknown version", 3, service.TCP, v4, v4},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := []byte("keep")
			got, err := AppendProxyHeader(b, c.v, c.proto, c.src, c.dst)
			if !errors.Is(err, ErrProxyHeader) {
				t.Errorf("err = %v, want ErrProxyHeader", err)
			}
			if string(got) != "keep" {
				t.Errorf("b became %q", got)
			}
		})
	}
	got, err := AppendProxyHeader([]byte("keep"), ProxyProtocolNone, service.UDP, v4, v6)
	if err != nil || string(got) != "keep" {
		t.Errorf("ProxyProtocolNone: %q, %v; want b unchanged, no error", got, err)
	}
}

// The test receiver must be able to refuse: each row breaks one rule of
// the spec that the encoder must never break.
func TestProxyTestParserRefuses(t *testing.T) {
	good := "PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r\n"
	if _, err := ppParse([]byte(good)); err != nil {
		t.Fatalf("the good line was refused: %v", err)
	}
	sig := string(ppSignature)
	for _, bad := range []string{
		"PROXY TCP4 10.0.0.01 10.0.0.2 1 2\r\n",                               // leading zero in an octet
		"PROXY TCP4 10.0.0.1 10.0.0.256 1 2\r\n",                              // octet above 255
		"PROXY TCP4 10.0.0.1 10.0.0.2 01 2\r\n",                               // leading zero in a port
		"PROXY TCP4 10.0.0.1 10.0.0.2 1 65536\r\n",                            // port above 65535
		"PROXY TCP4  10.0.0.1 10.0.0.2 1 2\r\n",                               // two spaces
		"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\n",                                  // LF alone
		"PROXY TCP4 10.0.0.1 10.0.0.2 1 2\r",                                  // CR alone
		"PROXY TCP4 2001:db8::1 10.0.0.2 1 2\r\n",                             // family not as announced
		"PROXY TCP6 2001:db8::1 ::ffff:10.0.0.2 1 2\r\n",                      // dotted tail
		"PROXY TCP6 2001::db8::1 ::1 1 2\r\n",                                 // two ::
		"PROXY TCP6 1:0:0:0:0:2:3:4:5 ::1 1 2\r\n",                            // nine groups
		"PROXY TCP6 2001:db8::0:0:0:1 ::1 1 2\r\n",                            // :: not the longest zero run
		"PROXY TCP6 12345::1 ::1 1 2\r\n",                                     // five hex digits
		"PROXY UDP4 10.0.0.1 10.0.0.2 1 2\r\n",                                // no UDP in v1
		"PROXY UNKNOWN\r\n",                                                   // legal, never sent here
		"PROXY TCP4 10.0.0.1 10.0.0.2 1 2" + strings.Repeat(" ", 80) + "\r\n", // CRLF past 107
		sig + "\x20\x11\x00\x0c" + strings.Repeat("\x00", 12),                 // LOCAL
		sig + "\x21\x31\x00\x0c" + strings.Repeat("\x00", 12),                 // AF_UNIX
		sig + "\x21\x13\x00\x0c" + strings.Repeat("\x00", 12),                 // transport 3
		sig + "\x21\x11\x00\x0c" + strings.Repeat("\x00", 11),                 // one byte short
		sig + "\x21\x21\x00\x0c" + strings.Repeat("\x00", 12),                 // IPv6 in 12 bytes
		"GET / HTTP/1.1\r\n",
	} {
		if h, err := ppParse([]byte(bad)); err == nil {
			t.Errorf("the test receiver accepted %q as %+v", bad, h)
		}
	}
}

// seedFor returns the fixed seed of a randomised test, or $USERPROXY_SEED,
// and logs it.
func seedFor(t *testing.T, fixed uint64) *rand.Rand {
	t.Helper()
	seed := fixed
	if s := os.Getenv("USERPROXY_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("USERPROXY_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (set USERPROXY_SEED to reproduce)", seed)
	return rand.New(rand.NewPCG(seed, 0))
}

// randAddr returns an IPv4 address, or an IPv6 one whose groups are often
// zero (so that "::" runs of every length and place occur), sometimes
// IPv4-mapped, sometimes with a zone.
func randAddr(rng *rand.Rand, v6 bool) netip.Addr {
	if !v6 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], rng.Uint32())
		if rng.IntN(8) == 0 {
			a = [4]byte{}
		}
		return netip.AddrFrom4(a)
	}
	var a [16]byte
	for i := 0; i < 16; i += 2 {
		if rng.IntN(2) == 0 {
			binary.BigEndian.PutUint16(a[i:], uint16(rng.Uint32()))
		}
	}
	addr := netip.AddrFrom16(a)
	if rng.IntN(16) == 0 {
		addr = addr.WithZone("eth0")
	}
	return addr
}

func randPort(rng *rand.Rand) uint16 {
	switch rng.IntN(8) {
	case 0:
		return 0
	case 1:
		return 65535
	}
	return uint16(rng.Uint32())
}

// Many random flows, each through the encoder and back through the test
// receiver: every address and port must come back exactly.
func TestProxyHeaderRandomRoundTrip(t *testing.T) {
	rng := seedFor(t, 20260601)
	buf := make([]byte, 0, proxyHeaderMax)
	for i := range 20000 {
		v := ProxyProtocolV1 + ProxyProtocol(rng.IntN(2))
		proto := service.TCP
		if rng.IntN(2) == 0 {
			proto = service.UDP
		}
		v6 := rng.IntN(2) == 0
		src := netip.AddrPortFrom(randAddr(rng, v6), randPort(rng))
		dst := netip.AddrPortFrom(randAddr(rng, v6), randPort(rng))
		if !v6 && rng.IntN(4) == 0 { // the v4 flow as an IPv6 socket sees it
			src = netip.AddrPortFrom(netip.AddrFrom16(src.Addr().As16()), src.Port())
		}
		out, err := AppendProxyHeader(buf[:0], v, proto, src, dst)
		if v == ProxyProtocolV1 && proto == service.UDP {
			if !errors.Is(err, ErrProxyHeader) {
				t.Fatalf("#%d v1 UDP %v -> %v: err %v, want ErrProxyHeader", i, src, dst, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("#%d %v %v %v -> %v: %v", i, v, proto, src, dst, err)
		}
		h, err := ppParse(out)
		if err != nil {
			t.Fatalf("#%d %v %v %v -> %v: the test receiver refused %q: %v", i, v, proto, src, dst, out, err)
		}
		want := ppWant(v, proto, src, dst)
		want.length = len(out)
		if h != want {
			t.Fatalf("#%d %q: read %+v, want %+v", i, out, h, want)
		}
	}
}

// With room in b, no header allocates.
func TestProxyHeaderAllocs(t *testing.T) {
	buf := make([]byte, 0, proxyHeaderMax)
	for _, c := range proxyCases {
		src, dst := ap(c.src), ap(c.dst)
		allocs := testing.AllocsPerRun(100, func() {
			buf, _ = AppendProxyHeader(buf[:0], c.v, c.proto, src, dst)
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per header, want 0", c.name, allocs)
		}
	}
}

// ppRead's answer for one connection.
type ppResult struct {
	h   ppHeader
	err error
}

// ppEchoServer is the shape the datapath test will take: an endpoint on
// 127.0.0.1 that reads the PROXY header from each connection and reports
// it; after a good header it echoes the rest of the stream, after a bad one
// it closes the connection, as the spec asks a receiver to.
func ppEchoServer(t *testing.T) (addr string, headers <-chan ppResult) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ch := make(chan ppResult, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r := bufio.NewReader(c)
			h, err := ppRead(r)
			ch <- ppResult{h, err}
			if err == nil {
				_, _ = io.Copy(c, r)
			}
			c.Close()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), ch
}

// A real socket: writeProxyHeader's bytes, then the client's, reach an
// endpoint that reads the header as a receiver does and echoes the rest.
func TestProxyHeaderOverSocket(t *testing.T) {
	addr, headers := ppEchoServer(t)
	for _, c := range proxyCases {
		if c.proto != service.TCP {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := writeProxyHeader(conn, c.v, c.proto, ap(c.src), ap(c.dst)); err != nil {
				t.Fatal(err)
			}
			payload := "GET / HTTP/1.1\r\n\r\n"
			if _, err := io.WriteString(conn, payload); err != nil {
				t.Fatal(err)
			}
			if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			var got ppResult
			select {
			case got = <-headers:
			case <-time.After(10 * time.Second):
				t.Fatal("the endpoint reported no header")
			}
			if got.err != nil {
				t.Fatalf("endpoint: %v", got.err)
			}
			want := ppWant(c.v, c.proto, ap(c.src), ap(c.dst))
			want.length = got.h.length
			if got.h != want {
				t.Errorf("endpoint read %+v, want %+v", got.h, want)
			}
			echo, err := io.ReadAll(conn)
			if err != nil {
				t.Fatal(err)
			}
			if string(echo) != payload {
				t.Errorf("echo %q, want %q: the header and the payload ran together", echo, payload)
			}
		})
	}
}

// recordConn is a net.Conn that records each Write; short makes a Write
// report one byte fewer than it was given, without an error.
type recordConn struct {
	net.Conn
	writes [][]byte
	short  bool
}

func (c *recordConn) Write(b []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(b))
	if c.short {
		return len(b) - 1, nil
	}
	return len(b), nil
}

func (c *recordConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(10, 0, 0, 9), Port: 8080}
}

func TestWriteProxyHeader(t *testing.T) {
	src, dst := ap("192.168.0.1:56324"), ap("10.96.0.10:443")
	t.Run("one write", func(t *testing.T) {
		for _, v := range []ProxyProtocol{ProxyProtocolV1, ProxyProtocolV2} {
			c := &recordConn{}
			if err := writeProxyHeader(c, v, service.TCP, src, dst); err != nil {
				t.Fatal(err)
			}
			want, _ := AppendProxyHeader(nil, v, service.TCP, src, dst)
			if len(c.writes) != 1 || !bytes.Equal(c.writes[0], want) {
				t.Errorf("%v: writes %q, want one write of %q", v, c.writes, want)
			}
		}
	})
	t.Run("none writes nothing", func(t *testing.T) {
		c := &recordConn{}
		if err := writeProxyHeader(c, ProxyProtocolNone, service.TCP, src, dst); err != nil || len(c.writes) != 0 {
			t.Errorf("err %v, writes %q; want none", err, c.writes)
		}
	})
	t.Run("refused flow writes nothing", func(t *testing.T) {
		c := &recordConn{}
		err := writeProxyHeader(c, ProxyProtocolV1, service.UDP, src, dst)
		if !errors.Is(err, ErrProxyHeader) || len(c.writes) != 0 {
			t.Errorf("err %v, writes %q; want ErrProxyHeader and no write", err, c.writes)
		}
		if !strings.Contains(err.Error(), "10.0.0.9:8080") {
			t.Errorf("%q does not name the endpoint", err)
		}
	})
	t.Run("short write", func(t *testing.T) {
		err := writeProxyHeader(&recordConn{short: true}, ProxyProtocolV2, service.TCP, src, dst)
		if !errors.Is(err, io.ErrShortWrite) {
			t.Errorf("err %v, want io.ErrShortWrite", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		a, b := net.Pipe() // nobody reads b: the Write blocks until the deadline
		defer a.Close()
		defer b.Close()
		if err := a.SetWriteDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		err := writeProxyHeader(a, ProxyProtocolV2, service.TCP, src, dst)
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("err %v, want os.ErrDeadlineExceeded", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("err %v is not a net.Error timeout", err)
		}
		for _, part := range []string{"v2", "pipe", "wrote 0 of 28 bytes"} {
			if !strings.Contains(err.Error(), part) {
				t.Errorf("%q does not say %q", err, part)
			}
		}
	})
}

// FuzzProxyHeaderRoundTrip: any flow the encoder accepts, the test
// receiver reads back exactly; any it refuses is one no header describes.
func FuzzProxyHeaderRoundTrip(f *testing.F) {
	for _, c := range proxyCases {
		s, d := ap(c.src), ap(c.dst)
		sb, db := s.Addr().AsSlice(), d.Addr().AsSlice()
		f.Add(uint8(c.v), uint8(c.proto), sb, db, s.Port(), d.Port())
	}
	f.Add(uint8(1), uint8(17), []byte{10, 0, 0, 1}, []byte{10, 0, 0, 2}, uint16(1), uint16(2))
	f.Add(uint8(2), uint8(6), []byte{10, 0, 0, 1}, make([]byte, 16), uint16(1), uint16(2))
	f.Fuzz(func(t *testing.T, vb, pb uint8, sb, db []byte, sp, dp uint16) {
		sa, ok1 := netip.AddrFromSlice(sb)
		da, ok2 := netip.AddrFromSlice(db)
		if !ok1 || !ok2 {
			return
		}
		v, proto := ProxyProtocol(vb), service.Protocol(pb)
		src, dst := netip.AddrPortFrom(sa, sp), netip.AddrPortFrom(da, dp)
		out, err := AppendProxyHeader(nil, v, proto, src, dst)
		describable := (v == ProxyProtocolV1 && proto == service.TCP ||
			v == ProxyProtocolV2 && (proto == service.TCP || proto == service.UDP)) &&
			sa.Unmap().Is4() == da.Unmap().Is4()
		switch {
		case v == ProxyProtocolNone:
			if err != nil || len(out) != 0 {
				t.Fatalf("none: %q, %v", out, err)
			}
		case !describable:
			if !errors.Is(err, ErrProxyHeader) || len(out) != 0 {
				t.Fatalf("%v %v %v -> %v: %q, %v; want ErrProxyHeader", v, proto, src, dst, out, err)
			}
		default:
			if err != nil {
				t.Fatalf("%v %v %v -> %v: %v", v, proto, src, dst, err)
			}
			h, err := ppParse(out)
			if err != nil {
				t.Fatalf("%v %v %v -> %v: the test receiver refused %q: %v", v, proto, src, dst, out, err)
			}
			want := ppWant(v, proto, src, dst)
			want.length = len(out)
			if h != want {
				t.Fatalf("%q: read %+v, want %+v", out, h, want)
			}
		}
	})
}

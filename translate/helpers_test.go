package translate

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testWriter is the Writer of segments from src to dst.
func testWriter(src, dst string) Writer {
	return NewWriter(netip.MustParseAddrPort(src), netip.MustParseAddrPort(dst))
}

// parseIP reads the TCP segment of p, a whole IPv4 or IPv6 packet (no
// options, no extension headers), as far as its IP header's length says.
func parseIP(p []byte) (Segment, bool) {
	if len(p) < ipv4Header {
		return Segment{}, false
	}
	if p[0]>>4 == 4 {
		end := min(len(p), int(binary.BigEndian.Uint16(p[2:])))
		return Parse(p[ipv4Header:end])
	}
	if len(p) < ipv6Header {
		return Segment{}, false
	}
	end := min(len(p), ipv6Header+int(binary.BigEndian.Uint16(p[4:])))
	return Parse(p[ipv6Header:end])
}

// naiveChecksum is RFC 1071's sum of b, a 16-bit word at a time and
// folded at each step: the tests' own, to hold the writer's against.
func naiveChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i < len(b); i += 2 {
		w := uint32(b[i]) << 8
		if i+1 < len(b) {
			w |= uint32(b[i+1])
		}
		s += w
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

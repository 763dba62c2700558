package netstack

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/userproxy/userproxy/translate"
)

// TestWithTCPChecksum: a SYN read with a partial checksum (offloads) is
// handed over with its checksum complete, IPv4 and IPv6, and what is not a
// plain TCP packet is not handed over.
func TestWithTCPChecksum(t *testing.T) {
	for _, c := range []struct{ src, dst string }{{"10.0.0.7:40000", "10.96.0.10:80"}, {"[fd00::7]:40000", "[fd00:96::10]:80"}} {
		w := translate.NewWriter(netip.MustParseAddrPort(c.src), netip.MustParseAddrPort(c.dst))
		good := make([]byte, 100)
		good = good[:w.Build(good, 1000, 0, tcpSYN, 64240, []byte{2, 4, 5, 0xb4}, nil)]
		partial := bytes.Clone(good)
		ipLen := w.IPLen()
		partial[ipLen+16], partial[ipLen+17] = 0x12, 0x34 // as NEEDS_CSUM leaves it: not the full sum
		got, ok := withTCPChecksum(partial)
		if !ok || !bytes.Equal(got, good) {
			t.Fatalf("%s: %x, %v; want %x", c.src, got, ok, good)
		}
		if partial[ipLen+16] != 0x12 {
			t.Fatal("the packet read was changed, not a copy")
		}
	}
	if _, ok := withTCPChecksum([]byte{0x45, 0, 0, 20}); ok {
		t.Fatal("a truncated packet handed over")
	}
}

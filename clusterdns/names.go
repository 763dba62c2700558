package clusterdns

import (
	"net/netip"
	"strconv"
	"strings"
)

// This file reads query names: the labels of a name under the cluster
// domain, and the address of a reverse (PTR) name.

// splitUnder returns the labels of name before the zone suffix (both fully
// qualified and lowercase), left to right, and whether name is in the
// zone. The zone apex gives no labels.
func splitUnder(name, zone string) ([]string, bool) {
	if name == zone {
		return nil, true
	}
	rest, ok := strings.CutSuffix(name, "."+zone)
	if !ok || rest == "" {
		return nil, false
	}
	return strings.Split(rest, "."), true
}

// label returns a plain label's text: "" for labels with escapes
// (presentation-format "\." or "\065"), which no Kubernetes name has.
func plainLabel(l string) string {
	if strings.IndexByte(l, '\\') >= 0 {
		return ""
	}
	return l
}

// reverseAddr parses a full reverse name (lowercase, fully qualified):
// "4.3.2.1.in-addr.arpa." or the 32 nibbles of an ip6.arpa name. ok is
// false for anything else, including partial names.
func reverseAddr(name string) (netip.Addr, bool) {
	if rest, ok := strings.CutSuffix(name, ".in-addr.arpa."); ok {
		parts := strings.Split(rest, ".")
		if len(parts) != 4 {
			return netip.Addr{}, false
		}
		var b [4]byte
		for i, p := range parts {
			if p == "" || len(p) > 3 || (len(p) > 1 && p[0] == '0') {
				return netip.Addr{}, false
			}
			n, err := strconv.ParseUint(p, 10, 8)
			if err != nil {
				return netip.Addr{}, false
			}
			b[3-i] = byte(n)
		}
		return netip.AddrFrom4(b), true
	}
	if rest, ok := strings.CutSuffix(name, ".ip6.arpa."); ok {
		if len(rest) != 63 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i := range 32 {
			c := rest[2*i]
			if i < 31 && rest[2*i+1] != '.' {
				return netip.Addr{}, false
			}
			var v byte
			switch {
			case c >= '0' && c <= '9':
				v = c - '0'
			case c >= 'a' && c <= 'f':
				v = c - 'a' + 10
			default:
				return netip.Addr{}, false
			}
			// Nibble i (from the left of the name) is nibble 31-i of the
			// address.
			pos := 31 - i
			if pos%2 == 0 {
				b[pos/2] |= v << 4
			} else {
				b[pos/2] |= v
			}
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}

// reverseZone returns the reverse zone that holds a prefix's addresses,
// rounded out to a label boundary (an octet, or an IPv6 nibble):
// 10.96.0.0/12 -> "10.in-addr.arpa.", fd00:96::/64 -> the 16 nibbles of
// fd00:0096:0000:0000 under ip6.arpa.
func reverseZone(p netip.Prefix) string {
	var b strings.Builder
	addr := p.Masked().Addr()
	if addr.Is4() {
		a := addr.As4()
		for i := p.Bits()/8 - 1; i >= 0; i-- {
			b.WriteString(strconv.Itoa(int(a[i])))
			b.WriteByte('.')
		}
		b.WriteString("in-addr.arpa.")
		return b.String()
	}
	a := addr.As16()
	const hex = "0123456789abcdef"
	for i := p.Bits()/4 - 1; i >= 0; i-- {
		v := a[i/2]
		if i%2 == 0 {
			v >>= 4
		}
		b.WriteByte(hex[v&0xf])
		b.WriteByte('.')
	}
	b.WriteString("ip6.arpa.")
	return b.String()
}

package conntrack

import (
	"encoding/binary"
	"net/netip"
	"strconv"
)

// Tuple identifies one direction of a flow: protocol, source and destination
// address and port. It is a small comparable value without pointers, used as
// the table's index key; build it with MakeTuple or take it from a Result.
//
// IPv4 addresses are held in the first four bytes of the address arrays, with
// family 4; IPv6 addresses use all sixteen, with family 6. The zero Tuple is
// not valid.
type Tuple struct {
	src, dst         [16]byte
	srcPort, dstPort uint16
	proto            Protocol
	family           uint8 // 4 or 6; 0 for the zero Tuple
}

// MakeTuple builds a tuple. Both addresses must be of the same family (an
// IPv4-mapped IPv6 address counts as IPv6); otherwise, or when an address is
// invalid, it returns the zero Tuple, which matches no entry.
func MakeTuple(proto Protocol, src, dst netip.AddrPort) Tuple {
	var t Tuple
	s, d := src.Addr(), dst.Addr()
	switch {
	case s.Is4() && d.Is4():
		t.family = 4
		a, b := s.As4(), d.As4()
		copy(t.src[:4], a[:])
		copy(t.dst[:4], b[:])
	case s.Is6() && d.Is6():
		t.family = 6
		t.src, t.dst = s.As16(), d.As16()
	default:
		return Tuple{}
	}
	t.srcPort, t.dstPort, t.proto = src.Port(), dst.Port(), proto
	return t
}

// IsValid reports whether t was built from a parsed packet or a successful
// MakeTuple.
func (t Tuple) IsValid() bool { return t.family != 0 }

// Proto returns the transport protocol.
func (t Tuple) Proto() Protocol { return t.proto }

// Is6 reports whether the tuple is IPv6.
func (t Tuple) Is6() bool { return t.family == 6 }

// SrcAddr returns the source address.
func (t Tuple) SrcAddr() netip.Addr { return t.addr(&t.src) }

// DstAddr returns the destination address.
func (t Tuple) DstAddr() netip.Addr { return t.addr(&t.dst) }

// Src returns the source address and port.
func (t Tuple) Src() netip.AddrPort { return netip.AddrPortFrom(t.SrcAddr(), t.srcPort) }

// Dst returns the destination address and port.
func (t Tuple) Dst() netip.AddrPort { return netip.AddrPortFrom(t.DstAddr(), t.dstPort) }

// SrcPort returns the source port.
func (t Tuple) SrcPort() uint16 { return t.srcPort }

// DstPort returns the destination port.
func (t Tuple) DstPort() uint16 { return t.dstPort }

// Reverse returns the tuple of the opposite direction (source and destination
// swapped), as the kernel's nf_ct_invert_tuple does for TCP and UDP.
func (t Tuple) Reverse() Tuple {
	t.src, t.dst = t.dst, t.src
	t.srcPort, t.dstPort = t.dstPort, t.srcPort
	return t
}

func (t *Tuple) reverse() {
	t.src, t.dst = t.dst, t.src
	t.srcPort, t.dstPort = t.dstPort, t.srcPort
}

// String formats the tuple as "tcp 10.0.0.1:5555->10.96.0.10:80".
func (t Tuple) String() string {
	if !t.IsValid() {
		return "invalid"
	}
	b := make([]byte, 0, 64)
	b = append(b, t.proto.String()...)
	b = append(b, ' ')
	b = t.Src().AppendTo(b)
	b = append(b, "->"...)
	b = t.Dst().AppendTo(b)
	return string(b)
}

func (t *Tuple) addr(a *[16]byte) netip.Addr {
	switch t.family {
	case 4:
		return netip.AddrFrom4([4]byte(a[:4]))
	case 6:
		return netip.AddrFrom16(*a)
	}
	return netip.Addr{}
}

// hash mixes the tuple and a seed into 64 bits: the top bits pick the
// shard, the low bits the slot in the shard's index. It is a fast keyed mix,
// not a cryptographic function: with a secret seed a client cannot
// precompute tuples that collide, which is all the index needs.
func (t *Tuple) hash(seed uint64) uint64 {
	const (
		k1 = 0x9e3779b97f4a7c15
		k2 = 0xc2b2ae3d27d4eb4f
		k3 = 0x165667b19e3779f9
		k4 = 0xd6e8feb86659fd93
		k5 = 0xff51afd7ed558ccd
	)
	s2 := seed<<23 | seed>>41
	h := (binary.LittleEndian.Uint64(t.src[0:8])^seed)*k1 ^
		(binary.LittleEndian.Uint64(t.src[8:16])^s2)*k2 ^
		(binary.LittleEndian.Uint64(t.dst[0:8])^seed)*k3 ^
		(binary.LittleEndian.Uint64(t.dst[8:16])^s2)*k4 ^
		(uint64(t.srcPort)<<32|uint64(t.dstPort)<<16|uint64(t.proto)<<8|uint64(t.family))*k5
	h ^= h >> 31
	h *= k2
	h ^= h >> 29
	h *= k5
	h ^= h >> 32
	return h
}

// appendConntrack appends "src=A dst=B sport=P dport=Q " in the layout of
// conntrack-tools (libnetfilter_conntrack __snprintf_address and
// __snprintf_proto).
func (t *Tuple) appendConntrack(b []byte) []byte {
	b = append(b, "src="...)
	b = t.SrcAddr().AppendTo(b)
	b = append(b, " dst="...)
	b = t.DstAddr().AppendTo(b)
	b = append(b, " sport="...)
	b = strconv.AppendUint(b, uint64(t.srcPort), 10)
	b = append(b, " dport="...)
	b = strconv.AppendUint(b, uint64(t.dstPort), 10)
	return append(b, ' ')
}

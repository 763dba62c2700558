package conntrack

import (
	"encoding/binary"
	"math/bits"
)

// sum adds b to the running one's-complement sum acc (RFC 1071), eight bytes
// at a time with end-around carry. The result must be folded with fold. An odd
// final byte is padded with zero on the right, as the RFC specifies.
func sum(b []byte, acc uint64) uint64 {
	var c uint64
	for len(b) >= 32 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[0:8]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[8:16]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[16:24]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[24:32]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	if len(b) >= 4 {
		acc, c = bits.Add64(acc, uint64(binary.BigEndian.Uint32(b)), c)
		b = b[4:]
	}
	if len(b) >= 2 {
		acc, c = bits.Add64(acc, uint64(binary.BigEndian.Uint16(b)), c)
		b = b[2:]
	}
	if len(b) == 1 {
		acc, c = bits.Add64(acc, uint64(b[0])<<8, c)
	}
	acc, c = bits.Add64(acc, 0, c)
	return acc + c // cannot overflow again: c was added into a value < 2^64-1
}

// fold reduces a 64-bit one's-complement sum to 16 bits.
func fold(acc uint64) uint16 {
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 32) + (acc & 0xffffffff)
	acc = (acc >> 16) + (acc & 0xffff)
	acc = (acc >> 16) + (acc & 0xffff)
	return uint16(acc)
}

// checksumOK reports whether data whose checksum field is included sums, with
// the pseudo-header sum acc, to all ones: the receiver's check of RFC 1071.
func checksumOK(b []byte, acc uint64) bool { return fold(sum(b, acc)) == 0xffff }

// pseudoSum returns the one's-complement sum of the TCP/UDP/ICMPv6
// pseudo-header (RFC 793, RFC 768, RFC 8200 section 8.1) for addresses of the
// given family, the upper-layer length and protocol.
func pseudoSum(family uint8, src, dst *[16]byte, length int, proto uint8) uint64 {
	acc := uint64(length) + uint64(proto)
	if family == 4 {
		return acc + uint64(binary.BigEndian.Uint32(src[:4])) + uint64(binary.BigEndian.Uint32(dst[:4]))
	}
	var c uint64
	acc, c = bits.Add64(acc, binary.BigEndian.Uint64(src[0:8]), 0)
	acc, c = bits.Add64(acc, binary.BigEndian.Uint64(src[8:16]), c)
	acc, c = bits.Add64(acc, binary.BigEndian.Uint64(dst[0:8]), c)
	acc, c = bits.Add64(acc, binary.BigEndian.Uint64(dst[8:16]), c)
	return acc + c
}

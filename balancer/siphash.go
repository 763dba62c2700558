package balancer

import "math/bits"

// hsiphash, the kernel's hash-table PRF, for the one input ip_vs_mh.c gives
// it: a 4-byte unsigned int.
//
// In the kernel hsiphash is HalfSipHash-1-3 on 32-bit machines but, "for
// performance reasons", SipHash-1-3 on 64-bit ones, with a 64-bit state and
// two 64-bit key words, truncated to 32 bits (linux lib/siphash.c, the
// BITS_PER_LONG == 64 branch: HSIPROUND is SIPROUND, HPOSTAMBLE runs one
// compression round and three finalisation rounds and returns
// (v0 ^ v1) ^ (v2 ^ v3) as u32). This is that 64-bit variant: what an
// x86-64 or arm64 kernel computes. The message bytes are the int's bytes in
// memory, read little-endian (le32_to_cpup), so on a little-endian machine
// the message is the int itself.
//
// SipHash (Aumasson and Bernstein) with c compression and d finalisation
// rounds; the constants are the reference ones ("somepseudorandomlygenerated
// bytes"), as the kernel's SIPHASH_CONST_0..3.

const (
	sipConst0 = 0x736f6d6570736575
	sipConst1 = 0x646f72616e646f6d
	sipConst2 = 0x6c7967656e657261
	sipConst3 = 0x7465646279746573
)

// sipRound is SIPROUND.
func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// hsiphash32 is the 64-bit kernel's hsiphash(&v, sizeof(v), key) for a
// 32-bit v and the key {k0, k1}: SipHash-1-3 of the four bytes of v, little
// endian, truncated to 32 bits. With no full 8-byte block, the only block is
// the last one: the length in the top byte, v in the low four.
func hsiphash32(k0, k1 uint64, v uint32) uint32 {
	v0 := sipConst0 ^ k0
	v1 := sipConst1 ^ k1
	v2 := sipConst2 ^ k0
	v3 := sipConst3 ^ k1
	b := uint64(4)<<56 | uint64(v)
	v3 ^= b
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= b
	v2 ^= 0xff
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return uint32(v0 ^ v1 ^ v2 ^ v3)
}

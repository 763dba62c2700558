package netstack

import "encoding/binary"

// flowHash hashes the flow of an IP packet whose network header is ip and
// whose transport header is l4 (nil or short when it has none): its two
// addresses and, for TCP and UDP, its two ports. It is the same both ways,
// as the kernel's __skb_get_hash_symmetric is: a packet and its reply hash
// alike, so a multi-queue TUN writes every packet of a flow on one queue. A
// packet that is not IPv4 or IPv6 hashes to 0. An IPv6 fragment hashes by
// its addresses and the fragment header's protocol number (44), as every
// other extension header does.
func flowHash(ip, l4 []byte) uint32 {
	if len(ip) == 0 {
		return 0
	}
	var src, dst []byte
	var proto byte
	switch ip[0] >> 4 {
	case 4:
		if len(ip) < 20 {
			return 0
		}
		src, dst, proto = ip[12:16], ip[16:20], ip[9]
		// A fragment, the first one too, hashes by its addresses and
		// protocol alone, as the kernel's flow dissector does (it reads
		// no ports past a fragment header unless asked to): every
		// fragment of a datagram then leaves on one queue.
		if binary.BigEndian.Uint16(ip[6:8])&0x3fff != 0 {
			l4 = nil
		}
	case 6:
		if len(ip) < 40 {
			return 0
		}
		src, dst, proto = ip[8:24], ip[24:40], ip[6]
	default:
		return 0
	}
	a, b := addrHash(src), addrHash(dst)
	if (proto == 6 || proto == 17) && len(l4) >= 4 {
		a = mix32(a ^ uint32(binary.BigEndian.Uint16(l4[0:2])))
		b = mix32(b ^ uint32(binary.BigEndian.Uint16(l4[2:4])))
	}
	// XOR: the same with the ends swapped; the last mix spreads it.
	return mix32(a ^ b ^ uint32(proto))
}

// flowHashPacket is flowHash of a whole packet, its transport header after
// the IPv4 header's options (IPv6's extension headers are not walked: such
// a packet hashes by its addresses and whatever follows the fixed header,
// the same for every packet of its flow that carries the same ones).
func flowHashPacket(pkt []byte) uint32 {
	if len(pkt) == 0 {
		return 0
	}
	off := 40
	if pkt[0]>>4 == 4 {
		off = int(pkt[0]&0x0f) * 4
	}
	// A header length below the fixed header's (or past the packet) puts
	// no ports anywhere: such a packet hashes by its addresses.
	if off < 20 || off > len(pkt) {
		return flowHash(pkt, nil)
	}
	return flowHash(pkt, pkt[off:])
}

// addrHash hashes an address, four bytes at a time.
func addrHash(a []byte) uint32 {
	var h uint32 = 0x9e3779b9
	for len(a) >= 4 {
		h = mix32(h ^ binary.BigEndian.Uint32(a))
		a = a[4:]
	}
	return h
}

// mix32 is a 32-bit finalizer (murmur3's fmix32): every input bit moves
// every output bit.
func mix32(h uint32) uint32 {
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

package conntrack

// IP reassembly ahead of classification. In the kernel, nf_defrag_ipv4 and
// nf_defrag_ipv6 hook PREROUTING at priority -400, before conntrack, so that
// conntrack sees whole datagrams only; the gate does the same with a
// Reassembler.
//
//  1. IsFragment: the gate's fast-path test, without a lock or an allocation.
//  2. Add: parse the fragment's headers (IPv4: ip_rcv_core's checks and the
//     header checksum; IPv6: the extension headers before the Fragment
//     header), and make the checks that need no queue.
//  3. Expire the queues whose time is up, then find or create the queue,
//     keyed as the kernel keys it: (source, destination, protocol, ID) for
//     IPv4 (ip_find), (source, destination, ID) for IPv6 (fq_find in
//     nf_conntrack_reasm.c), within the memory and queue bounds.
//  4. Queue the fragment: the end-of-datagram checks of ip_frag_queue and
//     nf_ct_frag6_queue, then the overlap rule of inet_frag_queue_insert
//     (RFC 5722 with errata 3089: a duplicate is dropped alone, an overlap
//     discards the whole datagram; the kernel applies it to IPv4 too).
//  5. With the first and last fragments in and nothing missing, build the
//     datagram into the caller's buffer, as ip_frag_reasm and
//     nf_ct_frag6_reasm do.
//  6. Sweep expires queues for an owner that wants their memory back before
//     the next fragment arrives.
//
// Sources: Linux net/ipv4/ip_fragment.c (ip_defrag, ip_frag_queue,
// ip_frag_reasm), net/ipv4/inet_fragment.c (inet_frag_find,
// inet_frag_queue_insert, ip_frag_ecn_table), net/ipv6/netfilter/
// nf_conntrack_reasm.c (nf_ct_frag6_gather, nf_ct_frag6_queue,
// nf_ct_frag6_reasm), include/net/ipv6_frag.h (ipv6frag_thdr_truncated),
// include/net/ipv6.h (IPV6_FRAG_HIGH_THRESH, IPV6_FRAG_TIMEOUT).

import (
	"encoding/binary"
	"errors"
	"strconv"
	"sync"
	"time"
)

// Defaults of ReassemblyConfig, the kernel's.
const (
	// DefaultReassemblyMaxBytes is net.ipv4.ipfrag_high_thresh and
	// net.netfilter.nf_conntrack_frag6_high_thresh: 4 MiB per family.
	DefaultReassemblyMaxBytes = 4 << 20
	// DefaultReassemblyTimeout4 is net.ipv4.ipfrag_time (IP_FRAG_TIME).
	DefaultReassemblyTimeout4 = 30 * time.Second
	// DefaultReassemblyTimeout6 is net.netfilter.nf_conntrack_frag6_timeout
	// (IPV6_FRAG_TIMEOUT).
	DefaultReassemblyTimeout6 = 60 * time.Second
	// DefaultReassemblyMaxQueues bounds the datagrams being reassembled per
	// family. The kernel has no such count (each queue's memory is charged
	// to the byte bound); it keeps a flood of one-fragment queues from
	// costing more bookkeeping than their bytes say.
	DefaultReassemblyMaxQueues = 4096
	// DefaultReassemblyMaxFragments bounds the fragments of one datagram:
	// 128 carries 64 KiB over links down to an MTU of 576. Beyond it the
	// datagram is discarded, so that one queue's bookkeeping stays small.
	// The kernel has no such bound; FreeBSD's maxfragsperpacket is 16.
	DefaultReassemblyMaxFragments = 128
)

// ReassemblyConfig configures a Reassembler. Zero fields take the defaults.
type ReassemblyConfig struct {
	// Clock times queues out; nil means a SystemClock.
	Clock Clock
	// MaxBytes bounds the memory held by the queues of each family: the
	// fragments' payload plus a fixed charge per fragment and per queue,
	// as the kernel charges each skb's truesize and each queue's size.
	MaxBytes int
	// MaxQueues bounds the queues of each family.
	MaxQueues int
	// MaxFragments bounds the fragments held by one queue.
	MaxFragments int
	// Timeout4 and Timeout6 are how long a queue may wait for its missing
	// fragments, counted from its first fragment (the kernel's timer is not
	// restarted by later fragments).
	Timeout4, Timeout6 time.Duration
}

// FragmentVerdict says what Add did with a packet.
type FragmentVerdict uint8

const (
	// NotFragment: the packet is not a fragment the Reassembler takes (or
	// its headers are malformed): classify it as it is.
	NotFragment FragmentVerdict = iota
	// FragmentHeld: the fragment was queued; the datagram is incomplete.
	FragmentHeld
	// FragmentComplete: the fragment completed its datagram, returned by
	// Add. Classify the datagram instead of the fragment.
	FragmentComplete
	// FragmentDropped: the fragment was dropped, and with it possibly the
	// fragments held for its datagram; the FragmentDrop says why.
	FragmentDropped
)

// FragmentDrop says why fragments were dropped. Each is counted in
// ReassemblyStats.Dropped, one per fragment. The String form is meant for a
// Prometheus label.
type FragmentDrop uint8

// Drop reasons. Keep fragmentDropNames in step.
const (
	// FragmentDropNone: nothing was dropped.
	FragmentDropNone FragmentDrop = iota
	// FragmentDropTimeout: the queue's time ran out before its datagram was
	// complete (ip_expire, nf_ct_frag6_expire).
	FragmentDropTimeout
	// FragmentDropMemory: the family's queues hold MaxBytes; the fragment
	// is dropped, even one for an existing queue (inet_frag_find).
	FragmentDropMemory
	// FragmentDropQueueLimit: a new queue was needed and the family holds
	// MaxQueues.
	FragmentDropQueueLimit
	// FragmentDropFragmentLimit: the queue holds MaxFragments; the datagram
	// is discarded.
	FragmentDropFragmentLimit
	// FragmentDropOverlap: the fragment overlaps a held one without being
	// contained in what is held; the datagram is discarded (RFC 5722,
	// IPFRAG_OVERLAP).
	FragmentDropOverlap
	// FragmentDropDuplicate: the fragment lies within what is already held;
	// it alone is dropped (IPFRAG_DUP). The first copy's bytes are kept.
	FragmentDropDuplicate
	// FragmentDropTooBig: the datagram would exceed 65535 bytes (IPv4 total
	// length, IPv6 payload length).
	FragmentDropTooBig
	// FragmentDropMalformed: inconsistent fragments (a last fragment that
	// ends short of data already held, or differs from an earlier last
	// one; data past the last fragment's end; an empty fragment; an IPv6
	// fragment that is not the last and not a multiple of 8 bytes; an IPv6
	// first fragment without the whole upper-layer header, RFC 8200
	// section 4.5), or fragments mixing ECN-capable and not-ECN-capable
	// codepoints (ip_frag_ecn_table, RFC 3168 section 5.3).
	FragmentDropMalformed

	// NumFragmentDrops sizes ReassemblyStats.Dropped.
	NumFragmentDrops
)

var fragmentDropNames = [NumFragmentDrops]string{
	FragmentDropNone:          "none",
	FragmentDropTimeout:       "timeout",
	FragmentDropMemory:        "memory",
	FragmentDropQueueLimit:    "queue_limit",
	FragmentDropFragmentLimit: "fragment_limit",
	FragmentDropOverlap:       "overlap",
	FragmentDropDuplicate:     "duplicate",
	FragmentDropTooBig:        "too_big",
	FragmentDropMalformed:     "malformed",
}

// String returns the reason's snake_case label.
func (d FragmentDrop) String() string {
	if d < NumFragmentDrops {
		return fragmentDropNames[d]
	}
	return "drop_" + strconv.Itoa(int(d))
}

// ReassemblyStats is a snapshot of a Reassembler's counters (which only
// grow) and gauges. Every fragment Add took is counted once in Fragments
// and, eventually, once in Delivered or in one of Dropped:
// Fragments = Delivered + the sum of Dropped + HeldFragments.
type ReassemblyStats struct {
	// Fragments counts the fragments Add took (not NotFragment).
	Fragments uint64
	// Reassembled counts the datagrams rebuilt; Delivered, the fragments
	// they were made of.
	Reassembled, Delivered uint64
	// Dropped counts dropped fragments by reason (Dropped[FragmentDropNone]
	// stays zero).
	Dropped [NumFragmentDrops]uint64
	// Queues, HeldFragments and Bytes are what both families hold now;
	// Bytes as charged against MaxBytes.
	Queues, HeldFragments, Bytes int
}

// Memory charges, in the spirit of the kernel's skb truesize and queue size:
// a fragment's record and its share of the queue's growing slice, and the
// queue with its map entry. TestReassemblyCharges keeps them above what the
// structures take.
const (
	fragmentCharge = 80
	queueCharge    = 256
)

// Reassembler reassembles IPv4 and IPv6 fragments. Its methods are safe for
// concurrent use. Build it with NewReassembler.
type Reassembler struct {
	clock        Clock
	maxBytes     int
	maxQueues    int
	maxFragments int
	timeout      [2]int64 // by family slot: IPv4, IPv6

	mu     sync.Mutex
	queues map[fragKey]*fragQueue
	fam    [2]fragFamily
	stats  ReassemblyStats // counters only; the gauges are summed in Stats
}

// fragFamily is one family's share: the kernel keeps one fqdir each.
type fragFamily struct {
	head, tail *fragQueue // by creation, hence by expiry
	queues     int
	fragments  int
	bytes      int
}

// fragKey identifies a queue. proto is zero for IPv6.
type fragKey struct {
	src, dst [16]byte
	id       uint32
	proto    uint8
	family   uint8
}

// fragQueue is one datagram being reassembled (the kernel's ipq or
// frag_queue).
type fragQueue struct {
	key        fragKey
	expires    int64
	prev, next *fragQueue
	frags      []fragment // sorted by offset, never overlapping
	// hdr is kept from the first fragment: the IPv4 header, or the IPv6
	// header and the extension headers before the Fragment header, whose
	// byte at nhOff names the Fragment header and becomes nextHdr.
	hdr     []byte
	nhOff   int
	nextHdr uint8
	length  int // end of the datagram's payload: known once last is set
	meat    int // payload bytes held
	first   bool
	last    bool
	ecn     uint8 // ECN codepoints seen, one bit each (ip4_frag_ecn)
	bytes   int   // charged to the family
}

// fragment is one queued fragment's payload.
type fragment struct {
	off, end int
	data     []byte
}

// NewReassembler builds a Reassembler. Zero fields of cfg take the defaults;
// negative ones are an error.
func NewReassembler(cfg ReassemblyConfig) (*Reassembler, error) {
	if cfg.MaxBytes < 0 || cfg.MaxQueues < 0 || cfg.MaxFragments < 0 || cfg.Timeout4 < 0 || cfg.Timeout6 < 0 {
		return nil, errors.New("conntrack: negative reassembly bound")
	}
	if cfg.Clock == nil {
		cfg.Clock = NewSystemClock()
	}
	r := &Reassembler{
		clock:        cfg.Clock,
		maxBytes:     orDefault(cfg.MaxBytes, DefaultReassemblyMaxBytes),
		maxQueues:    orDefault(cfg.MaxQueues, DefaultReassemblyMaxQueues),
		maxFragments: orDefault(cfg.MaxFragments, DefaultReassemblyMaxFragments),
		timeout: [2]int64{
			int64(orDefault(cfg.Timeout4, DefaultReassemblyTimeout4)),
			int64(orDefault(cfg.Timeout6, DefaultReassemblyTimeout6)),
		},
		queues: make(map[fragKey]*fragQueue),
	}
	return r, nil
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// IsFragment reports whether pkt looks like a fragment: IPv4 with MF set or
// a non-zero offset, or IPv6 with a Fragment header after nothing but
// Hop-by-Hop, Destination Options and Routing headers. It checks nothing
// else (Add does) and allocates nothing: the gate calls it for every packet.
func IsFragment(pkt []byte) bool {
	if len(pkt) < 20 {
		return false
	}
	switch pkt[0] >> 4 {
	case 4:
		return binary.BigEndian.Uint16(pkt[6:8])&0x3fff != 0
	case 6:
		if len(pkt) < 40 {
			return false
		}
		nh, off := pkt[6], 40
		for n := 0; n <= maxExtHeaders; n++ {
			switch nh {
			case nhFragment:
				return true
			case nhHopByHop, nhDestOpts, nhRouting:
			default:
				return false
			}
			if len(pkt)-off < 8 {
				return false
			}
			nh, off = pkt[off], off+(int(pkt[off+1])+1)*8
		}
	}
	return false
}

// fragInfo is what Add takes from a fragment's headers.
type fragInfo struct {
	key     fragKey
	off     int    // the payload's offset in the datagram's
	more    bool   // MF
	payload []byte // the fragment's data
	hdr     []byte // see fragQueue.hdr
	nhOff   int
	nextHdr uint8
	ecn     uint8 // 1 << the ECN codepoint
}

// Add takes pkt, an IP packet from the link. If pkt is a fragment it is
// queued, dropped, or completes its datagram, which Add then writes to
// buf[:0] (growing it if short) and returns. buf must not overlap pkt;
// Add keeps neither.
//
// A packet that is not a fragment, or whose IP headers Classify would refuse
// anyway (a bad IPv4 header checksum, lengths past the buffer, an IPv6
// extension header chain it does not accept), comes back NotFragment,
// uncounted: classify it as it is.
func (r *Reassembler) Add(pkt, buf []byte) ([]byte, FragmentVerdict, FragmentDrop) {
	var fi fragInfo
	if !parseFragment(pkt, &fi) {
		return nil, NotFragment, FragmentDropNone
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock.Now()
	r.expireLocked(now)
	r.stats.Fragments++
	return r.addLocked(&fi, buf, now)
}

// parseFragment fills fi from the fragment pkt and reports whether pkt is one
// Add takes.
func parseFragment(b []byte, fi *fragInfo) bool {
	if len(b) < 20 {
		return false
	}
	switch b[0] >> 4 {
	case 4:
		return parseFragment4(b, fi)
	case 6:
		return parseFragment6(b, fi)
	}
	return false
}

// parseFragment4 makes ip_rcv_core's checks, which come before defrag in the
// kernel, and reads the fragment fields.
func parseFragment4(b []byte, fi *fragInfo) bool {
	ihl := int(b[0]&0x0f) * 4
	if ihl < 20 || len(b) < ihl {
		return false
	}
	total := int(binary.BigEndian.Uint16(b[2:4]))
	if total < ihl || total > len(b) || !checksumOK(b[:ihl], 0) {
		return false
	}
	frag := binary.BigEndian.Uint16(b[6:8])
	if frag&0x3fff == 0 {
		return false
	}
	fi.key = fragKey{id: uint32(binary.BigEndian.Uint16(b[4:6])), proto: b[9], family: 4}
	copy(fi.key.src[:4], b[12:16])
	copy(fi.key.dst[:4], b[16:20])
	fi.off = int(frag&0x1fff) * 8
	fi.more = frag&0x2000 != 0
	fi.payload = b[ihl:total]
	fi.hdr = b[:ihl]
	fi.ecn = 1 << (b[1] & 3)
	return true
}

// parseFragment6 finds the Fragment header as find_prev_fhdr does, over the
// extension headers Classify accepts (see skipIPv6Ext), and reads it.
func parseFragment6(b []byte, fi *fragInfo) bool {
	if len(b) < 40 {
		return false
	}
	plen := int(binary.BigEndian.Uint16(b[4:6]))
	if plen == 0 || 40+plen > len(b) { // a zero payload length means a jumbogram: no fragments
		return false
	}
	b = b[:40+plen]
	nh, off, nhOff := b[6], 40, 6
	for n := 0; nh != nhFragment; n++ {
		if n == maxExtHeaders || len(b)-off < 8 {
			return false
		}
		h := b[off:]
		switch {
		case nh == nhHopByHop && off == 40, nh == nhDestOpts, nh == nhRouting && h[3] == 0:
		default:
			return false // no Fragment header, or one Classify refuses on its own
		}
		size := (int(h[1]) + 1) * 8
		if len(b)-off < size {
			return false
		}
		nh, nhOff, off = h[0], off, off+size
	}
	if len(b)-off < 8 {
		return false
	}
	fh := b[off : off+8]
	fo := binary.BigEndian.Uint16(fh[2:4])
	fi.key = fragKey{id: binary.BigEndian.Uint32(fh[4:8]), family: 6}
	copy(fi.key.src[:], b[8:24])
	copy(fi.key.dst[:], b[24:40])
	fi.off = int(fo &^ 7)
	fi.more = fo&1 != 0
	fi.payload = b[off+8:]
	fi.hdr = b[:off]
	fi.nhOff = nhOff
	fi.nextHdr = fh[0]
	fi.ecn = 1 << (b[1] >> 4 & 3)
	return true
}

// addLocked runs steps 2 to 5 for the fragment fi.
func (r *Reassembler) addLocked(fi *fragInfo, buf []byte, now int64) ([]byte, FragmentVerdict, FragmentDrop) {
	v4 := fi.key.family == 4
	end := fi.off + len(fi.payload)
	if v4 && fi.more {
		end &^= 7 // ip_frag_queue trims a middle fragment to 8-byte units
		fi.payload = fi.payload[:end-fi.off]
	}

	// Atomic fragments (IPv6, offset 0 and no more to come) are whole
	// datagrams, reassembled alone without touching any queue (RFC 6946
	// section 4, as ipv6_frag_rcv does).
	if !v4 && fi.off == 0 && !fi.more {
		r.stats.Reassembled++
		r.stats.Delivered++
		out := append(append(buf[:0], fi.hdr...), fi.payload...)
		finishIPv6(out, fi.nhOff, fi.nextHdr, 0)
		return out, FragmentComplete, FragmentDropNone
	}
	q := r.queues[fi.key]

	// Checks that need no queue. IPv4 discards the datagram on any of
	// them (discard_qp in ip_frag_queue; the size only at reassembly,
	// ip_frag_reasm's E2BIG, which we need not wait for); IPv6 drops the
	// fragment alone (the err path of nf_ct_frag6_queue), but for a middle
	// fragment that is not a multiple of 8 bytes, which kills the queue.
	switch {
	case v4 && end > 65535-20, !v4 && end > 65535:
		return r.refuse(q, v4, FragmentDropTooBig)
	case !v4 && fi.more && end&7 != 0:
		return r.refuse(q, true, FragmentDropMalformed)
	case end == fi.off:
		return r.refuse(q, v4, FragmentDropMalformed)
	case !v4 && fi.off == 0 && upperHeaderTruncated(fi.payload, fi.nextHdr):
		return r.refuse(nil, false, FragmentDropMalformed)
	}
	if q != nil {
		switch {
		case !fi.more && (end < q.length || q.last && end != q.length),
			fi.more && q.last && end > q.length:
			return r.refuse(q, v4, FragmentDropMalformed)
		}
	}

	fam := &r.fam[famSlot(v4)]
	charge := fragmentCharge + len(fi.payload)
	if fi.off == 0 && (q == nil || !q.first) {
		charge += len(fi.hdr)
	}
	if q == nil {
		charge += queueCharge
	}
	if fam.bytes+charge > r.maxBytes {
		return r.refuse(nil, false, FragmentDropMemory)
	}
	if q == nil {
		if fam.queues >= r.maxQueues {
			return r.refuse(nil, false, FragmentDropQueueLimit)
		}
		q = r.newQueueLocked(fi.key, fam, now)
	}

	// inet_frag_queue_insert: where does it go, and what does it touch?
	i, dup, overlap := placeFragment(q.frags, fi.off, end)
	switch {
	case dup:
		return r.refuse(nil, false, FragmentDropDuplicate)
	case overlap:
		return r.refuse(q, true, FragmentDropOverlap)
	case len(q.frags) >= r.maxFragments:
		return r.refuse(q, true, FragmentDropFragmentLimit)
	}
	q.frags = append(q.frags, fragment{})
	copy(q.frags[i+1:], q.frags[i:])
	q.frags[i] = fragment{off: fi.off, end: end, data: append([]byte(nil), fi.payload...)}
	q.meat += end - fi.off
	q.ecn |= fi.ecn
	q.bytes += charge
	fam.bytes += charge
	fam.fragments++
	if fi.off == 0 {
		q.first = true
		q.hdr = append([]byte(nil), fi.hdr...)
		q.nhOff, q.nextHdr = fi.nhOff, fi.nextHdr
	}
	if !fi.more {
		q.last = true
		q.length = end
	} else if end > q.length {
		q.length = end
	}
	if !q.first || !q.last || q.meat != q.length {
		return nil, FragmentHeld, FragmentDropNone
	}
	return r.reassembleLocked(q, buf)
}

// famSlot indexes per-family arrays.
func famSlot(v4 bool) int {
	if v4 {
		return 0
	}
	return 1
}

// refuse drops the fragment being added and, when kill is set and q exists,
// the datagram q with it, all counted under why.
func (r *Reassembler) refuse(q *fragQueue, kill bool, why FragmentDrop) ([]byte, FragmentVerdict, FragmentDrop) {
	r.stats.Dropped[why]++
	if kill && q != nil {
		r.killLocked(q, why)
	}
	return nil, FragmentDropped, why
}

// placeFragment finds where [off, end) goes in frags (sorted, disjoint), and
// whether it is a duplicate (it lies within held fragments that leave no gap
// around it: inet_frag_queue_insert's "runs") or overlaps something
// otherwise.
func placeFragment(frags []fragment, off, end int) (i int, dup, overlap bool) {
	// The common case first: in order, after everything held.
	n := len(frags)
	if n == 0 || frags[n-1].end <= off {
		return n, false, false
	}
	for frags[i].end <= off { // stops at n-1 at the latest
		i++
	}
	if end <= frags[i].off {
		return i, false, false // fits in the gap before frags[i]
	}
	// [off, end) meets frags[i]: a duplicate if it is covered without gaps.
	if frags[i].off > off {
		return i, false, true
	}
	for j := i; ; j++ {
		if frags[j].end >= end {
			return i, true, false
		}
		if j+1 == n || frags[j+1].off != frags[j].end {
			return i, false, true
		}
	}
}

// upperHeaderTruncated reports whether an IPv6 first fragment's payload p,
// starting with next header nh, ends inside its upper-layer header: the
// kernel's ipv6frag_thdr_truncated, which walks the extension headers as
// ipv6_skip_exthdr does and, when that succeeds, wants the whole TCP, UDP or
// ICMPv6 header, or one byte of any other.
func upperHeaderTruncated(p []byte, nh uint8) bool {
	off := 0
	for {
		var size int
		switch nh {
		case nhHopByHop, nhRouting, nhDestOpts:
			if len(p)-off < 2 {
				return false
			}
			size = (int(p[off+1]) + 1) * 8
		case 51: // Authentication Header: its length is in 4-byte units, less 2
			if len(p)-off < 2 {
				return false
			}
			size = (int(p[off+1]) + 2) * 4
		case nhFragment:
			if len(p)-off < 8 {
				return false
			}
			if binary.BigEndian.Uint16(p[off+2:off+4])&^7 != 0 {
				return false // a later fragment of an inner datagram: no upper header to look at
			}
			size = 8
		case nhNone:
			return false
		default:
			need := 1
			switch nh {
			case nhTCP:
				need = 20
			case nhUDP, nhICMPv6:
				need = 8
			}
			return off+need > len(p)
		}
		if len(p)-off < size {
			return false
		}
		nh, off = p[off], off+size
	}
}

// newQueueLocked creates the queue for k, timed from now (inet_frag_create
// starts the timer once; later fragments do not restart it).
func (r *Reassembler) newQueueLocked(k fragKey, fam *fragFamily, now int64) *fragQueue {
	q := &fragQueue{key: k, expires: now + r.timeout[famSlot(k.family == 4)]}
	r.queues[k] = q
	q.prev = fam.tail
	if fam.tail != nil {
		fam.tail.next = q
	} else {
		fam.head = q
	}
	fam.tail = q
	fam.queues++
	return q
}

// removeLocked takes q out of the map and its family's list and releases its
// charge. It returns how many fragments it held.
func (r *Reassembler) removeLocked(q *fragQueue) int {
	fam := &r.fam[famSlot(q.key.family == 4)]
	delete(r.queues, q.key)
	if q.prev != nil {
		q.prev.next = q.next
	} else {
		fam.head = q.next
	}
	if q.next != nil {
		q.next.prev = q.prev
	} else {
		fam.tail = q.prev
	}
	q.prev, q.next = nil, nil
	fam.queues--
	fam.bytes -= q.bytes
	fam.fragments -= len(q.frags)
	return len(q.frags)
}

// killLocked discards the datagram q, counting its fragments under why
// (inet_frag_kill).
func (r *Reassembler) killLocked(q *fragQueue, why FragmentDrop) {
	r.stats.Dropped[why] += uint64(r.removeLocked(q))
}

// expireLocked discards the queues whose time is up at now.
func (r *Reassembler) expireLocked(now int64) int {
	n := 0
	for i := range r.fam {
		for q := r.fam[i].head; q != nil && now >= q.expires; q = r.fam[i].head {
			r.killLocked(q, FragmentDropTimeout)
			n++
		}
	}
	return n
}

// ecnTable is ip_frag_ecn_table (inet_fragment.c) over the codepoint bits of
// fragQueue.ecn: the bits to OR into the reassembled header, or 0xff when
// ECN-capable and not-ECN-capable fragments were mixed (RFC 3168 section
// 5.3).
var ecnTable = func() (t [16]uint8) {
	const notECT, ect1, ect0, ce = 1 << 0, 1 << 1, 1 << 2, 1 << 3
	for bits := range t {
		switch {
		case bits&notECT != 0 && bits&^notECT != 0:
			t[bits] = 0xff
		case bits&ce != 0 && bits&(ect0|ect1) != 0:
			t[bits] = 3 // CE
		}
	}
	return t
}()

// reassembleLocked builds the complete datagram q into buf (ip_frag_reasm,
// nf_ct_frag6_reasm), or discards it.
func (r *Reassembler) reassembleLocked(q *fragQueue, buf []byte) ([]byte, FragmentVerdict, FragmentDrop) {
	n := r.removeLocked(q)
	v4 := q.key.family == 4
	ecn := ecnTable[q.ecn]
	size := len(q.hdr) + q.length
	if !v4 {
		size -= 40 // the IPv6 limit is on the payload length
	}
	why := FragmentDropNone
	switch {
	case ecn == 0xff:
		why = FragmentDropMalformed
	case size > 65535:
		why = FragmentDropTooBig
	}
	if why != FragmentDropNone {
		r.stats.Dropped[why] += uint64(n)
		return nil, FragmentDropped, why
	}
	r.stats.Reassembled++
	r.stats.Delivered += uint64(n)
	out := append(buf[:0], q.hdr...)
	for _, f := range q.frags {
		out = append(out, f.data...)
	}
	if v4 {
		finishIPv4(out, len(q.hdr), ecn)
	} else {
		finishIPv6(out, q.nhOff, q.nextHdr, ecn)
	}
	return out, FragmentComplete, FragmentDropNone
}

// finishIPv4 fixes the header of the datagram out, whose header is ihl bytes
// long: the total length set, the fragment fields cleared, ECN CE added when
// the fragments carried it, the header checksum recomputed. (ip_frag_reasm
// also sets DF when the largest fragment had it, for refragmenting on
// output; nothing here forwards.)
func finishIPv4(out []byte, ihl int, ecn uint8) {
	binary.BigEndian.PutUint16(out[2:4], uint16(len(out)))
	out[1] |= ecn
	out[6], out[7] = 0, 0
	out[10], out[11] = 0, 0
	binary.BigEndian.PutUint16(out[10:12], ^fold(sum(out[:ihl], 0)))
}

// finishIPv6 fixes the header of the datagram out, made of the unfragmentable
// part and the payload: the Fragment header is left out, so the byte at nhOff
// that named it now names nextHdr; the payload length set; ECN CE added to
// the traffic class when the fragments carried it.
func finishIPv6(out []byte, nhOff int, nextHdr, ecn uint8) {
	out[nhOff] = nextHdr
	binary.BigEndian.PutUint16(out[4:6], uint16(len(out)-40))
	out[1] |= ecn << 4
}

// Sweep discards the queues whose time is up and returns how many. Add does
// the same before every fragment; an owner calls Sweep periodically to free
// their memory when no fragment arrives.
func (r *Reassembler) Sweep() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expireLocked(r.clock.Now())
}

// Stats returns a snapshot of the counters and gauges.
func (r *Reassembler) Stats() ReassemblyStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	for i := range r.fam {
		s.Queues += r.fam[i].queues
		s.HeldFragments += r.fam[i].fragments
		s.Bytes += r.fam[i].bytes
	}
	return s
}

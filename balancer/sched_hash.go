package balancer

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Source hashing and destination hashing: a static table of
// IP_VS_SH_TAB_SIZE (IP_VS_DH_TAB_SIZE) buckets, each naming a destination,
// filled in list order whenever the list changes, and looked up by a hash of
// the client's (the service's) address.
//
// The table size is 1 << CONFIG_IP_VS_SH_TAB_BITS (CONFIG_IP_VS_DH_TAB_BITS),
// 8 by default (net/netfilter/ipvs/Kconfig), so 256 buckets, and the hash is
// the multiplicative one both files use, (addr * 2654435761) & (size - 1),
// 2654435761 being the 32-bit golden ratio prime. Only the low 8 bits of the
// product are kept, and those depend only on the low 8 bits of the factors,
// so 32-bit arithmetic gives the kernel's result although the kernel
// multiplies by an unsigned long.
//
// The table depends on the list order: bucket i goes to the i-th destination
// (cycling). The kernel's list is in the order the destinations were added,
// newest first (ip_vs_ctl.c, __ip_vs_update_dest: list_add_rcu at the head);
// here it is the order of the []Endpoint. To choose as a given kernel node
// chooses, pass the endpoints in that node's order (`ipvsadm -Ln` prints
// them in list order).

// hashTabBits is CONFIG_IP_VS_SH_TAB_BITS and CONFIG_IP_VS_DH_TAB_BITS at
// their default.
const (
	hashTabBits = 8
	hashTabSize = 1 << hashTabBits
	hashTabMask = hashTabSize - 1
)

// goldenRatio32 is the multiplier of ip_vs_sh_hashkey and ip_vs_dh_hashkey.
const goldenRatio32 = 2654435761

// foldAddr is the addr_fold of ip_vs_sh_hashkey, ip_vs_dh_hashkey and
// ip_vs_mh_hashkey, in host order (after the ntohl): an IPv4 address as a
// number; an IPv6 address as the exclusive or of its four 32-bit words. The
// kernel folds by the service's address family; an address here is folded
// by its own (an IPv4-mapped IPv6 address is IPv6, as it would be in an
// IPv6 packet).
func foldAddr(a netip.Addr) uint32 {
	if a.Is4() {
		b := a.As4()
		return binary.BigEndian.Uint32(b[:])
	}
	b := a.As16()
	return binary.BigEndian.Uint32(b[0:4]) ^ binary.BigEndian.Uint32(b[4:8]) ^
		binary.BigEndian.Uint32(b[8:12]) ^ binary.BigEndian.Uint32(b[12:16])
}

// hashTable is a built sh or dh table for one list: each bucket holds an
// index into eps, or -1 for a NULL bucket (an empty list).
type hashTable struct {
	eps     []Endpoint
	buckets [hashTabSize]int32
}

// hashTables holds the current table of an sh or dh scheduler: read with
// one atomic load, rebuilt under a mutex when the list changes.
type hashTables struct {
	cur   atomic.Pointer[hashTable]
	build sync.Mutex
}

// get returns the table for eps, building it with fill when eps is not the
// list of the current one.
func (h *hashTables) get(eps []Endpoint, fill func(*hashTable)) *hashTable {
	if t := h.cur.Load(); t != nil && sameList(t.eps, eps) {
		return t
	}
	h.build.Lock()
	defer h.build.Unlock()
	if t := h.cur.Load(); t != nil && sameList(t.eps, eps) {
		return t
	}
	t := &hashTable{eps: eps}
	fill(t)
	h.cur.Store(t)
	return t
}

// ---- sh: linux net/netfilter/ipvs/ip_vs_sh.c ----

// sh is ip_vs_sh.c.
//
//   - ip_vs_sh_reassign fills the buckets in order with the destinations in
//     list order, giving each as many consecutive buckets as its weight
//     before moving on ("Don't move to next dest until filling weight"), and
//     cycling through the list until all 256 are filled. A destination of
//     weight 0 still gets one bucket per cycle (the move-on test is
//     ++count >= weight). An empty list leaves every bucket NULL.
//   - ip_vs_sh_hashkey hashes (offset + (port + addr_fold) * 2654435761)
//     & mask, where port is the client's source port with the sh-port flag
//     (IP_VS_SVC_F_SCHED_SH_PORT) and 0 without, and offset is 0 but for
//     the fallback.
//   - ip_vs_sh_get returns the bucket's destination unless it is
//     unavailable (weight <= 0): then NULL. With sh-fallback
//     (IP_VS_SVC_F_SCHED_SH_FALLBACK), ip_vs_sh_get_fallback instead tries
//     offsets 0..255 in turn, each with roffset = (offset + ihash) % 256,
//     until an available destination, stopping at a NULL bucket.
type sh struct {
	flags  SchedFlags
	tables hashTables
}

var _ Scheduler = (*sh)(nil)

func (s *sh) Name() string { return "sh" }

func (s *sh) Update(eps []Endpoint) error {
	s.tables.get(eps, fillSH)
	return nil
}

func fillSH(t *hashTable) {
	n := len(t.eps)
	if n == 0 {
		for i := range t.buckets {
			t.buckets[i] = -1
		}
		return
	}
	p, count := 0, int64(0)
	for i := range t.buckets {
		t.buckets[i] = int32(p)
		count++
		if count >= weightOf(&t.eps[p]) {
			p = (p + 1) % n
			count = 0
		}
	}
}

// shHashKey is ip_vs_sh_hashkey for a folded address.
func shHashKey(fold uint32, port uint16, offset uint32) uint32 {
	return (offset + (uint32(port)+fold)*goldenRatio32) & hashTabMask
}

func (s *sh) Pick(eps []Endpoint, f Flow) int {
	t := s.tables.get(eps, fillSH)
	fold := foldAddr(f.Client.Addr())
	var port uint16
	if s.flags&SchedFlag2 != 0 {
		port = f.Client.Port()
	}
	ihash := shHashKey(fold, port, 0)
	d := t.buckets[ihash]
	if d < 0 {
		return -1
	}
	if weightOf(&eps[d]) > 0 {
		return int(d)
	}
	if s.flags&SchedFlag1 == 0 {
		return -1
	}
	for offset := uint32(0); offset < hashTabSize; offset++ {
		roffset := (offset + ihash) % hashTabSize
		d := t.buckets[shHashKey(fold, port, roffset)]
		if d < 0 {
			break
		}
		if weightOf(&eps[d]) > 0 {
			return int(d)
		}
	}
	return -1
}

// ---- dh: linux net/netfilter/ipvs/ip_vs_dh.c ----

// dh is ip_vs_dh.c: ip_vs_dh_reassign fills bucket i with the (i mod n)-th
// destination, weights playing no part; ip_vs_dh_hashkey is
// (addr_fold * 2654435761) & mask over the packet's destination address;
// an unavailable destination (weight <= 0) gives NULL. dh has no flags.
//
// The destination address of a connection to a Service is the address the
// client connected to (the ClusterIP), the same for every connection, so
// dh sends all of a Service's traffic through one address to one endpoint,
// as a kernel IPVS service with dh does. It is meant for services that
// cover many destination addresses (firewall marks), which Kubernetes has
// not.
type dh struct {
	tables hashTables
}

var _ Scheduler = (*dh)(nil)

func (s *dh) Name() string { return "dh" }

func (s *dh) Update(eps []Endpoint) error {
	s.tables.get(eps, fillDH)
	return nil
}

func fillDH(t *hashTable) {
	n := len(t.eps)
	for i := range t.buckets {
		if n == 0 {
			t.buckets[i] = -1
		} else {
			t.buckets[i] = int32(i % n)
		}
	}
}

// dhHashKey is ip_vs_dh_hashkey for a folded address.
func dhHashKey(fold uint32) uint32 {
	return (fold * goldenRatio32) & hashTabMask
}

func (s *dh) Pick(eps []Endpoint, f Flow) int {
	t := s.tables.get(eps, fillDH)
	d := t.buckets[dhHashKey(foldAddr(f.Service.Addr()))]
	if d < 0 || weightOf(&eps[d]) <= 0 {
		return -1
	}
	return int(d)
}

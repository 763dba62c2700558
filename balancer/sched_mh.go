package balancer

import (
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"sync"
	"sync/atomic"
)

// ---- mh: linux net/netfilter/ipvs/ip_vs_mh.c ----
//
// Maglev hashing (Eisenbud et al., NSDI 2016, section 3.4), as ip_vs_mh.c
// builds and reads it:
//
//  1. The lookup table has IP_VS_MH_TAB_SIZE slots, a prime picked from
//     primes[] = {251, 509, ..., 131071} by CONFIG_IP_VS_MH_TAB_INDEX - 8;
//     the index defaults to 12 (net/netfilter/ipvs/Kconfig), so the table
//     has primes[4] = 4093 slots. IP_VS_MH_TAB_BITS is half the index, 6.
//  2. Each destination gets a permutation of the slots from two hashes of
//     v = port + addr_fold (its own address and port): offset =
//     hsiphash(v, hash1) % M and skip = hsiphash(v, hash2) % (M - 1) + 1;
//     its preferences are offset, offset + skip, offset + 2*skip, ... mod M
//     (ip_vs_mh_permutate). The keys are fixed (generate_hash_secret):
//     hash1 = {2654435761, 2654435761}, hash2 = {2654446892, 2654446892}.
//  3. Each destination takes turns = (last_weight / gcd) >> rshift turns,
//     or 1 if that is 0 and last_weight is not; gcd is the gcd of the
//     last_weights above zero and rshift = fls(max last_weight / gcd) -
//     IP_VS_MH_TAB_BITS, at least 0 (ip_vs_mh_gcd_weight,
//     ip_vs_mh_shift_weight). A destination with no turns gets no slot.
//  4. ip_vs_mh_populate goes round the list in order, again and again; each
//     destination in turn takes its next preferred free slot, turns times,
//     and the filling stops the moment the last slot is taken. With no
//     weight above zero (gcd < 1) every slot is NULL (ip_vs_mh_reset).
//  5. A connection goes to lookup[hsiphash(port + addr_fold, hash1) % M],
//     the client's address and, with the mh-port flag
//     (IP_VS_SVC_F_SCHED_MH_PORT), its source port; NULL if that
//     destination is unavailable (weight <= 0). With mh-fallback
//     (IP_VS_SVC_F_SCHED_MH_FALLBACK) ip_vs_mh_get_fallback tries offsets
//     0..M-1 in turn, each hashing roffset + port + addr_fold with
//     roffset = (offset + ihash) % M, until an available destination,
//     stopping at a NULL slot.
//  6. last_weight is a destination's last weight other than 0: a weight set
//     to 0 keeps the destination's slots (ip_vs_ctl.c, __ip_vs_update_dest:
//     "keep the last_weight with latest non-0 weight"), so quiescing an
//     endpoint (kube-proxy does, for terminating ones) does not move anyone
//     else's clients. An endpoint new to the list starts with its weight as
//     last_weight, as the kernel's add does.
//  7. A service with more destinations than slots is refused (-EINVAL from
//     ip_vs_mh_reassign).
//
// The table depends on the list order (as sh's; see sched_hash.go).

// mhPrimes is primes[] of ip_vs_mh.c.
var mhPrimes = [...]uint32{251, 509, 1021, 2039, 4093, 8191, 16381, 32749, 65521, 131071}

// mhTabIndex is CONFIG_IP_VS_MH_TAB_INDEX at its default.
const mhTabIndex = 12

// mhTabSize is IP_VS_MH_TAB_SIZE, primes[CONFIG_IP_VS_MH_TAB_INDEX - 8];
// mhTabBits is IP_VS_MH_TAB_BITS.
var mhTabSize = mhPrimes[mhTabIndex-8]

const mhTabBits = mhTabIndex / 2

// The keys of generate_hash_secret: each hsiphash_key_t is two unsigned
// longs, both set to the same constant.
const (
	mhKey1 = 2654435761
	mhKey2 = 2654446892
)

// ErrTooManyEndpoints is mh's refusal of a list longer than its table.
var ErrTooManyEndpoints = errors.New("more endpoints than the maglev table has slots")

// mhHashKey is ip_vs_mh_hashkey: hsiphash of the unsigned int
// offset + port + addr_fold.
func mhHashKey(fold uint32, port uint16, key uint64, offset uint32) uint32 {
	return hsiphash32(key, key, offset+uint32(port)+fold)
}

// mhTable is a built lookup table for one list: each slot holds an index
// into eps, or -1 for NULL.
type mhTable struct {
	eps    []Endpoint
	lookup []int32
	// lastWeight[i] is eps[i]'s last_weight.
	lastWeight []int32
	// err is why the list has no table (lookup is then nil).
	err error
}

type mh struct {
	flags SchedFlags
	size  uint32 // M, mhTabSize
	cur   atomic.Pointer[mhTable]
	build sync.Mutex
}

var _ Scheduler = (*mh)(nil)

func newMH(flags SchedFlags) *mh {
	return &mh{flags: flags, size: mhTabSize}
}

func (s *mh) Name() string { return "mh" }

func (s *mh) Update(eps []Endpoint) error {
	_, err := s.table(eps)
	return err
}

// table returns the lookup table for eps, building it when eps is not the
// current list, and the reason the list has none.
func (s *mh) table(eps []Endpoint) (*mhTable, error) {
	if t := s.cur.Load(); t != nil && sameList(t.eps, eps) {
		return t, t.err
	}
	s.build.Lock()
	defer s.build.Unlock()
	prev := s.cur.Load()
	if prev != nil && sameList(prev.eps, eps) {
		return prev, prev.err
	}
	t := &mhTable{eps: eps, lastWeight: lastWeights(prev, eps)}
	if uint32(len(eps)) > s.size {
		// ip_vs_mh_reassign refuses before touching the table; the
		// kernel refuses the destination that would be one too many,
		// and the service keeps the table it had. A table for some
		// other list is of no use here, so this list has none.
		t.err = fmt.Errorf("mh: %d endpoints, %d slots: %w", len(eps), s.size, ErrTooManyEndpoints)
	} else {
		t.lookup = s.populate(eps, t.lastWeight)
	}
	s.cur.Store(t)
	return t, t.err
}

// lastWeights carries last_weight over from the previous list: an endpoint
// already there keeps its last_weight when its weight is now 0 and takes the
// new weight otherwise; a new endpoint starts at its weight.
func lastWeights(prev *mhTable, eps []Endpoint) []int32 {
	lw := make([]int32, len(eps))
	var before map[netip.AddrPort]int32
	if prev != nil && len(prev.eps) > 0 {
		before = make(map[netip.AddrPort]int32, len(prev.eps))
		for i := range prev.eps {
			before[prev.eps[i].Addr] = prev.lastWeight[i]
		}
	}
	for i := range eps {
		w := int32(weightOf(&eps[i]))
		if old, ok := before[eps[i].Addr]; ok && w == 0 {
			w = old
		}
		lw[i] = w
	}
	return lw
}

// populate is ip_vs_mh_gcd_weight, ip_vs_mh_shift_weight,
// ip_vs_mh_permutate and ip_vs_mh_populate. It returns nil (every slot NULL)
// when no last_weight is above zero.
func (s *mh) populate(eps []Endpoint, lastWeight []int32) []int32 {
	m := s.size
	// gcd and rshift.
	var g, maxW int64
	for _, w := range lastWeight {
		if w > 0 {
			if g > 0 {
				g = gcd(int64(w), g)
			} else {
				g = int64(w)
			}
		}
		maxW = max(maxW, int64(w))
	}
	if g < 1 {
		return nil
	}
	// fls(x) is the position of the highest set bit, 1-based.
	rshift := max(bits.Len64(uint64(maxW/g))-mhTabBits, 0)

	// The permutations.
	type setup struct {
		perm, skip uint32
		turns      int64
	}
	ds := make([]setup, len(eps))
	for i := range eps {
		fold := foldAddr(eps[i].Addr.Addr())
		port := eps[i].Addr.Port()
		ds[i].perm = mhHashKey(fold, port, mhKey1, 0) % m
		ds[i].skip = mhHashKey(fold, port, mhKey2, 0)%(m-1) + 1
		lw := int64(lastWeight[i])
		ds[i].turns = (lw / g) >> rshift
		if ds[i].turns == 0 && lw != 0 {
			ds[i].turns = 1
		}
	}

	// The filling.
	lookup := make([]int32, m)
	taken := make([]uint64, (m+63)/64)
	n, dtCount := uint32(0), int64(0)
	for n < m {
		for i := 0; i < len(ds); {
			d := &ds[i]
			if d.turns < 1 {
				i++
				continue
			}
			c := d.perm
			for taken[c/64]&(1<<(c%64)) != 0 {
				d.perm += d.skip
				if d.perm >= m {
					d.perm -= m
				}
				c = d.perm
			}
			taken[c/64] |= 1 << (c % 64)
			lookup[c] = int32(i)
			n++
			if n == m {
				return lookup
			}
			dtCount++
			if dtCount >= d.turns {
				dtCount = 0
				i++
			}
		}
	}
	return lookup
}

func (s *mh) Pick(eps []Endpoint, f Flow) int {
	t, _ := s.table(eps)
	if t.lookup == nil {
		return -1
	}
	fold := foldAddr(f.Client.Addr())
	var port uint16
	if s.flags&SchedFlag2 != 0 {
		port = f.Client.Port()
	}
	m := s.size
	ihash := mhHashKey(fold, port, mhKey1, 0) % m
	d := t.lookup[ihash]
	if weightOf(&eps[d]) > 0 {
		return int(d)
	}
	if s.flags&SchedFlag1 == 0 {
		return -1
	}
	for offset := uint32(0); offset < m; offset++ {
		roffset := (offset + ihash) % m
		d := t.lookup[mhHashKey(fold, port, mhKey1, roffset)%m]
		if weightOf(&eps[d]) > 0 {
			return int(d)
		}
	}
	return -1
}

package conntrack

// index is a shard's hash index from Original tuple to entry: open addressing
// with linear probing over a power-of-two array of (hash, entry) slots, kept
// at most half full, with backward-shift deletion so that no tombstones
// accumulate. It stands in for a Go map on the packet path: the tuple hash is
// computed once per packet, for shard selection, and reused here; a hit costs
// a slot read or two and one key comparison.
type index struct {
	slots []slot
	n     int
}

type slot struct {
	hash uint64
	e    *entry // nil: empty
}

// minSlots is the smallest array an index allocates.
const minSlots = 8

// get returns the entry for k, whose hash is h, or nil.
func (x *index) get(k *Tuple, h uint64) *entry {
	if x.n == 0 {
		return nil
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.e == nil {
			return nil
		}
		if s.hash == h && s.e.key == *k {
			return s.e
		}
	}
}

// insert adds e, whose key hashes to h and is not in the index yet.
func (x *index) insert(e *entry, h uint64) {
	if (x.n+1)*2 > len(x.slots) {
		x.resize(max(len(x.slots)*2, minSlots))
	}
	x.place(slot{h, e})
	x.n++
}

func (x *index) place(s slot) {
	mask := uint64(len(x.slots) - 1)
	i := s.hash & mask
	for x.slots[i].e != nil {
		i = (i + 1) & mask
	}
	x.slots[i] = s
}

// remove deletes the entry for k, whose hash is h, and reports whether it was
// there. Later members of the probe run shift back into the hole when their
// home slot allows it, so lookups never need to skip deleted slots.
func (x *index) remove(k *Tuple, h uint64) bool {
	if x.n == 0 {
		return false
	}
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for {
		s := &x.slots[i]
		if s.e == nil {
			return false
		}
		if s.hash == h && s.e.key == *k {
			break
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; x.slots[j].e != nil; j = (j + 1) & mask {
		home := x.slots[j].hash & mask
		// The entry at j may fill the hole at i unless its home lies in
		// the cyclic range (i, j].
		if (j-home)&mask >= (j-i)&mask {
			x.slots[i] = x.slots[j]
			i = j
		}
	}
	x.slots[i] = slot{}
	x.n--
	if len(x.slots) > 64 && x.n*8 < len(x.slots) {
		x.resize(len(x.slots) / 2)
	}
	return true
}

func (x *index) resize(size int) {
	old := x.slots
	x.slots = make([]slot, size)
	for _, s := range old {
		if s.e != nil {
			x.place(s)
		}
	}
}

// each calls f for every entry. f must not change the index.
func (x *index) each(f func(*entry)) {
	for i := range x.slots {
		if e := x.slots[i].e; e != nil {
			f(e)
		}
	}
}

package conntrack

import (
	"net/netip"
	"testing"
)

// TestIndexAgainstMap runs random inserts, lookups and removals on an index
// and on a Go map side by side. Hashes come from a tiny range, so almost
// every key collides and probe runs wrap around the array: the paths that
// backward-shift deletion must get right.
func TestIndexAgainstMap(t *testing.T) {
	rng := testRand(t)
	for _, hashes := range []int{1, 3, 64, 1 << 20} {
		var x index
		ref := map[Tuple]*entry{}
		hashOf := map[Tuple]uint64{}
		keys := make([]Tuple, 300)
		for i := range keys {
			keys[i] = MakeTuple(UDP, netip.AddrPortFrom(client4.Addr(), uint16(i)), service4)
			// Spread colliding hashes over the top bits too, as real ones are.
			hashOf[keys[i]] = uint64(rng.IntN(hashes)) * 0x9e3779b97f4a7c15
		}
		for step := 0; step < 20000; step++ {
			k := keys[rng.IntN(len(keys))]
			h := hashOf[k]
			switch rng.IntN(3) {
			case 0:
				if ref[k] == nil {
					e := &entry{key: k}
					x.insert(e, h)
					ref[k] = e
				}
			case 1:
				if got := x.remove(&k, h); got != (ref[k] != nil) {
					t.Fatalf("hashes %d step %d: remove %v = %v", hashes, step, k, got)
				}
				delete(ref, k)
			}
			if got := x.get(&k, h); got != ref[k] {
				t.Fatalf("hashes %d step %d: get %v = %p, want %p", hashes, step, k, got, ref[k])
			}
			if x.n != len(ref) {
				t.Fatalf("n %d, want %d", x.n, len(ref))
			}
		}
		seen := 0
		x.each(func(e *entry) {
			seen++
			if ref[e.key] != e {
				t.Errorf("each yielded %v", e.key)
			}
		})
		if seen != len(ref) {
			t.Errorf("each yielded %d, want %d", seen, len(ref))
		}
		for k := range ref {
			k := k
			if !x.remove(&k, hashOf[k]) {
				t.Fatalf("final remove of %v failed", k)
			}
		}
		if x.n != 0 || len(x.slots) > 64 {
			t.Errorf("empty index: n %d, %d slots", x.n, len(x.slots))
		}
	}
}

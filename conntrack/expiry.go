package conntrack

// Expiry: each shard keeps its entries in a min-heap keyed on when they are
// due. Lookups treat an entry past its time as gone (Classify and Confirm
// also remove it); only the heap finds the entries that see no more packets.
//
// 1. Sweep (owner, periodically) runs expireLocked on every shard; Confirm
//    runs it on a full shard, and evictElsewhere on the others, before early
//    drop (eviction.go).
// 2. expireLocked pops the due keys: it removes the entries really due and
//    re-keys those refreshed since.
// 3. The heap itself: setExpiry (on refresh), push (on insert), heapRemove
//    (on removal), and the sifting swap, up and down.

// Sweep removes every entry whose timeout has passed and returns how many it
// removed, calling OnRemove for each. The table never sweeps by itself:
// lookups drop the expired entries they meet, but only Sweep reclaims flows
// that see no more packets, so the owner must call it periodically (every
// second is plenty; the cost is proportional to the entries due, not to the
// table's size). It locks one shard at a time.
func (t *Table) Sweep() int {
	now := t.clock.Now()
	n := 0
	for i := range t.shards {
		var pend pending
		sh := &t.shards[i]
		sh.mu.Lock()
		n += t.expireLocked(sh, now, &pend)
		sh.mu.Unlock()
		t.fire(&pend)
	}
	return n
}

// expireLocked removes the entries of sh whose time has come and returns how
// many. Entries whose heap key is stale (they were refreshed since) are moved
// to their real expiry instead.
func (t *Table) expireLocked(sh *shard, now int64, pend *pending) int {
	n := 0
	for len(sh.heap) > 0 {
		top := &sh.heap[0]
		if top.at > now {
			break
		}
		if e := top.e; e.expires <= now {
			t.removeLocked(sh, e, RemoveExpired, now, pend)
			n++
			continue
		}
		top.at = top.e.expires
		sh.down(0)
	}
	return n
}

// heapItem is an entry in a shard's expiry heap. Its key, at, is when the
// entry was due at the last look, never later than its real expiry: a later
// expiry is picked up lazily when the stale key comes due, so refreshing a
// busy flow costs no heap work. The key sits next to the pointer so that
// sifting does not touch the entries.
type heapItem struct {
	at int64
	e  *entry
}

// setExpiry sets e's expiry, moving its heap key earlier if needed (a
// shorter timeout).
func (sh *shard) setExpiry(e *entry, at int64) {
	e.expires = at
	if i := int(e.heapIdx); i >= 0 && at < sh.heap[i].at {
		sh.heap[i].at = at
		sh.up(i)
	}
}

// push adds e, keyed on its expiry.
func (sh *shard) push(e *entry) {
	e.heapIdx = int32(len(sh.heap))
	sh.heap = append(sh.heap, heapItem{e.expires, e})
	sh.up(int(e.heapIdx))
}

func (sh *shard) heapRemove(e *entry) {
	i := int(e.heapIdx)
	if i < 0 {
		return
	}
	last := len(sh.heap) - 1
	if i != last {
		sh.swap(i, last)
	}
	sh.heap[last] = heapItem{}
	sh.heap = sh.heap[:last]
	e.heapIdx = -1
	if i != last && !sh.down(i) {
		sh.up(i)
	}
}

func (sh *shard) swap(i, j int) {
	h := sh.heap
	h[i], h[j] = h[j], h[i]
	h[i].e.heapIdx = int32(i)
	h[j].e.heapIdx = int32(j)
}

func (sh *shard) up(i int) {
	h := sh.heap
	for i > 0 {
		p := (i - 1) / 2
		if h[p].at <= h[i].at {
			return
		}
		sh.swap(i, p)
		i = p
	}
}

// down sifts i towards the leaves and reports whether it moved.
func (sh *shard) down(i int) bool {
	h := sh.heap
	start := i
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		c := l
		if r := l + 1; r < len(h) && h[r].at < h[l].at {
			c = r
		}
		if h[i].at <= h[c].at {
			break
		}
		sh.swap(i, c)
		i = c
	}
	return i != start
}

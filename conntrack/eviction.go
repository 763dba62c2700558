package conntrack

// Eviction: the table's bound and early drop, after nf_conntrack_core.c. Each
// shard lists its non-ASSURED entries oldest first; the head is the victim.
// ASSURED entries are never dropped.
//
// 1. reserve: Confirm takes a slot if the table has room (entries and
//    slots reserved by other Confirm calls stay below Max).
// 2. When full, Confirm expires its shard's due entries and drops the head of
//    its shard's list; failing that, evictElsewhere does the same in the other
//    shards, one lock at a time.
// 3. The list: linkTail on insert, setAssured takes an entry off when it
//    becomes ASSURED, unlink also on removal (removeLocked, table.go).

// reserve takes a slot for a new entry if the table has room. The counter
// never passes Max, not even for a moment.
func (t *Table) reserve() bool {
	for {
		c := t.count.Load()
		if c >= t.max {
			return false
		}
		if t.count.CompareAndSwap(c, c+1) {
			return true
		}
	}
}

// evictElsewhere early-drops one non-ASSURED entry from a shard other than
// from, scanning the shards in order after it. It runs OnRemove itself.
func (t *Table) evictElsewhere(from *shard, now int64) {
	var pend pending
	defer t.fire(&pend)
	n := len(t.shards)
	start := 0
	for i := range t.shards {
		if &t.shards[i] == from {
			start = i
			break
		}
	}
	for k := 1; k < n; k++ {
		sh := &t.shards[(start+k)%n]
		sh.mu.Lock()
		if t.expireLocked(sh, now, &pend) > 0 && t.count.Load() < t.max {
			sh.mu.Unlock()
			return
		}
		if v := sh.head; v != nil {
			t.removeLocked(sh, v, RemoveEvicted, now, &pend)
			sh.mu.Unlock()
			return
		}
		sh.mu.Unlock()
	}
}

func (sh *shard) linkTail(e *entry) {
	e.prev, e.next = sh.tail, nil
	if sh.tail != nil {
		sh.tail.next = e
	} else {
		sh.head = e
	}
	sh.tail = e
}

func (t *Table) setAssured(sh *shard, e *entry) {
	e.status |= StatusAssured
	sh.unlink(e)
}

func (sh *shard) unlink(e *entry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else if sh.head == e {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else if sh.tail == e {
		sh.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

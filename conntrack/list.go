package conntrack

// Listing and deleting entries by Filter (admin, CLI, proxy): walks over every
// shard, one lock at a time.

// List returns snapshots of the live entries that match f, in no particular
// order. It locks one shard at a time, so it is not an atomic picture of the
// whole table.
func (t *Table) List(f Filter) []EntryInfo {
	now := t.clock.Now()
	out := make([]EntryInfo, 0, max(t.count.Load(), 0))
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for j := range sh.idx.slots {
			if e := sh.idx.slots[j].e; e != nil && now < e.expires && f.match(e) {
				out = append(out, snapshot(e, now))
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// Delete removes the entries that match f (expired ones included) and returns
// how many it removed, calling OnRemove with RemoveDeleted for each. Proxy
// uses it to forget UDP flows of a removed endpoint, so that their next
// datagram is New; `conntrack flush` is Delete(Filter{}).
func (t *Table) Delete(f Filter) int {
	now := t.clock.Now()
	n := 0
	for i := range t.shards {
		var pend pending
		sh := &t.shards[i]
		sh.mu.Lock()
		var doomed []*entry // removal reshuffles the index: collect first
		sh.idx.each(func(e *entry) {
			if f.match(e) {
				doomed = append(doomed, e)
			}
		})
		for _, e := range doomed {
			t.removeLocked(sh, e, RemoveDeleted, now, &pend)
		}
		n += len(doomed)
		sh.mu.Unlock()
		t.fire(&pend)
	}
	return n
}

// DeleteFlow removes the entry of the flow orig (an Original-direction
// tuple), if there is one, and reports whether there was, calling OnRemove
// with RemoveDeleted. Unlike Delete with an exact Filter it looks at one
// shard's index, not at every entry. With owner non-nil, it removes the
// entry only while its Binding's Owner is owner, so that an owner forgets
// its own flow and never a newer one on the same tuple.
func (t *Table) DeleteFlow(orig Tuple, owner any) bool {
	now := t.clock.Now()
	sh, h := t.locate(&orig)
	var pend pending
	sh.mu.Lock()
	e := sh.idx.get(&orig, h)
	if e != nil && owner != nil && (e.bind == nil || e.bind.Owner != owner) {
		e = nil
	}
	if e != nil {
		t.removeLocked(sh, e, RemoveDeleted, now, &pend)
	}
	sh.mu.Unlock()
	t.fire(&pend)
	return e != nil
}

package service

// Building: a new Table from the current one and the services events marked,
// and the timer that coalesces builds to one per MinSyncPeriod.
//
// 1. kick builds now, or arms the timer when the last build started less
//    than MinSyncPeriod ago; timerFired runs the build it was armed for.
// 2. buildLocked takes the marked services, sorted by name.
// 3. computePorts computes their Ports, on several cores for a large build.
// 4. applyService reuses each unchanged Port, records the changes
//    (changes.go) and moves lookup keys (ClusterIP, external and NodePort:
//    portKeys) and address marks (claim, unclaim, mark, unmark); the DNS
//    view follows (applyDNS, dns.go).
// 5. buildLocked rebuilds the skipped list if it changed (flattenSkipped)
//    and ExternalAddrs if an address came or went, publishes the table and
//    records the sync's metrics.

import (
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"time"
)

// kick builds a table now, or arms the timer that will, or does nothing, as
// the sync state and MinSyncPeriod say.
func (t *Tracker) kick() {
	t.buildMu.Lock()
	defer t.buildMu.Unlock()
	t.mu.Lock()
	if !t.synced || t.closed || (t.published && len(t.dirty) == 0) {
		t.mu.Unlock()
		return
	}
	now := t.clock.Now()
	if t.published {
		if wait := t.lastSync.Add(t.minSync).Sub(now); wait > 0 {
			if t.timer == nil {
				t.timerGen++
				gen := t.timerGen
				t.timer = t.clock.AfterFunc(wait, func() { t.timerFired(gen) })
			}
			t.mu.Unlock()
			return
		}
	}
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
		t.timerGen++
	}
	tbl, ch, ok := t.buildLocked(now)
	t.mu.Unlock()
	if ok && t.onSync != nil {
		t.onSync(tbl, ch)
	}
}

// timerFired runs the build a timer was armed for. A timer that a build
// made needless (stopped too late) finds a newer generation and leaves the
// current timer alone.
func (t *Tracker) timerFired(gen uint64) {
	t.mu.Lock()
	if gen == t.timerGen {
		t.timer = nil
	}
	t.mu.Unlock()
	t.kick()
}

// buildLocked recomputes the dirty services and derives the next table from
// the current one. ok is false when nothing changed (no table is
// published). Called with buildMu and mu held.
func (t *Tracker) buildLocked(start time.Time) (tbl *Table, ch Changes, ok bool) {
	t.lastSync = start
	names := t.dirty
	t.dirty = nil
	t.oldestPending = time.Time{}
	slices.SortFunc(names, func(a, b ServiceName) int {
		if a.less(b) {
			return -1
		}
		if b.less(a) {
			return 1
		}
		return 0
	})

	b := newTableBuilder(t.current.Load(), len(names))
	ch.Ports = make([]PortChange, 0, len(names))
	skippedChanged := false
	var triggers []trigger
	states := make([]*svcState, len(names))
	for i, name := range names {
		states[i] = t.services[name]
	}
	fresh := t.computePorts(states)
	for i, name := range names {
		st := states[i]
		st.dirty, st.serviceChanged, st.slicesChanged = false, false, false
		triggers = append(triggers, st.triggers...)
		st.triggers = nil
		if t.applyService(b, &ch, name, st, fresh[i]) {
			skippedChanged = true
		}
		t.applyDNS(b, name, st, buildDNS(st.info, st.slices))
		if st.info == nil && len(st.slices) == 0 {
			delete(t.services, name)
		}
	}
	if t.published && !b.touched && !skippedChanged {
		return nil, Changes{}, false
	}
	if skippedChanged {
		b.t.skipped = t.flattenSkipped()
	}
	b.finishSorted()
	b.finishExternalAddrs()
	slices.SortFunc(ch.Ports, func(x, y PortChange) int {
		return comparePorts(x.either(), y.either())
	})

	tbl = b.t
	tbl.generation++
	tbl.built = start
	end := t.clock.Now()
	t.current.Store(tbl)
	t.published = true

	for _, tr := range triggers {
		d := max(end.Sub(tr.at), 0)
		ch.NetworkProgrammingLatencies = append(ch.NetworkProgrammingLatencies, d)
		t.programmingHist.observe(d)
		for _, f := range [...]Family{IPv4, IPv6} {
			if tr.fams&familySetOf(f) != 0 {
				t.programmingFam.at(f).observe(d)
			}
		}
	}
	dur := end.Sub(start)
	t.syncHist.observe(dur)
	t.stats.Syncs++
	t.stats.LastSyncDuration = dur
	t.stats.LastSyncTime = end
	t.stats.NoLocalEndpointsByFamily = t.noLocal
	t.stats.NoLocalEndpoints = NoLocalEndpointsCount{
		Internal: t.noLocal.IPv4.Internal + t.noLocal.IPv6.Internal,
		External: t.noLocal.IPv4.External + t.noLocal.IPv6.External,
	}
	t.stats.Services = tbl.nServices
	t.stats.Ports = tbl.nPorts
	t.stats.Skipped = len(tbl.skipped)
	return tbl, ch, true
}

// parallelBuild is the number of changed services from which a build
// computes Ports on several cores.
const parallelBuild = 2048

// computePorts computes the Ports of each service (buildPorts is pure). A
// large build, such as the first one, fans out to GOMAXPROCS goroutines
// (four at most), which end before it returns; handlers cannot change the
// services meanwhile, as the caller holds mu.
func (t *Tracker) computePorts(states []*svcState) [][]*Port {
	fresh := make([][]*Port, len(states))
	workers := min(runtime.GOMAXPROCS(0), 4)
	if len(states) < parallelBuild || workers < 2 {
		for i, st := range states {
			fresh[i] = buildPorts(st.info, st.slices, t.node, &t.scratch)
		}
		return fresh
	}
	var wg sync.WaitGroup
	per := (len(states) + workers - 1) / workers
	for lo := 0; lo < len(states); lo += per {
		hi := min(lo+per, len(states))
		wg.Go(func() {
			var sc scratch
			for i := lo; i < hi; i++ {
				fresh[i] = buildPorts(states[i].info, states[i].slices, t.node, &sc)
			}
		})
	}
	wg.Wait()
	return fresh
}

// applyService recomputes one service's Ports, reusing each unchanged Port
// of the current table, records the differences in ch, and writes them to
// the table being built. It reports whether the service's skipped list
// changed.
func (t *Tracker) applyService(b *tableBuilder, ch *Changes, name ServiceName, st *svcState, fresh []*Port) bool {
	var ips []netip.Addr
	var skipped []Skipped
	if st.info != nil {
		ips = st.info.clusterIPs
		skipped = st.info.skipped
	}
	extIPs := externalAddrs(fresh)
	old := st.ports

	changed := false
	for i, np := range fresh {
		op := findPort(old, np)
		if op != nil && op.equal(np) {
			fresh[i] = op
			continue
		}
		ch.Ports = append(ch.Ports, newPortChange(op, np))
		changed = true
	}
	for _, op := range old {
		if findPort(fresh, op) == nil {
			ch.Ports = append(ch.Ports, newPortChange(op, nil))
			changed = true
		}
	}

	// Index: release what the old ports held, then claim for the new ones.
	for _, op := range old {
		if !slices.Contains(fresh, op) {
			t.unclaim(b, op)
			b.removed = append(b.removed, op)
		}
	}
	for _, np := range fresh {
		if !slices.Contains(old, np) {
			t.claim(b, np)
			b.added = append(b.added, np)
		}
	}
	t.moveMarks(b, st.ips, ips, false)
	t.moveMarks(b, st.extIPs, extIPs, true)
	if !slices.Equal(old, fresh) {
		b.setService(name, fresh)
	}
	addNoLocal(&t.noLocal, countNoLocal(fresh), 1)
	addNoLocal(&t.noLocal, countNoLocal(old), -1)

	switch {
	case len(old) == 0 && len(fresh) > 0:
		ch.Added = append(ch.Added, name)
	case len(old) > 0 && len(fresh) == 0:
		ch.Removed = append(ch.Removed, name)
	case changed:
		ch.Changed = append(ch.Changed, name)
	}
	st.ports, st.ips, st.extIPs = fresh, ips, extIPs

	if slices.Equal(st.skipped, skipped) {
		return false
	}
	st.skipped = skipped
	if len(skipped) == 0 {
		delete(t.skipped, name)
	} else {
		t.skipped[name] = skipped
	}
	return true
}

// countNoLocal counts the ports of ps that drop for want of a local
// endpoint, per traffic policy: kube-proxy's
// serviceNoLocalEndpointsTotalInternal and ...External (proxier.go
// syncProxyRules), one per service port and family, counted under the
// port's family (each of kube-proxy's proxiers counts its own). A port
// without external destination is not counted for the external policy
// (see NoLocalEndpointsCount).
func countNoLocal(ps []*Port) PerFamily[NoLocalEndpointsCount] {
	var n PerFamily[NoLocalEndpointsCount]
	for _, p := range ps {
		c := n.at(p.Family)
		if p.Verdict == NoLocalEndpoints {
			c.Internal++
		}
		if p.ExternalVerdict == NoLocalEndpoints {
			c.External++
		}
	}
	return n
}

func addNoLocal(n *PerFamily[NoLocalEndpointsCount], o PerFamily[NoLocalEndpointsCount], sign int) {
	for _, f := range [...]Family{IPv4, IPv6} {
		c, d := n.at(f), o.at(f)
		c.Internal += sign * d.Internal
		c.External += sign * d.External
	}
}

// claim makes p answer each of its lookup keys (portKeys), unless a Port
// with a lower name holds the key already: then p waits in conflicts for
// it. The API server never allocates one ClusterIP or NodePort twice, but
// externalIPs are the user's to choose, and files can say anything; the
// lower name wins so the outcome does not depend on event order.
func (t *Tracker) claim(b *tableBuilder, p *Port) {
	t.keys = portKeys(t.keys[:0], p)
	for _, k := range t.keys {
		t.claimKey(b, k, p)
	}
}

func (t *Tracker) claimKey(b *tableBuilder, k lookupKey, p *Port) {
	cur := b.get(k)
	switch {
	case cur == nil:
		b.setIndex(k, p)
	case comparePorts(p, cur) < 0:
		t.conflicts[k] = append(t.conflicts[k], cur)
		b.setIndex(k, p)
	default:
		t.conflicts[k] = append(t.conflicts[k], p)
	}
}

// unclaim releases p's lookup keys, promoting the best waiting Port of each.
func (t *Tracker) unclaim(b *tableBuilder, p *Port) {
	t.keys = portKeys(t.keys[:0], p)
	for _, k := range t.keys {
		t.unclaimKey(b, k, p)
	}
}

func (t *Tracker) unclaimKey(b *tableBuilder, k lookupKey, p *Port) {
	waiting := t.conflicts[k]
	if b.get(k) != p {
		if i := slices.Index(waiting, p); i >= 0 {
			waiting = slices.Delete(waiting, i, i+1)
		}
	} else {
		var best *Port
		bi := -1
		for i, q := range waiting {
			if best == nil || comparePorts(q, best) < 0 {
				best, bi = q, i
			}
		}
		if best != nil {
			waiting = slices.Delete(waiting, bi, bi+1)
		}
		b.setIndex(k, best)
	}
	if len(waiting) == 0 {
		delete(t.conflicts, k)
	} else {
		t.conflicts[k] = waiting
	}
}

// moveMarks unmarks the addresses of old that cur lacks, then marks those
// of cur that old lacks: ClusterIPs, or external addresses.
func (t *Tracker) moveMarks(b *tableBuilder, old, cur []netip.Addr, external bool) {
	for _, ip := range old {
		switch {
		case slices.Contains(cur, ip):
		case external:
			t.unmarkExternal(b, ip)
		default:
			t.unmark(b, ip)
		}
	}
	for _, ip := range cur {
		switch {
		case slices.Contains(old, ip):
		case external:
			t.markExternal(b, ip)
		default:
			t.mark(b, ip)
		}
	}
}

// mark records that one more service has ip as a ClusterIP; unmark, one
// less. The (ip, 0, 0) entry exists while at least one does.
func (t *Tracker) mark(b *tableBuilder, ip netip.Addr) { t.markKey(b, makeKey(ip, 0, 0)) }

func (t *Tracker) unmark(b *tableBuilder, ip netip.Addr) { t.unmarkKey(b, makeKey(ip, 0, 0)) }

// markExternal and unmarkExternal do the same for external addresses, and
// keep ExternalAddrs: an address is in it while a service marks it.
func (t *Tracker) markExternal(b *tableBuilder, ip netip.Addr) {
	if t.markKey(b, makeExternalKey(ip, 0, 0)) {
		b.extAdded = append(b.extAdded, ip)
	}
}

func (t *Tracker) unmarkExternal(b *tableBuilder, ip netip.Addr) {
	if t.unmarkKey(b, makeExternalKey(ip, 0, 0)) {
		b.extRemoved = append(b.extRemoved, ip)
	}
}

// markKey reports whether it created the marker; unmarkKey, whether it
// removed it.
func (t *Tracker) markKey(b *tableBuilder, k lookupKey) bool {
	if b.get(k) != nil {
		t.markExtra[k]++
		return false
	}
	b.setIndex(k, ipMarker)
	return true
}

func (t *Tracker) unmarkKey(b *tableBuilder, k lookupKey) bool {
	if n := t.markExtra[k]; n > 0 {
		if n == 1 {
			delete(t.markExtra, k)
		} else {
			t.markExtra[k] = n - 1
		}
		return false
	}
	b.setIndex(k, nil)
	return true
}

func (t *Tracker) flattenSkipped() []Skipped {
	var out []Skipped
	for _, s := range t.skipped {
		out = append(out, s...)
	}
	slices.SortStableFunc(out, func(a, b Skipped) int {
		if a.Service != b.Service {
			if a.Service.less(b.Service) {
				return -1
			}
			return 1
		}
		if a.Port != b.Port {
			return cmpString(a.Port, b.Port)
		}
		return int(a.PortNumber) - int(b.PortNumber)
	})
	return out
}

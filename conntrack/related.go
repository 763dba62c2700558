package conntrack

// ICMP errors RELATED to a tracked flow, after Linux
// net/netfilter/nf_conntrack_proto_icmp.c (nf_conntrack_inet_error). Parsing
// the quoted packet is parse.go's; this file finds its flow.
//
// 1. The error must be addressed to the quoted packet's source.
// 2. The quoted packet travelled the other way: turn it into the flow's
//    Original tuple.
// 3. Look the flow up, dropping it if expired; no live flow is INVALID
//    (icmp_unrelated), a live one makes the error Related.

// classifyRelated handles an ICMP error, as nf_conntrack_inet_error does: the
// quoted packet travelled the other way, so an error arriving in the Original
// direction quotes a Reply-direction packet of the flow and one in the Reply
// direction quotes an Original-direction packet. The error must be addressed
// to the quoted packet's source.
func (t *Table) classifyRelated(r Result, outerDst *[16]byte) Result {
	inner := r.Tuple
	r.Tuple = Tuple{}
	if inner.src != *outerDst {
		return t.invalidResult(r, ReasonICMPUnrelated)
	}
	key := inner
	if r.Dir == Original {
		key = inner.Reverse()
	}
	now := t.clock.Now()
	sh, h := t.locate(&key)
	var pend pending

	sh.mu.Lock()
	e := sh.idx.get(&key, h)
	if e != nil && now >= e.expires {
		t.removeLocked(sh, e, RemoveExpired, now, &pend)
		e = nil
	}
	sh.mu.Unlock()
	t.fire(&pend)

	if e == nil {
		return t.invalidResult(r, ReasonICMPUnrelated)
	}
	t.related.Add(1)
	r.Tuple = key
	r.Verdict = Related
	return r
}

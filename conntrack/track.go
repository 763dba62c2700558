package conntrack

import "errors"

// Flows the table sees no packets of: a connection a NodePort front end
// accepted on a host socket, or a datagram flow it relays from one, is
// proxied like any other flow and must be listed, counted and ended like
// one (`conntrack list`, the schedulers' counts, flush), but its packets go
// through the host's kernel, not through Classify.
//
//  1. The front end calls Track with the flow's tuple once it has the
//     flow: a TCP entry is inserted ESTABLISHED and ASSURED with the
//     established timeout (the kernel completed the handshake); a UDP entry
//     as its first datagram would make it, unreplied with the short timeout
//     and open to early drop. Bind then records the binding as for any
//     flow.
//  2. Touch restarts the timeout while the flow is active, in either
//     direction (the front end calls it now and then, not per packet, with
//     its flow as the owner, so that it touches its own entry only): a
//     UDP flow becomes replied with its first reply, and a stream, ASSURED,
//     as udpPacket makes it. An entry that times out is removed with
//     OnRemove as usual, and its owner ends the flow.
//  3. When the flow ends on its own, the owner deletes the entry
//     (DeleteFlow): no FIN passes the table to move it to TIME_WAIT.
//  4. So a closed connection's entry can outlive it briefly, until its
//     owner reaches DeleteFlow, and the kernel may meanwhile accept a new
//     connection on the same 4-tuple: once both FINs have passed, the old
//     socket is in TIME_WAIT, which a new SYN may reopen
//     (tcp_timewait_state_process, TCP_TW_SYN). A front end therefore
//     tracks a TCP flow with Reopen, which ends the old entry as the
//     kernel's conntrack ends a TIME_WAIT entry that a SYN reopens.

// ErrTracked is returned by Track for a tuple the table holds already.
var ErrTracked = errors.New("conntrack: the flow is tracked already")

// Track inserts a live entry for the flow orig (step 1). It returns
// ErrTracked when a live entry exists, ErrNotNew for an invalid tuple, and
// ErrTableFull when the table is full and its shard holds nothing expired or
// unassured to drop (Confirm looks in the other shards too; a host-socket
// front end has the kernel's own backlog in front of it).
func (t *Table) Track(orig Tuple) error { return t.track(orig, false) }

// Reopen is Track for a TCP connection the host's kernel has just accepted
// (step 4): a live entry of the same tuple that its owner has bound belongs
// to a connection the kernel has closed, since it accepts a SYN on a
// 4-tuple only once the old socket is in TIME_WAIT or gone. That entry is
// removed with RemoveReopened and the new one inserted. An entry not yet
// bound is its front end's, which has not set up its flow yet and still
// deletes the entry by tuple alone if that fails: Reopen returns ErrTracked
// for it, as Track does. For other protocols it is Track.
func (t *Table) Reopen(orig Tuple) error { return t.track(orig, orig.proto == TCP) }

func (t *Table) track(orig Tuple, reopen bool) error {
	if !orig.IsValid() {
		return ErrNotNew
	}
	now := t.clock.Now()
	sh, h := t.locate(&orig)
	var pend pending
	defer t.fire(&pend) // after the unlock below
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if e := sh.idx.get(&orig, h); e != nil {
		switch {
		case now >= e.expires:
			t.removeLocked(sh, e, RemoveExpired, now, &pend)
		case reopen && e.bind != nil:
			t.removeLocked(sh, e, RemoveReopened, now, &pend)
		default:
			return ErrTracked
		}
	}
	if !t.reserve() {
		t.expireLocked(sh, now, &pend)
		if v := sh.head; !t.reserve() && v != nil {
			t.removeLocked(sh, v, RemoveEvicted, now, &pend)
		}
		if !t.reserve() {
			t.tableFull.Add(1)
			return ErrTableFull
		}
	}
	e := &entry{key: orig, id: t.nextID.Add(1), created: now, lastSeen: now, heapIdx: -1}
	if orig.proto == TCP {
		e.tcp.state = TCPEstablished
		e.status = StatusSeenReply | StatusAssured
		e.expires = now + t.tcpTO[TCPEstablished]
	} else {
		e.expires = now + t.udpTO
	}
	sh.idx.insert(e, h)
	sh.push(e)
	if e.status&StatusAssured == 0 {
		sh.linkTail(e)
	}
	sh.n[protoSlot(orig.proto)]++
	sh.inserted++
	return nil
}

// Touch restarts the timeout of the tracked flow orig after traffic in
// direction dir (step 2) and reports whether its entry is live. With owner
// non-nil, only an entry bound to owner is touched, so that a flow whose
// entry was reopened does not keep the newer flow's alive.
func (t *Table) Touch(orig Tuple, dir Direction, owner any) bool {
	now := t.clock.Now()
	sh, h := t.locate(&orig)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.idx.get(&orig, h)
	if e == nil || now >= e.expires || owner != nil && (e.bind == nil || e.bind.Owner != owner) {
		return false
	}
	e.lastSeen = now
	timeout := t.tcpTO[TCPEstablished]
	if orig.proto != TCP {
		if dir == Reply {
			e.status |= StatusSeenReply
		}
		timeout = t.udpTO
		if e.status&StatusSeenReply != 0 && now > e.created+udpStreamAge {
			timeout = t.streamTO
			if e.status&StatusAssured == 0 {
				t.setAssured(sh, e)
			}
		}
	}
	sh.setExpiry(e, now+timeout)
	return true
}

package conntrack

// Entries on their way to the next process (a handover): Save copies what
// a new table needs to go on classifying a flow's packets exactly as this
// one would — the TCP window tracking (struct ip_ct_tcp) and the status
// bits — with its timers as what is left of them, since two processes'
// clocks share no origin; Restore inserts it in another table.

import (
	"encoding/binary"
	"fmt"
	"time"
)

// SavedTCPLen is the length of Saved.TCP.
const SavedTCPLen = 2*(4*4+2) + 3*4 + 2 + 6

// Saved is one entry, saved.
type Saved struct {
	Original Tuple
	Status   Status
	Packets  [2]uint64
	Bytes    [2]uint64
	// Age is how long ago the entry was created, Idle since its last
	// packet, Timeout what is left before it expires.
	Age, Idle, Timeout time.Duration
	// TCP is the window tracking's state, opaque to the caller: Restore
	// checks it.
	TCP [SavedTCPLen]byte
}

// Save returns the live entry of orig, saved.
func (t *Table) Save(orig Tuple) (s Saved, ok bool) {
	ok = t.withLive(orig, func(e *entry, now int64) {
		s = Saved{
			Original: e.key, Status: e.status, Packets: e.packets, Bytes: e.bytes,
			Age: time.Duration(now - e.created), Idle: time.Duration(now - e.lastSeen), Timeout: time.Duration(e.expires - now),
		}
		if e.key.proto == TCP {
			e.tcp.put(&s.TCP)
		}
	})
	return s, ok
}

// put writes c into b, field by field.
func (c *tcpConn) put(b *[SavedTCPLen]byte) {
	p := b[:0]
	for _, s := range c.seen {
		p = binary.BigEndian.AppendUint32(p, s.end)
		p = binary.BigEndian.AppendUint32(p, s.maxEnd)
		p = binary.BigEndian.AppendUint32(p, s.maxWin)
		p = binary.BigEndian.AppendUint32(p, s.maxAck)
		p = append(p, s.scale, s.flags)
	}
	p = binary.BigEndian.AppendUint32(p, c.lastSeq)
	p = binary.BigEndian.AppendUint32(p, c.lastAck)
	p = binary.BigEndian.AppendUint32(p, c.lastEnd)
	p = binary.BigEndian.AppendUint16(p, c.lastWin)
	_ = append(p, uint8(c.state), uint8(c.lastDir), c.lastIndex, c.retrans, c.lastWscale, c.lastFlags)
}

// get reads c from b and checks its fields' ranges.
func (c *tcpConn) get(b *[SavedTCPLen]byte) error {
	p := b[:]
	for i := range c.seen {
		s := &c.seen[i]
		s.end, s.maxEnd = binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:])
		s.maxWin, s.maxAck = binary.BigEndian.Uint32(p[8:]), binary.BigEndian.Uint32(p[12:])
		s.scale, s.flags = p[16], p[17]
		p = p[18:]
		if s.scale > 14 {
			return fmt.Errorf("a window scale of %d", s.scale)
		}
	}
	c.lastSeq, c.lastAck, c.lastEnd = binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), binary.BigEndian.Uint32(p[8:])
	c.lastWin = binary.BigEndian.Uint16(p[12:])
	p = p[14:]
	c.state, c.lastDir, c.lastIndex, c.retrans, c.lastWscale, c.lastFlags = TCPState(p[0]), Direction(p[1]), p[2], p[3], p[4], p[5]
	switch {
	case c.state == TCPNone || c.state >= numTCPStates:
		return fmt.Errorf("TCP state %d", c.state)
	case c.lastDir > Reply:
		return fmt.Errorf("direction %d", c.lastDir)
	case c.lastIndex >= numIdx:
		return fmt.Errorf("segment class %d", c.lastIndex)
	case c.lastWscale > 14:
		return fmt.Errorf("a window scale of %d", c.lastWscale)
	}
	return nil
}

// Restore inserts the entry s describes, as live as it was when saved: the
// same state and status, its timeout going on from what was left. It fails
// with ErrTracked when orig has a live entry, ErrTableFull when there is
// no room (nothing is evicted for it), or an error naming the field that is
// out of range (a save from a broken or hostile source).
func (t *Table) Restore(s Saved) error {
	if !s.Original.IsValid() {
		return fmt.Errorf("conntrack: restoring an entry without a tuple")
	}
	if s.Age < 0 || s.Idle < 0 || s.Idle > s.Age || s.Timeout <= 0 {
		return fmt.Errorf("conntrack: restoring %v: age %v, idle %v, timeout %v", s.Original, s.Age, s.Idle, s.Timeout)
	}
	e := &entry{key: s.Original, status: s.Status & (StatusSeenReply | StatusAssured), packets: s.Packets, bytes: s.Bytes, heapIdx: -1}
	if s.Original.proto == TCP {
		if err := e.tcp.get(&s.TCP); err != nil {
			return fmt.Errorf("conntrack: restoring %v: %v", s.Original, err)
		}
	}
	now := t.clock.Now()
	// A new process may give entries shorter timeouts than the old one did.
	e.created, e.lastSeen, e.expires = now-int64(s.Age), now-int64(s.Idle), now+min(int64(s.Timeout), t.maxTimeout())
	sh, h := t.locate(&e.key)
	var pend pending
	defer t.fire(&pend)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old := sh.idx.get(&e.key, h); old != nil {
		if now < old.expires {
			return ErrTracked
		}
		t.removeLocked(sh, old, RemoveExpired, now, &pend)
	}
	if !t.reserve() {
		t.tableFull.Add(1)
		return ErrTableFull
	}
	e.id = t.nextID.Add(1)
	sh.idx.insert(e, h)
	sh.push(e)
	if e.status&StatusAssured == 0 {
		sh.linkTail(e)
	}
	sh.n[protoSlot(e.key.proto)]++
	sh.inserted++
	return nil
}

// maxTimeout is the longest timeout the table gives an entry.
func (t *Table) maxTimeout() int64 {
	m := max(t.udpTO, t.streamTO)
	for _, d := range t.tcpTO {
		m = max(m, d)
	}
	return m
}

package conntrack

// The table: shards of (mutex, hash index, expiry heap, list of non-ASSURED
// entries), and the calls the gate, proxy and admin make. The pieces live
// apart: the state machines in tcp.go and udp.go, ICMP errors in related.go,
// the expiry heap and Sweep in expiry.go, the table bound and early drop in
// eviction.go, List and Delete in list.go.
//
// 1. Classify: parse, look the flow up, run its state machine (gate, every
//    packet).
// 2. Confirm: insert the entry of a New flow the admission function accepted,
//    making room by early drop when full (gate).
// 3. Bind: record the endpoint proxy chose (proxy).
// 4. Sweep: remove expired entries (owner, periodically; expiry.go).
// 5. Get, Len, Stats (proxy, admin, CLI); List and Delete are in list.go.

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
)

// Errors returned by Confirm.
var (
	// ErrTableFull: the table holds Max entries and none could be
	// early-dropped (all ASSURED). The flow is refused; drop the packet.
	// This is not an INVALID verdict and is counted in Stats.TableFull.
	ErrTableFull = errors.New("conntrack: table full")
	// ErrNotNew: Confirm was given a Result whose Verdict is not New.
	ErrNotNew = errors.New("conntrack: result is not a new flow")
)

// Result is the classification of one packet. It holds no reference to the
// packet's bytes, so the buffer may be reused as soon as Classify returns.
type Result struct {
	// Tuple is the flow's Original-direction tuple (client -> service),
	// whichever direction the packet travelled; for Related, the flow the
	// ICMP error refers to. It is the zero Tuple when parsing failed.
	Tuple Tuple
	// Verdict says what to do with the packet.
	Verdict Verdict
	// Reason says why, when Verdict is Invalid.
	Reason Reason
	// Dir is the direction Classify was given.
	Dir Direction
	// seg keeps what Confirm needs to replay the packet on the new entry.
	seg segment
}

// LoneSegment reports whether the packet is an accepted TCP segment with
// data or a FIN that starts where everything its sender sent before it
// ended, all of which the other side had acknowledged as far as the table
// saw: it is then the only thing the receiver has to acknowledge. (The
// kernel's table keeps the same facts, td_end and
// IP_CT_TCP_FLAG_DATA_UNACKNOWLEDGED, but reports nothing of them.)
func (r *Result) LoneSegment() bool { return r.seg.lone }

// Table is a connection tracking table. All methods are safe for concurrent
// use. Build it with NewTable.
type Table struct {
	clock    Clock
	onRemove func(EntryInfo, RemoveReason)
	max      int64
	liberal  bool
	verify   bool
	shift    uint   // shard index = tuple hash >> shift
	seed     uint64 // Config.HashSeed
	tcpTO    [numTCPTimeouts]int64
	udpTO    int64
	streamTO int64

	count  atomic.Int64 // entries plus slots reserved by Confirm calls in progress; <= max
	nextID atomic.Uint64

	invalid     [NumReasons]atomic.Uint64
	unsupported [256]atomic.Uint64 // by IP protocol number
	related     atomic.Uint64
	tableFull   atomic.Uint64

	shards []shard
}

// shard is one lock's worth of the table.
type shard struct {
	mu   sync.Mutex
	idx  index      // Original tuple -> entry
	heap []heapItem // expiry min-heap
	head *entry     // oldest non-ASSURED entry, the early-drop victim
	tail *entry
	n    [2]int // entries: TCP, UDP

	inserted, joined, expired, evicted, deleted, killed uint64

	_ [64]byte // keep neighbouring shards' locks off one cache line
}

// NewTable builds a table. Zero fields of cfg take their documented defaults; it
// fails only on values that are set but unusable.
func NewTable(cfg Config) (*Table, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Table{
		clock:    cfg.Clock,
		onRemove: cfg.OnRemove,
		max:      int64(cfg.Max),
		liberal:  cfg.Liberal,
		verify:   !cfg.SkipChecksums,
		shards:   make([]shard, cfg.Shards),
		udpTO:    int64(cfg.Timeouts.UDP),
		streamTO: int64(cfg.Timeouts.UDPStream),
		seed:     cfg.HashSeed,
	}
	t.shift = 64
	for n := cfg.Shards; n > 1; n >>= 1 {
		t.shift--
	}
	to := &cfg.Timeouts
	t.tcpTO = [numTCPTimeouts]int64{
		TCPNone:        int64(to.TCPSynSent), // never used: no entry stays in NONE
		TCPSynSent:     int64(to.TCPSynSent),
		TCPSynRecv:     int64(to.TCPSynRecv),
		TCPEstablished: int64(to.TCPEstablished),
		TCPFinWait:     int64(to.TCPFinWait),
		TCPCloseWait:   int64(to.TCPCloseWait),
		TCPLastAck:     int64(to.TCPLastAck),
		TCPTimeWait:    int64(to.TCPTimeWait),
		TCPClose:       int64(to.TCPClose),
		TCPSynSent2:    int64(to.TCPSynSent2),
		toRetrans:      int64(to.TCPMaxRetrans),
		toUnack:        int64(to.TCPUnacknowledged),
	}
	return t, nil
}

// HashSeed returns the seed of the tuple hash (Config.HashSeed), so that
// an owner can check it drew one.
func (t *Table) HashSeed() uint64 { return t.seed }

// locate returns the shard of k and k's hash, which the shard's index reuses.
func (t *Table) locate(k *Tuple) (*shard, uint64) {
	h := k.hash(t.seed)
	return &t.shards[h>>t.shift], h
}

// Classify parses pkt, an IPv4 or IPv6 packet starting at the IP header, and
// classifies it for direction dir. It never inserts an entry: a packet that
// would start a flow comes back as New, and Confirm inserts it. For a packet
// of a tracked flow it runs the protocol state machine, updates counters and
// refreshes the timeout, exactly once per call. It may remove an entry it
// finds expired, or one the TCP state machine kills; OnRemove then runs before
// Classify returns.
//
// Original-direction checksums are verified unless Config.SkipChecksums.
// Any dir other than Original counts as Reply. Classify does not keep pkt. It
// allocates nothing unless an entry is removed and OnRemove is set.
func (t *Table) Classify(pkt []byte, dir Direction) (r Result) {
	return t.classify(pkt, 0, dir, t.verify && dir == Original)
}

// ClassifyTrusted is Classify for a packet whose checksums are not to be
// verified whatever Config.SkipChecksums says: one the local kernel wrote
// with its checksum left partial for the device to complete, or one a device
// has verified (CHECKSUM_PARTIAL and CHECKSUM_UNNECESSARY, which the kernel's
// conntrack does not verify either: nf_ip_checksum, net/netfilter/utils.c).
// Every other check is the same.
func (t *Table) ClassifyTrusted(pkt []byte, dir Direction) Result {
	return t.classify(pkt, 0, dir, false)
}

// ClassifyHead is ClassifyTrusted for a packet of size bytes given by its
// first bytes, head, for a caller that need not copy a payload nothing
// reads: only the lengths of what lies past the headers count. head must hold
// the IP header, any IPv6 extension headers and the transport header with its
// options (for an ICMP error, the quoted headers too); a packet whose headers
// run past it is INVALID, as truncated (an ICMP error whose quote is cut, as
// icmp_bad_inner).
func (t *Table) ClassifyHead(head []byte, size int, dir Direction) Result {
	if size < len(head) {
		head = head[:size]
	}
	return t.classify(head, size-len(head), dir, false)
}

// classify classifies the packet of which pkt holds all but the last
// missing bytes (ClassifyHead), verifying its checksums if verify is set
// (only when none is missing).
func (t *Table) classify(pkt []byte, missing int, dir Direction, verify bool) (r Result) {
	if dir != Original {
		dir = Reply
	}
	r.Dir = dir
	var outerDst [16]byte
	out := parseOut{t: &r.Tuple, s: &r.seg, outerDst: &outerDst, missing: missing}
	if reason := parseInto(pkt, verify && missing == 0, &out); reason != ReasonNone {
		proto := r.Tuple.proto
		r.Tuple = Tuple{}
		if reason.Unsupported() {
			t.unsupported[proto].Add(1)
			r.Verdict, r.Reason = Invalid, reason
			return r
		}
		return t.invalidResult(r, reason)
	}
	if out.kind == kindICMPError {
		return t.classifyRelated(r, &outerDst)
	}
	if dir == Reply {
		r.Tuple.reverse()
	}
	now := t.clock.Now()
	sh, h := t.locate(&r.Tuple)
	var pend pending

	sh.mu.Lock()
	e := sh.idx.get(&r.Tuple, h)
	if e != nil && now >= e.expires {
		t.removeLocked(sh, e, RemoveExpired, now, &pend)
		e = nil
	}
	if e == nil {
		sh.mu.Unlock()
		t.fire(&pend)
		return t.noEntry(r)
	}
	o, reason := t.process(sh, e, dir, &r.seg, now)
	switch o {
	case outKill:
		t.removeLocked(sh, e, RemoveKilled, now, &pend)
	case outRepeat:
		t.removeLocked(sh, e, reopened(e), now, &pend)
	}
	sh.mu.Unlock()
	t.fire(&pend)

	switch o {
	case outInvalid:
		return t.invalidResult(r, reason)
	case outRepeat:
		return t.noEntry(r)
	}
	r.Verdict = Established
	return r
}

// noEntry classifies a packet that found no entry: only an Original-direction
// UDP datagram or plain TCP SYN may start a flow (tcp_new with loose=0: in
// the kernel's table only a SYN leads from NONE to a state).
func (t *Table) noEntry(r Result) Result {
	switch {
	case r.Dir != Original:
		return t.invalidResult(r, ReasonNoEntryReply)
	case r.Tuple.proto == TCP && tcpIndex(r.seg.flags) != idxSYN:
		return t.invalidResult(r, ReasonNoEntryNotSYN)
	}
	r.Verdict = New
	return r
}

func (t *Table) invalidResult(r Result, reason Reason) Result {
	t.invalid[reason].Add(1)
	r.Verdict = Invalid
	r.Reason = reason
	return r
}

// process runs the packet through e's state machine under sh's lock. It sets
// SEEN_REPLY after an accepted Reply-direction packet, as nf_conntrack_in does
// once the protocol accepted it.
func (t *Table) process(sh *shard, e *entry, dir Direction, s *segment, now int64) (outcome, Reason) {
	var out outcome
	var reason Reason
	if e.key.proto == TCP {
		was := e.tcp.state
		out, reason = t.tcpPacket(sh, e, dir, s, now)
		if b := e.bind; b != nil && b.Counter != nil && (was == TCPEstablished) != (e.tcp.state == TCPEstablished) {
			b.Counter.Established(e.tcp.state == TCPEstablished)
		}
	} else {
		t.udpPacket(sh, e, dir, s, now)
		out = outAccept
	}
	if dir == Reply && (out == outAccept || out == outPass || out == outKill) {
		e.status |= StatusSeenReply
	}
	return out, reason
}

// refresh accounts the packet and restarts the timeout (nf_ct_refresh_acct).
func (t *Table) refresh(sh *shard, e *entry, dir Direction, s *segment, now, timeout int64) {
	e.packets[dir]++
	e.bytes[dir] += uint64(s.ipLen)
	e.lastSeen = now
	sh.setExpiry(e, now+timeout)
}

// Confirm inserts the entry for r, a New result of Classify that the
// admission function accepted, and replays the packet on it. Call it at most
// once per Result, before forwarding the packet.
//
// When another Confirm (or a retransmission) inserted the same tuple first,
// the packet joins that entry instead: it is run through its state machine
// and r.Verdict becomes Established, or Invalid with r.Reason. Forward the
// packet when Confirm returns nil and r.Verdict is not Invalid.
//
// When the table is full, Confirm first removes expired entries of the
// tuple's shard, then early-drops the oldest non-ASSURED entry, of this shard
// or else of any other (nf_conntrack_core's early_drop, which never drops
// ASSURED flows); if there is none it returns ErrTableFull and inserts
// nothing. OnRemove runs for removed entries before Confirm returns.
func (t *Table) Confirm(r *Result) error {
	if r.Verdict != New || r.Dir != Original || !r.Tuple.IsValid() {
		return ErrNotNew
	}
	key := r.Tuple
	now := t.clock.Now()
	sh, h := t.locate(&key)
	var pend pending
	defer t.fire(&pend) // runs after the unlock below on every path

	sh.mu.Lock()
	for attempt := 0; ; attempt++ {
		if e := sh.idx.get(&key, h); e != nil {
			if now < e.expires {
				out, reason := t.process(sh, e, Original, &r.seg, now)
				if out == outRepeat {
					// A SYN reopening a closed connection: the old entry
					// goes, and a new one is inserted below.
					t.removeLocked(sh, e, reopened(e), now, &pend)
				} else {
					sh.joined++
					if out == outKill {
						t.removeLocked(sh, e, RemoveKilled, now, &pend)
					}
					sh.mu.Unlock()
					if out == outInvalid {
						t.invalid[reason].Add(1)
						r.Verdict, r.Reason = Invalid, reason
					} else {
						r.Verdict = Established
					}
					return nil
				}
			} else {
				t.removeLocked(sh, e, RemoveExpired, now, &pend)
			}
		}
		if t.reserve() {
			break
		}
		if attempt > 0 {
			sh.mu.Unlock()
			t.tableFull.Add(1)
			return ErrTableFull
		}
		t.expireLocked(sh, now, &pend)
		if t.reserve() {
			break
		}
		if v := sh.head; v != nil {
			t.removeLocked(sh, v, RemoveEvicted, now, &pend)
			if t.reserve() {
				break
			}
		}
		// Nothing to drop here: look in the other shards, one lock at a
		// time, then try once more.
		sh.mu.Unlock()
		t.fire(&pend)
		t.evictElsewhere(sh, now)
		sh.mu.Lock()
	}

	// A slot is reserved; build the entry from the packet.
	e := &entry{key: key, id: t.nextID.Add(1), created: now, lastSeen: now, heapIdx: -1}
	out, reason := outAccept, ReasonNone
	if key.proto == TCP {
		tcpNew(&e.tcp, &r.seg)
		out, reason = t.tcpPacket(sh, e, Original, &r.seg, now)
	} else {
		t.udpPacket(sh, e, Original, &r.seg, now)
	}
	if out != outAccept {
		// Unreachable for a SYN that Classify let through; kept so that a
		// mistake shows as an invalid packet rather than a broken table.
		sh.mu.Unlock()
		t.count.Add(-1)
		if reason == ReasonNone {
			reason = ReasonStateMachine
		}
		t.invalid[reason].Add(1)
		r.Verdict, r.Reason = Invalid, reason
		return nil
	}
	sh.idx.insert(e, h)
	sh.push(e)
	sh.linkTail(e)
	sh.n[protoSlot(key.proto)]++
	sh.inserted++
	sh.mu.Unlock()
	return nil
}

// reopened is why the entry e of a connection that a SYN reopens leaves:
// RemoveReopened from TIME_WAIT, where both sides closed in order;
// RemoveKilled from CLOSE, where a RST ended it.
func reopened(e *entry) RemoveReason {
	if e.tcp.state == TCPTimeWait {
		return RemoveReopened
	}
	return RemoveKilled
}

func protoSlot(p Protocol) int {
	if p == TCP {
		return 0
	}
	return 1
}

// removeLocked takes e out of the table under sh's lock and, if OnRemove is
// set, queues its final snapshot in pend.
func (t *Table) removeLocked(sh *shard, e *entry, why RemoveReason, now int64, pend *pending) {
	sh.idx.remove(&e.key, e.key.hash(t.seed))
	sh.heapRemove(e)
	if e.status&StatusAssured == 0 {
		sh.unlink(e)
	}
	sh.n[protoSlot(e.key.proto)]--
	switch why {
	case RemoveExpired:
		sh.expired++
	case RemoveEvicted:
		sh.evicted++
	case RemoveDeleted:
		sh.deleted++
	case RemoveKilled, RemoveReopened: // both are the kernel's nf_ct_kill
		sh.killed++
	}
	t.count.Add(-1)
	if b := e.bind; b != nil && b.Counter != nil {
		b.Counter.Removed(e.established())
	}
	if t.onRemove != nil {
		pend.add(snapshot(e, now), why)
	}
}

// Bind records b on the live entry of the flow orig (an Original-direction
// tuple): the endpoint it was sent to and the name of its service port, for
// listing and filtering, and the owner's handle, handed back when the entry
// leaves the table. The Reply tuple is then listed from the endpoint to the
// client, as after the kernel's DNAT. A later Bind replaces an earlier one
// (whose Counter is then told Removed). It reports false when no live entry
// exists; b's Counter is then the caller's to uncount. The table keeps b;
// the caller must not change it afterwards.
func (t *Table) Bind(orig Tuple, b *Binding) bool {
	if ep := b.Endpoint; orig.family == 4 && ep.Addr().Is4In6() {
		b.Endpoint = netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())
	}
	now := t.clock.Now()
	sh, h := t.locate(&orig)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.idx.get(&orig, h)
	if e == nil || now >= e.expires {
		return false
	}
	if old := e.bind; old != nil && old.Counter != nil && old != b {
		old.Counter.Removed(e.established())
	}
	if b.Counter != nil && e.established() && e.bind != b {
		b.Counter.Established(true)
	}
	e.bind = b
	return true
}

// Get returns a snapshot of the live entry of the flow orig.
func (t *Table) Get(orig Tuple) (info EntryInfo, ok bool) {
	ok = t.withLive(orig, func(e *entry, now int64) { info = snapshot(e, now) })
	return info, ok
}

// withLive calls read with the live entry of orig, under its shard's lock,
// and reports whether there was one.
func (t *Table) withLive(orig Tuple, read func(e *entry, now int64)) bool {
	now := t.clock.Now()
	sh, h := t.locate(&orig)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.idx.get(&orig, h)
	if e == nil || now >= e.expires {
		return false
	}
	read(e, now)
	return true
}

// Len returns the number of entries, including expired ones not yet swept.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += sh.idx.n
		sh.mu.Unlock()
	}
	return n
}

// Stats is a snapshot of the table's gauges and counters. Counters only grow.
type Stats struct {
	// Entries currently held (including expired ones not yet swept), in all
	// and per protocol; Max is the configured bound.
	Entries    int
	EntriesTCP int
	EntriesUDP int
	Max        int
	// Invalid counts INVALID packets per Reason (Invalid[ReasonNone] and
	// the Unsupported reasons stay zero); InvalidTotal is their sum,
	// ct_state_invalid_dropped_packets.
	Invalid      [NumReasons]uint64
	InvalidTotal uint64
	// Unsupported counts the packets classified Invalid for an Unsupported
	// reason, in both directions, by IP protocol number (ICMP and ICMPv6
	// for their messages that are not errors); UnsupportedTotal is their
	// sum. They are not in InvalidTotal.
	Unsupported      [256]uint64
	UnsupportedTotal uint64
	// Related counts ICMP errors classified Related.
	Related uint64
	// Inserted counts entries created by Confirm; Joined counts Confirm calls
	// that found the entry already there.
	Inserted uint64
	Joined   uint64
	// TableFull counts flows refused with ErrTableFull.
	TableFull uint64
	// Removals by reason: Evicted (early drop), Expired, Deleted, Killed
	// (RemoveKilled and RemoveReopened, as the kernel kills both).
	Evicted uint64
	Expired uint64
	Deleted uint64
	Killed  uint64
}

// Stats returns a snapshot of the counters. It locks one shard at a time, so
// while other goroutines insert and remove entries the per-shard figures are
// taken at slightly different moments: the sum in Entries can then briefly
// read above Max, though the table itself never holds more than Max.
func (t *Table) Stats() Stats {
	s := Stats{Max: int(t.max)}
	for r := range t.invalid {
		s.Invalid[r] = t.invalid[r].Load()
		s.InvalidTotal += s.Invalid[r]
	}
	for p := range t.unsupported {
		s.Unsupported[p] = t.unsupported[p].Load()
		s.UnsupportedTotal += s.Unsupported[p]
	}
	s.Related = t.related.Load()
	s.TableFull = t.tableFull.Load()
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		s.EntriesTCP += sh.n[0]
		s.EntriesUDP += sh.n[1]
		s.Inserted += sh.inserted
		s.Joined += sh.joined
		s.Evicted += sh.evicted
		s.Expired += sh.expired
		s.Deleted += sh.deleted
		s.Killed += sh.killed
		sh.mu.Unlock()
	}
	s.Entries = s.EntriesTCP + s.EntriesUDP
	return s
}

// pending collects OnRemove calls to make once the locks are released. Its
// zero value is a few words, cheap to set up on every packet; it allocates
// only when something is removed and OnRemove is set.
type pending struct {
	list []removal
}

type removal struct {
	info EntryInfo
	why  RemoveReason
}

func (p *pending) add(i EntryInfo, why RemoveReason) {
	p.list = append(p.list, removal{i, why})
}

// fire makes the queued OnRemove calls and empties p. Call it with no lock
// held.
func (t *Table) fire(p *pending) {
	for _, r := range p.list {
		t.onRemove(r.info, r.why)
	}
	p.list = p.list[:0]
}

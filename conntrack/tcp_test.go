package conntrack

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// flow drives one TCP connection through a table, keeping both sides'
// sequence numbers the way real endpoints would.
type flow struct {
	t      testing.TB
	tab    *Table
	clk    *ManualClock
	c, s   netip.AddrPort // client and service
	next   [2]uint32      // next sequence number per direction
	win    [2]uint16
	synOpt [2][]byte // options on this side's SYN or SYN/ACK
}

func newFlow(t testing.TB, tab *Table, clk *ManualClock, c, s netip.AddrPort) *flow {
	return &flow{
		t: t, tab: tab, clk: clk, c: c, s: s,
		next: [2]uint32{0x10000000, 0x70000000},
		win:  [2]uint16{29200, 28960},
	}
}

func (f *flow) tuple() Tuple { return MakeTuple(TCP, f.c, f.s) }

// seg is the segment side dir would send now; it does not advance.
func (f *flow) seg(dir Direction, flags uint8, payload int) tcpSeg {
	s := tcpSeg{src: f.c, dst: f.s, flags: flags, seq: f.next[dir], win: f.win[dir], payload: payload}
	if dir == Reply {
		s.src, s.dst = f.s, f.c
	}
	if flags&flagACK != 0 {
		s.ack = f.next[1-dir]
	}
	if flags&flagSYN != 0 {
		s.opts = f.synOpt[dir]
	}
	return s
}

// advance moves side dir past a segment it sent.
func (f *flow) advance(dir Direction, flags uint8, payload int) {
	f.next[dir] += uint32(payload)
	if flags&flagSYN != 0 {
		f.next[dir]++
	}
	if flags&flagFIN != 0 {
		f.next[dir]++
	}
}

// send builds the next segment of side dir, advances it, classifies it, and
// confirms it when New.
func (f *flow) send(dir Direction, flags uint8, payload int) Result {
	f.t.Helper()
	s := f.seg(dir, flags, payload)
	f.advance(dir, flags, payload)
	return f.classify(tcpPacket(s), dir)
}

func (f *flow) classify(pkt []byte, dir Direction) Result {
	f.t.Helper()
	r := f.tab.Classify(pkt, dir)
	if r.Verdict == New {
		if err := f.tab.Confirm(&r); err != nil {
			f.t.Fatalf("Confirm: %v", err)
		}
	}
	return r
}

// mustSend is send that must not be Invalid.
func (f *flow) mustSend(dir Direction, flags uint8, payload int) Result {
	f.t.Helper()
	r := f.send(dir, flags, payload)
	if r.Verdict == Invalid {
		f.t.Fatalf("%v %s: invalid (%v)", dir, flagNames(flags), r.Reason)
	}
	return r
}

func (f *flow) info() (EntryInfo, bool) { return f.tab.Get(f.tuple()) }

// handshake runs SYN, SYN/ACK, ACK.
func (f *flow) handshake() {
	f.t.Helper()
	f.mustSend(Original, flagSYN, 0)
	f.mustSend(Reply, flagSYN|flagACK, 0)
	f.mustSend(Original, flagACK, 0)
}

func flagNames(f uint8) string {
	if f == 0 {
		return "none"
	}
	s := ""
	for i, n := range []string{"FIN", "SYN", "RST", "PSH", "ACK", "URG", "ECE", "CWR"} {
		if f&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	return s
}

type step struct {
	dir   Direction
	flags uint8
}

// reach lists, per state, segments that lead a fresh connection into it.
var reach = map[TCPState][]step{
	TCPSynSent:     {{Original, flagSYN}},
	TCPSynSent2:    {{Original, flagSYN}, {Reply, flagSYN}},
	TCPSynRecv:     {{Original, flagSYN}, {Reply, flagSYN | flagACK}},
	TCPEstablished: {{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}},
	TCPFinWait:     {{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}, {Original, flagFIN | flagACK}},
	TCPCloseWait:   {{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}, {Original, flagFIN | flagACK}, {Reply, flagACK}},
	TCPLastAck:     {{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}, {Original, flagFIN | flagACK}, {Reply, flagACK}, {Reply, flagFIN | flagACK}},
	TCPTimeWait:    {{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}, {Original, flagFIN | flagACK}, {Reply, flagACK}, {Reply, flagFIN | flagACK}, {Original, flagACK}},
	TCPClose:       {{Original, flagSYN}, {Reply, flagSYN | flagACK}, {Original, flagACK}, {Original, flagRST}},
}

// Segment classes of the kernel's tcp_conntracks table, as flags we send.
var classFlags = []struct {
	name  string
	flags uint8
}{
	{"syn", flagSYN},
	{"synack", flagSYN | flagACK},
	{"fin", flagFIN | flagACK},
	{"ack", flagACK},
	{"rst", flagRST},
	{"none", 0},
}

// keep marks an expected timeout as "not refreshed by this packet".
const keep = time.Duration(-1)

// TestTCPTransitionTable walks every cell of the transition table reachable
// from a real state: for each state, each direction and each segment class,
// it builds the state on a fresh connection, sends one in-window segment and
// checks the verdict, the state and the timeout after it. The expected column
// was written from the kernel's table and tcp_packet by hand; it is not
// derived from tcpTransitions.
func TestTCPTransitionTable(t *testing.T) {
	const (
		E = Established
		I = Invalid
		N = New
	)
	to := DefaultTimeouts()
	sm, nr := ReasonStateMachine, ReasonNoEntryReply
	type want struct {
		v       Verdict
		reason  Reason
		state   TCPState
		gone    bool
		timeout time.Duration
	}
	// Rows: syn, synack, fin, ack, rst, none; Original first, then Reply.
	table := map[TCPState][2][6]want{
		TCPSynSent: {{
			{E, 0, TCPSynSent, false, keep}, // retransmitted SYN: no refresh
			{I, sm, TCPSynSent, false, keep},
			{I, sm, TCPSynSent, false, keep},
			{I, sm, TCPSynSent, false, keep},
			{E, 0, 0, true, 0}, // client aborts before any reply: killed
			{I, ReasonBadTCPFlags, TCPSynSent, false, keep},
		}, {
			{E, 0, TCPSynSent2, false, keep}, // simultaneous open
			{E, 0, TCPSynRecv, false, to.TCPSynRecv},
			{I, sm, TCPSynSent, false, keep},
			{E, 0, TCPSynSent, false, keep}, // ignored: half-open or challenge ACK
			{E, 0, 0, true, 0},              // RST answering the SYN: killed
			{I, ReasonBadTCPFlags, TCPSynSent, false, keep},
		}},
		TCPSynSent2: {{
			{E, 0, TCPSynSent2, false, to.TCPSynSent2},
			{E, 0, TCPSynRecv, false, to.TCPSynRecv},
			{I, sm, TCPSynSent2, false, keep},
			{I, sm, TCPSynSent2, false, keep},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPSynSent2, false, keep},
		}, {
			{E, 0, TCPSynSent2, false, to.TCPSynSent2},
			{E, 0, TCPSynRecv, false, to.TCPSynRecv},
			{I, sm, TCPSynSent2, false, keep},
			{E, 0, TCPSynSent2, false, keep},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPSynSent2, false, keep},
		}},
		TCPSynRecv: {{
			{E, 0, TCPSynRecv, false, keep},
			{E, 0, TCPSynRecv, false, to.TCPSynRecv},
			{E, 0, TCPFinWait, false, to.TCPFinWait},
			{E, 0, TCPEstablished, false, to.TCPEstablished},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPSynRecv, false, keep},
		}, {
			{I, sm, TCPSynRecv, false, keep},
			{E, 0, TCPSynRecv, false, keep}, // retransmitted SYN/ACK
			{E, 0, TCPFinWait, false, to.TCPFinWait},
			{E, 0, TCPSynRecv, false, to.TCPSynRecv},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPSynRecv, false, keep},
		}},
		TCPEstablished: {{
			{E, 0, TCPEstablished, false, keep},
			{I, sm, TCPEstablished, false, keep},
			{E, 0, TCPFinWait, false, to.TCPFinWait},
			{E, 0, TCPEstablished, false, to.TCPEstablished},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPEstablished, false, keep},
		}, {
			{I, sm, TCPEstablished, false, keep},
			{E, 0, TCPEstablished, false, keep},
			{E, 0, TCPFinWait, false, to.TCPFinWait},
			{E, 0, TCPEstablished, false, to.TCPEstablished},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPEstablished, false, keep},
		}},
		TCPFinWait: {{
			{E, 0, TCPFinWait, false, keep},
			{I, sm, TCPFinWait, false, keep},
			{E, 0, TCPLastAck, false, to.TCPLastAck},
			{E, 0, TCPCloseWait, false, to.TCPUnacknowledged}, // our FIN is not acked yet
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPFinWait, false, keep},
		}, {
			{I, sm, TCPFinWait, false, keep},
			{E, 0, TCPFinWait, false, keep},
			{E, 0, TCPLastAck, false, to.TCPLastAck},
			{E, 0, TCPCloseWait, false, to.TCPCloseWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPFinWait, false, keep},
		}},
		TCPCloseWait: {{
			{E, 0, TCPCloseWait, false, keep},
			{I, sm, TCPCloseWait, false, keep},
			{E, 0, TCPLastAck, false, to.TCPLastAck},
			{E, 0, TCPCloseWait, false, to.TCPCloseWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPCloseWait, false, keep},
		}, {
			{I, sm, TCPCloseWait, false, keep},
			{E, 0, TCPCloseWait, false, keep},
			{E, 0, TCPLastAck, false, to.TCPLastAck},
			{E, 0, TCPCloseWait, false, to.TCPCloseWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPCloseWait, false, keep},
		}},
		TCPLastAck: {{
			{E, 0, TCPLastAck, false, keep},
			{I, sm, TCPLastAck, false, keep},
			{E, 0, TCPLastAck, false, to.TCPLastAck},
			{E, 0, TCPTimeWait, false, to.TCPTimeWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPLastAck, false, keep},
		}, {
			{I, sm, TCPLastAck, false, keep},
			{E, 0, TCPLastAck, false, keep},
			{E, 0, TCPLastAck, false, to.TCPLastAck},
			{E, 0, TCPTimeWait, false, to.TCPTimeWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPLastAck, false, keep},
		}},
		TCPTimeWait: {{
			{N, 0, 0, true, 0}, // reopens: old entry killed, the SYN is New
			{I, sm, TCPTimeWait, false, keep},
			{E, 0, TCPTimeWait, false, to.TCPTimeWait},
			{E, 0, TCPTimeWait, false, to.TCPTimeWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPTimeWait, false, keep},
		}, {
			{I, nr, 0, true, 0}, // server "reopens": killed, and replies create nothing
			{E, 0, TCPTimeWait, false, keep},
			{E, 0, TCPTimeWait, false, to.TCPTimeWait},
			{E, 0, TCPTimeWait, false, to.TCPTimeWait},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPTimeWait, false, keep},
		}},
		TCPClose: {{
			{N, 0, 0, true, 0}, // this side sent the RST: reopen
			{I, sm, TCPClose, false, keep},
			{E, 0, TCPClose, false, to.TCPClose},
			{E, 0, TCPClose, false, to.TCPClose},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPClose, false, keep},
		}, {
			{I, sm, TCPClose, false, keep},
			{E, 0, TCPClose, false, keep},
			{E, 0, TCPClose, false, to.TCPClose},
			{E, 0, TCPClose, false, to.TCPClose},
			{E, 0, TCPClose, false, to.TCPClose},
			{I, ReasonBadTCPFlags, TCPClose, false, keep},
		}},
	}
	for from := TCPSynSent; from < numTCPStates; from++ {
		rows, ok := table[from]
		if !ok {
			t.Fatalf("no expectations for %v", from)
		}
		for _, dir := range []Direction{Original, Reply} {
			for ci, cl := range classFlags {
				w := rows[dir][ci]
				t.Run(fmt.Sprintf("%v/%v/%s", from, dir, cl.name), func(t *testing.T) {
					tab, clk := newTestTable(t, nil)
					f := newFlow(t, tab, clk, client4, service4)
					for _, s := range reach[from] {
						f.mustSend(s.dir, s.flags, 0)
					}
					before, ok := f.info()
					if !ok || before.State != from {
						t.Fatalf("setup: state %v (present %v), want %v", before.State, ok, from)
					}
					clk.Advance(time.Second)
					killed := tab.Stats().Killed
					r := f.send(dir, cl.flags, 0)
					if r.Verdict != w.v || r.Reason != w.reason {
						t.Errorf("verdict %v/%v, want %v/%v", r.Verdict, r.Reason, w.v, w.reason)
					}
					after, ok := f.info()
					if w.gone {
						if w.v == New {
							// The New SYN was confirmed by send: a fresh entry.
							if !ok || after.ID == before.ID || after.State != TCPSynSent {
								t.Errorf("after reopen: %+v present %v, want a new SYN_SENT entry", after, ok)
							}
						} else if ok {
							t.Errorf("entry still present: %v", after)
						}
						if got := tab.Stats().Killed; got != killed+1 {
							t.Errorf("Killed %d, want %d", got, killed+1)
						}
						return
					}
					if !ok {
						t.Fatalf("entry gone, want state %v", w.state)
					}
					if after.State != w.state {
						t.Errorf("state %v, want %v", after.State, w.state)
					}
					wantTO := w.timeout
					if wantTO == keep {
						wantTO = before.Timeout - time.Second
					}
					if after.Timeout != wantTO {
						t.Errorf("timeout %v, want %v", after.Timeout, wantTO)
					}
				})
			}
		}
	}
}

// TestTCPLifecycle walks a whole connection with data, checking state,
// timeout, status and counters after every segment.
func TestTCPLifecycle(t *testing.T) {
	to := DefaultTimeouts()
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.synOpt[Original] = cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(1, 0), tcpOptWScale(7))
	f.synOpt[Reply] = cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(2, 1), tcpOptWScale(7))
	steps := []struct {
		name    string
		dir     Direction
		flags   uint8
		payload int
		verdict Verdict
		state   TCPState
		timeout time.Duration
		status  Status
	}{
		{"syn", Original, flagSYN, 0, New, TCPSynSent, to.TCPSynSent, 0},
		{"syn/ack", Reply, flagSYN | flagACK, 0, Established, TCPSynRecv, to.TCPSynRecv, StatusSeenReply},
		{"ack", Original, flagACK, 0, Established, TCPEstablished, to.TCPEstablished, StatusSeenReply | StatusAssured},
		{"request", Original, flagPSH | flagACK, 100, Established, TCPEstablished, to.TCPUnacknowledged, StatusSeenReply | StatusAssured},
		{"response acks it", Reply, flagPSH | flagACK, 1000, Established, TCPEstablished, to.TCPUnacknowledged, StatusSeenReply | StatusAssured},
		{"client acks", Original, flagACK, 0, Established, TCPEstablished, to.TCPEstablished, StatusSeenReply | StatusAssured},
		{"client fin", Original, flagFIN | flagACK, 0, Established, TCPFinWait, to.TCPFinWait, StatusSeenReply | StatusAssured},
		{"server acks fin", Reply, flagACK, 0, Established, TCPCloseWait, to.TCPCloseWait, StatusSeenReply | StatusAssured},
		{"server data in close_wait", Reply, flagPSH | flagACK, 10, Established, TCPCloseWait, to.TCPUnacknowledged, StatusSeenReply | StatusAssured},
		{"client acks data", Original, flagACK, 0, Established, TCPCloseWait, to.TCPCloseWait, StatusSeenReply | StatusAssured},
		{"server fin", Reply, flagFIN | flagACK, 0, Established, TCPLastAck, to.TCPLastAck, StatusSeenReply | StatusAssured},
		{"last ack", Original, flagACK, 0, Established, TCPTimeWait, to.TCPTimeWait, StatusSeenReply | StatusAssured},
	}
	var pkts, bytes [2]uint64
	for _, s := range steps {
		clk.Advance(100 * time.Millisecond)
		seg := f.seg(s.dir, s.flags, s.payload)
		pkt := tcpPacket(seg)
		f.advance(s.dir, s.flags, s.payload)
		r := f.classify(pkt, s.dir)
		if r.Verdict != s.verdict {
			t.Fatalf("%s: verdict %v (%v), want %v", s.name, r.Verdict, r.Reason, s.verdict)
		}
		pkts[s.dir]++
		bytes[s.dir] += uint64(len(pkt))
		i, ok := f.info()
		if !ok {
			t.Fatalf("%s: no entry", s.name)
		}
		if i.State != s.state || i.Timeout != s.timeout || i.Status != s.status {
			t.Errorf("%s: %v %v %v, want %v %v %v", s.name, i.State, i.Timeout, i.Status, s.state, s.timeout, s.status)
		}
		if i.Packets != pkts || i.Bytes != bytes {
			t.Errorf("%s: counters %v %v, want %v %v", s.name, i.Packets, i.Bytes, pkts, bytes)
		}
	}
	clk.Advance(to.TCPTimeWait)
	if n := tab.Sweep(); n != 1 {
		t.Errorf("Sweep removed %d, want 1", n)
	}
	if _, ok := f.info(); ok {
		t.Error("entry survived its TIME_WAIT timeout")
	}
}

// TestTCPResetAnsweringSYN: the usual refusal, RST+ACK with seq 0, kills the
// entry (the kernel deletes a connection whose only reply is a RST).
func TestTCPResetAnsweringSYN(t *testing.T) {
	var removed []RemoveReason
	tab, clk := newTestTable(t, func(c *Config) {
		c.OnRemove = func(_ EntryInfo, why RemoveReason) { removed = append(removed, why) }
	})
	f := newFlow(t, tab, clk, client4, service4)
	f.mustSend(Original, flagSYN, 0)
	rst := tcpSeg{src: f.s, dst: f.c, flags: flagRST | flagACK, seq: 0, ack: f.next[Original]}
	if r := tab.Classify(tcpPacket(rst), Reply); r.Verdict != Established {
		t.Fatalf("RST: %v %v", r.Verdict, r.Reason)
	}
	if _, ok := f.info(); ok {
		t.Error("entry survived")
	}
	if len(removed) != 1 || removed[0] != RemoveKilled {
		t.Errorf("OnRemove calls %v, want [killed]", removed)
	}
	// The client's retry is a new flow.
	if r := tab.Classify(tcpPacket(f.seg(Original, flagSYN, 0)), Original); r.Verdict != New {
		t.Errorf("retry: %v", r.Verdict)
	}
}

// TestTCPWindow checks the four bounds of tcp_in_window, strict and liberal.
func TestTCPWindow(t *testing.T) {
	type tc struct {
		name  string
		build func(f *flow) ([]byte, Direction)
		// verdicts in strict and liberal mode
		strict, liberal Verdict
		counted         bool // whether the packet is accounted (strict mode)
	}
	cases := []tc{
		{"in window data", func(f *flow) ([]byte, Direction) {
			return tcpPacket(f.seg(Original, flagACK|flagPSH, 500)), Original
		}, Established, Established, true},
		{"data beyond the receiver's window (bound I)", func(f *flow) ([]byte, Direction) {
			s := f.seg(Original, flagACK|flagPSH, 100)
			s.seq += 1 << 20
			return tcpPacket(s), Original
		}, Invalid, Established, false},
		{"ack for data never sent (bound III)", func(f *flow) ([]byte, Direction) {
			s := f.seg(Original, flagACK, 0)
			s.ack += 100000
			return tcpPacket(s), Original
		}, Invalid, Established, false},
		{"old data already acknowledged (bound II): ignored", func(f *flow) ([]byte, Direction) {
			s := f.seg(Original, flagACK|flagPSH, 100)
			s.seq -= 200000
			return tcpPacket(s), Original
		}, Established, Established, false},
		{"ack far below (bound IV): ignored", func(f *flow) ([]byte, Direction) {
			s := f.seg(Original, flagACK, 0)
			s.ack -= 1 << 20
			return tcpPacket(s), Original
		}, Established, Established, false},
		{"rst before what the peer acknowledged", func(f *flow) ([]byte, Direction) {
			s := f.seg(Original, flagRST, 0)
			s.seq -= 5000
			return tcpPacket(s), Original
		}, Invalid, Invalid, false},
		{"rst from the reply side before the acknowledged sequence", func(f *flow) ([]byte, Direction) {
			s := f.seg(Reply, flagRST|flagACK, 0)
			s.seq -= 70000
			return tcpPacket(s), Reply
		}, Invalid, Invalid, false},
		{"rst beyond the window (bound I)", func(f *flow) ([]byte, Direction) {
			s := f.seg(Original, flagRST, 0)
			s.seq += 1 << 24
			return tcpPacket(s), Original
		}, Invalid, Established, false},
		{"exact rst", func(f *flow) ([]byte, Direction) {
			return tcpPacket(f.seg(Original, flagRST, 0)), Original
		}, Established, Established, true},
	}
	for _, c := range cases {
		for _, liberal := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/liberal=%v", c.name, liberal), func(t *testing.T) {
				tab, clk := newTestTable(t, func(cfg *Config) { cfg.Liberal = liberal })
				f := newFlow(t, tab, clk, client4, service4)
				f.handshake()
				f.mustSend(Reply, flagACK|flagPSH, 3000)
				f.mustSend(Original, flagACK, 0)
				before, _ := f.info()
				pkt, dir := c.build(f)
				r := tab.Classify(pkt, dir)
				want := c.strict
				if liberal {
					want = c.liberal
				}
				if r.Verdict != want {
					t.Fatalf("verdict %v (%v), want %v", r.Verdict, r.Reason, want)
				}
				if r.Verdict == Invalid && r.Reason != ReasonOutOfWindow {
					t.Errorf("reason %v, want out_of_window", r.Reason)
				}
				after, ok := f.info()
				if !ok {
					if c.counted {
						return // an accepted RST may close the entry
					}
					t.Fatal("entry gone")
				}
				counted := after.Packets[dir] == before.Packets[dir]+1
				if !liberal && counted != c.counted {
					t.Errorf("accounted %v, want %v", counted, c.counted)
				}
				if r.Verdict == Invalid && (after.State != before.State || counted) {
					t.Errorf("invalid packet changed the entry: %v -> %v", before, after)
				}
			})
		}
	}
}

// TestTCPWindowScaling: a segment inside the scaled window passes only when
// both sides offered scaling (RFC 7323).
func TestTCPWindowScaling(t *testing.T) {
	for _, both := range []bool{true, false} {
		t.Run(fmt.Sprintf("both=%v", both), func(t *testing.T) {
			tab, clk := newTestTable(t, nil)
			f := newFlow(t, tab, clk, client4, service4)
			f.win = [2]uint16{1000, 1000}
			f.synOpt[Original] = tcpOptWScale(7)
			if both {
				f.synOpt[Reply] = tcpOptWScale(7)
			}
			f.handshake()
			f.mustSend(Reply, flagACK, 0) // advertises 1000<<7 when scaled
			s := f.seg(Original, flagACK|flagPSH, 100)
			s.seq += 60000 // inside 128000, far outside 1000
			r := tab.Classify(tcpPacket(s), Original)
			want := Invalid
			if both {
				want = Established
			}
			if r.Verdict != want {
				t.Errorf("verdict %v (%v), want %v", r.Verdict, r.Reason, want)
			}
		})
	}
}

// TestTCPSack: the highest SACK edge counts as the acknowledgement (bound
// III) only when the receiver permitted SACK.
func TestTCPSack(t *testing.T) {
	for _, perm := range []bool{true, false} {
		t.Run(fmt.Sprintf("sackperm=%v", perm), func(t *testing.T) {
			tab, clk := newTestTable(t, nil)
			f := newFlow(t, tab, clk, client4, service4)
			if perm {
				f.synOpt[Reply] = tcpOptSackPerm()
			}
			f.handshake()
			f.mustSend(Reply, flagACK|flagPSH, 1000)
			// The client SACKs a block beyond anything the server sent.
			s := f.seg(Original, flagACK, 0)
			top := f.next[Reply] + 5000
			s.opts = tcpOptSack([2]uint32{top - 100, top})
			r := tab.Classify(tcpPacket(s), Original)
			want := Established
			if perm {
				want = Invalid
			}
			if r.Verdict != want {
				t.Errorf("verdict %v (%v), want %v", r.Verdict, r.Reason, want)
			}
		})
	}
}

// TestTCPRetransmissions: three identical retransmissions cap the timeout at
// the max-retrans timeout.
func TestTCPRetransmissions(t *testing.T) {
	to := DefaultTimeouts()
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.handshake()
	f.mustSend(Original, flagACK|flagPSH, 100)
	f.mustSend(Reply, flagACK, 0)
	ack := tcpPacket(f.seg(Original, flagACK, 0))
	for i := 0; i <= tcpMaxRetrans; i++ {
		if r := tab.Classify(ack, Original); r.Verdict != Established {
			t.Fatalf("ack %d: %v", i, r.Verdict)
		}
		info, _ := f.info()
		want := to.TCPEstablished
		if i >= tcpMaxRetrans {
			want = to.TCPMaxRetrans
		}
		if info.Timeout != want {
			t.Errorf("after %d retransmissions: timeout %v, want %v", i, info.Timeout, want)
		}
	}
}

// TestTCPSimultaneousOpen: SYN both ways, then SYN/ACKs, then the ACK that
// completes it becomes ESTABLISHED from SYN_RECV in the reply direction.
func TestTCPSimultaneousOpen(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.mustSend(Original, flagSYN, 0)
	f.mustSend(Reply, flagSYN, 0)
	f.next[Original]--
	f.mustSend(Original, flagSYN|flagACK, 0) // the client's SYN/ACK repeats its ISN
	if i, _ := f.info(); i.State != TCPSynRecv {
		t.Fatalf("state %v, want SYN_RECV", i.State)
	}
	f.mustSend(Reply, flagACK, 0)
	if i, _ := f.info(); i.State != TCPEstablished {
		t.Fatalf("state %v, want ESTABLISHED", i.State)
	}
}

// TestTCPChallengeACK: a SYN hitting LAST_ACK may draw an RFC 5961 challenge
// ACK, which must not move the entry to TIME_WAIT.
func TestTCPChallengeACK(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	for _, s := range reach[TCPLastAck] {
		f.mustSend(s.dir, s.flags, 0)
	}
	syn := f.seg(Original, flagSYN, 0)
	syn.seq += 1 << 20
	if r := tab.Classify(tcpPacket(syn), Original); r.Verdict != Established {
		t.Fatalf("syn: %v %v", r.Verdict, r.Reason)
	}
	if r := f.send(Reply, flagACK, 0); r.Verdict != Established {
		t.Fatalf("challenge ack: %v %v", r.Verdict, r.Reason)
	}
	if i, _ := f.info(); i.State != TCPLastAck {
		t.Errorf("state %v, want LAST_ACK", i.State)
	}
	if r := f.send(Original, flagACK, 0); r.Verdict != Established {
		t.Fatalf("last ack: %v %v", r.Verdict, r.Reason)
	}
	if i, _ := f.info(); i.State != TCPTimeWait {
		t.Errorf("state %v, want TIME_WAIT", i.State)
	}
}

// TestTCPResyncAfterIgnoredSYN: a client whose old connection the table still
// holds as ESTABLISHED opens a new one with the same ports; the SYN is
// ignored, and the server's SYN/ACK answering it resynchronises the entry.
func TestTCPResyncAfterIgnoredSYN(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.handshake()
	f.next = [2]uint32{0x50000000, 0x30000000}
	if r := f.send(Original, flagSYN, 0); r.Verdict != Established {
		t.Fatalf("syn: %v %v", r.Verdict, r.Reason)
	}
	if r := f.send(Reply, flagSYN|flagACK, 0); r.Verdict != Established {
		t.Fatalf("syn/ack: %v %v", r.Verdict, r.Reason)
	}
	if i, _ := f.info(); i.State != TCPSynRecv {
		t.Fatalf("state %v, want SYN_RECV", i.State)
	}
	if r := f.send(Original, flagACK, 0); r.Verdict != Established {
		t.Fatalf("ack: %v %v", r.Verdict, r.Reason)
	}
	if i, _ := f.info(); i.State != TCPEstablished {
		t.Errorf("state %v, want ESTABLISHED", i.State)
	}
}

// TestTCPOutOfWindowFinShortensTimeout: nf_tcp_handle_invalid. On an
// ASSURED connection, an out-of-window FIN is first only remembered; an
// out-of-window FIN from the other side after it means the endpoints and the
// table are out of sync, and the timeout drops to the unacknowledged one.
func TestTCPOutOfWindowFinShortensTimeout(t *testing.T) {
	to := DefaultTimeouts()
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.handshake()
	bad := func(dir Direction) {
		t.Helper()
		s := f.seg(dir, flagFIN|flagACK, 0)
		s.seq += 1 << 24
		if r := tab.Classify(tcpPacket(s), dir); r.Verdict != Invalid || r.Reason != ReasonOutOfWindow {
			t.Fatalf("%v FIN: %v %v", dir, r.Verdict, r.Reason)
		}
	}
	bad(Reply)
	if i, _ := f.info(); i.Timeout != to.TCPEstablished || i.State != TCPEstablished {
		t.Fatalf("after the first invalid FIN: %v %v, want ESTABLISHED %v", i.State, i.Timeout, to.TCPEstablished)
	}
	bad(Original)
	if i, _ := f.info(); i.Timeout != to.TCPUnacknowledged || i.State != TCPEstablished {
		t.Errorf("after the answering invalid FIN: %v %v, want ESTABLISHED %v", i.State, i.Timeout, to.TCPUnacknowledged)
	}
}

// TestTCPResetNotEstablishedIsWindowChecked: a RST on a connection that is
// not yet ESTABLISHED goes straight to the window check (the kernel's break
// out of the CLOSE case), even when it looks like the answer to an ACK we let
// through: far out of window, it is INVALID.
func TestTCPResetNotEstablishedIsWindowChecked(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.mustSend(Original, flagSYN, 0)
	f.mustSend(Reply, flagSYN|flagACK, 0)
	f.mustSend(Reply, flagACK, 0) // SYN_RECV stays; last segment an ACK from the server
	rst := f.seg(Original, flagRST|flagACK, 0)
	rst.seq += 1 << 24
	if r := tab.Classify(tcpPacket(rst), Original); r.Verdict != Invalid || r.Reason != ReasonOutOfWindow {
		t.Fatalf("got %v %v, want invalid out_of_window", r.Verdict, r.Reason)
	}
	if i, _ := f.info(); i.State != TCPSynRecv {
		t.Errorf("state %v, want SYN_RECV", i.State)
	}
}

// TestTCPLoneSegment: a segment with data (or a FIN) is lone when it starts
// where its sender's data ended and all of that was acknowledged: the first
// request after the handshake, the next once the answer acknowledged it;
// not the second of two unacknowledged segments, a retransmission, a pure
// ACK or a RST.
func TestTCPLoneSegment(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client4, service4)
	f.mustSend(Original, flagSYN, 0)
	if r := f.mustSend(Reply, flagSYN|flagACK, 0); r.LoneSegment() {
		t.Fatal("the SYN/ACK is lone")
	}
	if r := f.mustSend(Original, flagACK, 0); r.LoneSegment() {
		t.Fatal("a pure ACK is lone")
	}
	first := f.seg(Original, flagACK|flagPSH, 100)
	if r := f.mustSend(Original, flagACK|flagPSH, 100); !r.LoneSegment() {
		t.Fatal("the first request is not lone")
	}
	if r := f.mustSend(Original, flagACK|flagPSH, 100); r.LoneSegment() {
		t.Fatal("a second unacknowledged segment is lone")
	}
	if r := f.mustSend(Reply, flagACK|flagPSH, 50); !r.LoneSegment() {
		t.Fatal("the answer, acknowledging both, is not lone")
	}
	if r := f.classify(tcpPacket(first), Original); r.Verdict == Invalid || r.LoneSegment() {
		t.Fatalf("a retransmission: %v, lone %v; want accepted, not lone", r.Verdict, r.LoneSegment())
	}
	if r := f.mustSend(Original, flagACK|flagPSH, 10); !r.LoneSegment() {
		t.Fatal("the next request, all before it acknowledged, is not lone")
	}
	f.mustSend(Reply, flagACK, 0)
	if r := f.mustSend(Original, flagACK|flagFIN, 0); !r.LoneSegment() {
		t.Fatal("a FIN after everything was acknowledged is not lone")
	}
	f.mustSend(Reply, flagACK, 0)
	if r := f.mustSend(Reply, flagRST, 0); r.LoneSegment() {
		t.Fatal("a RST is lone")
	}
}

// TestTCPReopenReason: a SYN that reopens a connection closed in order
// (TIME_WAIT) removes its entry as reopened; one that reopens a connection a
// RST ended (CLOSE) removes it as killed, as before. The SYN is New either way.
func TestTCPReopenReason(t *testing.T) {
	for _, tc := range []struct {
		from TCPState
		want RemoveReason
	}{{TCPTimeWait, RemoveReopened}, {TCPClose, RemoveKilled}} {
		var removed []RemoveReason
		tab, clk := newTestTable(t, func(c *Config) {
			c.OnRemove = func(_ EntryInfo, why RemoveReason) { removed = append(removed, why) }
		})
		f := newFlow(t, tab, clk, client4, service4)
		for _, s := range reach[tc.from] {
			f.mustSend(s.dir, s.flags, 0)
		}
		if i, ok := f.info(); !ok || i.State != tc.from {
			t.Fatalf("setup: %+v present %v, want %v", i, ok, tc.from)
		}
		clk.Advance(time.Second)
		if r := f.send(Original, flagSYN, 0); r.Verdict != New {
			t.Fatalf("%v: the reopening SYN is %v, want New", tc.from, r.Verdict)
		}
		if len(removed) != 1 || removed[0] != tc.want {
			t.Errorf("%v: OnRemove %v, want [%v]", tc.from, removed, tc.want)
		}
	}
}

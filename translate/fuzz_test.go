package translate

import (
	"encoding/binary"
	"testing"
	"time"
)

// FuzzFlow drives a translated flow with any SYN options (any MSS,
// window scale, timestamps, SACK-permitted, malformed lengths: the SYN's
// option bytes are parsed as the gate parses them), over a link with or
// without offloads, then any sequence of client segments (in order or not,
// overlapping, past the window, with FINs and RSTs), endpoint bytes and
// EOFs, a socket that fills and drains, timers, and handovers (the flow
// exported and restored around its socket). It checks that the flow
// never panics, that the socket only ever gets a prefix of the client's
// byte stream, that every byte sent to the client is the endpoint's at its
// sequence number and never one already acknowledged, that no segment
// carries more than the MSS allows, and that the kept segments and the
// sent log stay bounded and consistent; and that the timer, left alone,
// never fires for nothing; and that every state a flow reaches is one
// Restore accepts.
func FuzzFlow(f *testing.F) {
	mss := func(v uint16) []byte { return []byte{2, 4, byte(v >> 8), byte(v)} }
	f.Add(append(mss(536), 3, 3, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0), false, []byte{0, 0, 0, 0, 100, 0, 2, 0, 0, 0, 50, 0, 1, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0})
	f.Add(append(mss(536), 3, 3, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0), true, []byte{0, 0, 200, 0, 100, 0, 0, 0, 0, 0, 200, 1, 5, 0, 10, 0, 0, 0, 4, 0, 250, 0, 0, 0})
	f.Add(append(mss(12), 8, 10, 0, 0, 0, 1, 0, 0, 0, 0), false, []byte{2, 0, 0, 11, 184, 0, 3, 0, 0, 0, 0, 0})
	f.Add(mss(1), true, []byte{2, 0, 0, 11, 184, 0, 3, 0, 0, 0, 0, 0})
	f.Add([]byte{2, 3, 0, 8, 1}, false, []byte{2, 0, 0, 11, 184, 0})
	// SACK permitted; endpoint bytes, then ACKs with SACK blocks past a hole
	// and below the cumulative ACK (a D-SACK), then the timers (TLP, RTO).
	f.Add(append(mss(100), 1, 1, 4, 2), false, []byte{2, 0, 0, 11, 184, 0, 1, 0, 0, 1, 244, 0x40, 1, 0, 100, 7, 208, 0x40, 1, 0, 50, 3, 232, 0x40, 4, 0, 20, 0, 0, 0, 4, 0, 250, 0, 0, 0, 1, 0, 0, 0, 100, 0x40})
	f.Fuzz(func(t *testing.T, synOpts []byte, gso bool, ops []byte) {
		stream := func(seed byte, off, n int) []byte {
			b := make([]byte, n)
			for i := range b {
				b[i] = seed + byte((off+i)*7)
			}
			return b
		}
		// The SYN, its options as sent (padded to a multiple of 4 bytes
		// with EOL), read back by the gate's parser.
		if len(synOpts) > 40 {
			synOpts = synOpts[:40]
		}
		opts := append(append([]byte(nil), synOpts...), make([]byte, (4-len(synOpts)%4)%4)...)
		w := testWriter("10.0.0.7:40000", "10.96.0.10:80")
		pkt := make([]byte, 100)
		syn, ok := parseIP(pkt[:w.Build(pkt, testIRS, 0, tcpSYN, 1000, opts, nil)])
		if !ok {
			t.Fatalf("the SYN with options %x does not parse", opts)
		}
		h := newHarnessLink(t, syn, 1460, gso)
		segMax := h.f.sendMSS
		if segMax <= 0 || segMax > 1460 {
			t.Fatalf("send MSS %d from the SYN's options %x", segMax, opts)
		}
		h.sock.room = -1
		queued := 0 // endpoint bytes put in the socket's queue so far
		eof := false
		check := func() {
			if w := h.sock.written; string(w) != string(stream(1, 0, len(w))) {
				t.Fatalf("the socket got bytes that are not the client's stream's prefix")
			}
			for _, s := range h.take() {
				if len(s.payload) == 0 {
					continue
				}
				if len(s.payload) > segMax {
					t.Fatalf("a segment of %d bytes with a send MSS of %d", len(s.payload), segMax)
				}
				off := int(s.seq - (testISS + 1))
				discarded := queued - len(h.sock.queue)
				if off < discarded || off+len(s.payload) > queued {
					t.Fatalf("sent [%d, %d) with [%d, %d) acknowledged and queued", off, off+len(s.payload), discarded, queued)
				}
				if string(s.payload) != string(stream(2, off, len(s.payload))) {
					t.Fatalf("sent bytes at %d that are not the endpoint's", off)
				}
			}
			if h.f.kept.len() > keptSegs || h.f.kept.bytes > keptBytes {
				t.Fatalf("%d segments kept, %d bytes", h.f.kept.len(), h.f.kept.bytes)
			}
			if err := h.f.log.check(); err != nil {
				t.Fatalf("the sent log: %v", err)
			}
		}
		check()
		for len(ops) >= 6 {
			op, a, b, c := ops[0], int(binary.BigEndian.Uint16(ops[1:])), int(binary.BigEndian.Uint16(ops[3:])), ops[5]
			ops = ops[6:]
			h.f.mu.Lock()
			una, nxt := h.f.sndUna, h.f.sndNxt
			h.f.mu.Unlock()
			ack := una + uint32(a)%(nxt-una+1)
			if c&0x80 != 0 {
				ack = uint32(a) * 65537 // anywhere
			}
			switch op % 8 {
			case 0: // client data at an offset of its stream
				off, n := a%6000, b%1500
				var flags byte
				if c&1 != 0 {
					flags |= tcpFIN
				}
				h.seq = testIRS + 1 + uint32(off)
				h.segment(flags, ack, uint16(b), string(stream(1, off, n)))
			case 1: // a pure ACK, with a SACK block anywhere near what was sent (D-SACKs too) when c says so
				h.seq = testIRS + 1 + uint32(a%6000)
				seg := Segment{seq: h.seq, ack: ack, flags: tcpACK, wnd: uint16(b), ws: -1}
				if c&0x40 != 0 {
					start := una + uint32(b%8000) - 2000
					seg.sack[0], seg.nSack = seqRange{start, start + uint32(a%3000)}, 1
				}
				h.f.Input(seg)
			case 2: // endpoint bytes
				if !eof {
					n := b % 3000
					h.sock.queue = append(h.sock.queue, stream(2, queued, n)...)
					queued += n
				}
				h.f.Readable()
			case 3: // the endpoint's EOF
				eof, h.sock.eof = true, true
				h.f.Readable()
			case 4: // time passes: the timers fire
				h.now = h.now.Add(time.Duration(a) * time.Millisecond)
				h.f.OnRTO()
				h.f.FlushAck()
			case 5: // the socket fills or drains
				h.sock.room = a%5000 - 1
				h.f.Writable()
			case 6: // a RST or a SYN, anywhere
				h.seq = testIRS + uint32(a%100)
				flags := byte(tcpRST)
				if c&1 != 0 {
					flags = tcpSYN
				}
				h.f.Input(Segment{seq: h.seq, ack: ack, flags: flags, wnd: uint16(b), ws: -1})
			case 7: // a handover: the flow moves to a new process, around the same socket
				old := h.f
				m, err := old.Detach()
				if err != nil {
					break // not movable: a handshake, or ended
				}
				check()
				old.Readable() // the old process's last calls: nothing goes out
				old.OnRTO()
				old.Writable()
				old.Abort()
				if out := h.take(); len(out) > 0 || h.sock.aborted {
					t.Fatalf("a detached flow sent %d segments (socket aborted: %v)", len(out), h.sock.aborted)
				}
				f, err := Restore(h.cfg, m)
				if err != nil {
					t.Fatalf("a flow's own state refused: %v (%+v)", err, m)
				}
				h.f = f
				h.f.Resume()
			}
			check()
		}
		// Then the timers alone, as the owner arms them, with no client:
		// they never fire for nothing (64 firings in a row span the RTO's
		// floor at least: a timer that fires every millisecond while
		// sending nothing is a flow that never ends).
		var clock time.Duration
		for range 64 {
			st := h.f.State()
			if st.Closed || !st.RTO {
				return
			}
			h.now, clock = h.now.Add(st.RTODelay), clock+st.RTODelay
			h.f.OnRTO()
			check()
		}
		if clock < rtoMin {
			t.Fatalf("64 firings of the timer in %v", clock)
		}
	})
}

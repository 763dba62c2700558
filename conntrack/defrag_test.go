package conntrack

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"
	"unsafe"
)

// Fragment builders. The headers are written here from the RFCs (RFC 791
// section 3.1, RFC 8200 section 4.5), checksummed with refChecksum.

// frag4 builds an IPv4 fragment of payload at byte offset off (a multiple
// of 8) of the datagram (id, proto) from src to dst, with the 20-byte header
// and tos given.
func frag4(src, dst netip.Addr, proto uint8, id uint16, off int, more bool, tos uint8, payload []byte) []byte {
	h := make([]byte, 20, 20+len(payload))
	h[0], h[1] = 0x45, tos
	binary.BigEndian.PutUint16(h[2:], uint16(20+len(payload)))
	binary.BigEndian.PutUint16(h[4:], id)
	fo := uint16(off / 8)
	if more {
		fo |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], fo)
	h[8], h[9] = 64, proto
	s, d := src.As4(), dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	binary.BigEndian.PutUint16(h[10:], refChecksum(h))
	return append(h, payload...)
}

// frag6 builds an IPv6 fragment: the fixed header, the extension headers ext
// (whose first type is extFirst, and whose last names the Fragment header),
// the Fragment header naming next, and payload at byte offset off.
func frag6(src, dst netip.Addr, id uint32, next uint8, off int, more bool, tc uint8, ext []byte, extFirst uint8, payload []byte) []byte {
	h := make([]byte, 40, 48+len(ext)+len(payload))
	h[0], h[1] = 0x60|tc>>4, tc<<4
	binary.BigEndian.PutUint16(h[4:], uint16(len(ext)+8+len(payload)))
	h[6], h[7] = nhFragment, 64
	if len(ext) > 0 {
		h[6] = extFirst
	}
	s, d := src.As16(), dst.As16()
	copy(h[8:], s[:])
	copy(h[24:], d[:])
	h = append(h, ext...)
	fo := uint16(off)
	if more {
		fo |= 1
	}
	fh := []byte{next, 0, byte(fo >> 8), byte(fo), 0, 0, 0, 0}
	binary.BigEndian.PutUint32(fh[4:], id)
	return append(append(h, fh...), payload...)
}

// split cuts the datagram pkt (IPv4, or IPv6 without extension headers) into
// fragments of size payload bytes (a multiple of 8), the last one shorter.
// IPv4 fragments keep the datagram's own ID (see withID4); IPv6 ones get id.
func split(pkt []byte, size int, id uint32) [][]byte {
	var out [][]byte
	if pkt[0]>>4 == 4 {
		src, dst := netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20]))
		ihl := int(pkt[0]&0x0f) * 4
		p := pkt[ihl:]
		for off := 0; off < len(p); off += size {
			end := min(off+size, len(p))
			out = append(out, frag4(src, dst, pkt[9], binary.BigEndian.Uint16(pkt[4:6]), off, end < len(p), pkt[1], p[off:end]))
		}
		return out
	}
	src, dst := netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40]))
	p := pkt[40:]
	tc := pkt[0]<<4 | pkt[1]>>4
	for off := 0; off < len(p); off += size {
		end := min(off+size, len(p))
		out = append(out, frag6(src, dst, id, pkt[6], off, end < len(p), tc, nil, 0, p[off:end]))
	}
	return out
}

// withID4 returns a copy of the IPv4 datagram pkt with identification id.
func withID4(pkt []byte, id uint16) []byte { return fix4(setField(pkt, 4, id)) }

func newTestReassembler(t testing.TB, mod func(*ReassemblyConfig)) (*Reassembler, *ManualClock) {
	t.Helper()
	clk := NewManualClock(int64(1000 * time.Hour))
	cfg := ReassemblyConfig{Clock: clk}
	if mod != nil {
		mod(&cfg)
	}
	r, err := NewReassembler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, clk
}

// check verifies the reassembler's invariants: every fragment taken is
// delivered, dropped or held exactly once; each family within its bounds;
// every queue sorted, disjoint, within its length and on its family's list
// in expiry order.
func (r *Reassembler) check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.stats
	var dropped uint64
	for _, n := range s.Dropped {
		dropped += n
	}
	queues := 0
	for i := range r.fam {
		f := &r.fam[i]
		if f.bytes > r.maxBytes || f.queues > r.maxQueues || f.bytes < 0 {
			return fmt.Errorf("family %d: %d bytes, %d queues", i, f.bytes, f.queues)
		}
		n, frags, charged := 0, 0, 0
		var prev *fragQueue
		for q := f.head; q != nil; prev, q = q, q.next {
			n++
			frags += len(q.frags)
			charged += q.bytes
			if q.prev != prev || (prev != nil && prev.expires > q.expires) || r.queues[q.key] != q {
				return fmt.Errorf("family %d: list broken at %+v", i, q.key)
			}
			if len(q.frags) == 0 || len(q.frags) > r.maxFragments {
				return fmt.Errorf("queue with %d fragments", len(q.frags))
			}
			meat := 0
			for j, fr := range q.frags {
				if fr.end <= fr.off || len(fr.data) != fr.end-fr.off || (j > 0 && q.frags[j-1].end > fr.off) || fr.end > q.length {
					return fmt.Errorf("fragment %d [%d, %d) of length %d", j, fr.off, fr.end, q.length)
				}
				meat += fr.end - fr.off
			}
			if meat != q.meat || (q.first && q.last && q.meat == q.length) || q.first != (q.frags[0].off == 0) {
				return fmt.Errorf("queue meat %d/%d of %d, first %v last %v", meat, q.meat, q.length, q.first, q.last)
			}
		}
		if f.tail != prev || n != f.queues || frags != f.fragments || charged != f.bytes {
			return fmt.Errorf("family %d: %d queues (%d counted), %d fragments (%d), %d bytes (%d)", i, n, f.queues, frags, f.fragments, charged, f.bytes)
		}
		queues += n
	}
	if queues != len(r.queues) {
		return fmt.Errorf("%d queues listed, %d in the map", queues, len(r.queues))
	}
	held := uint64(r.fam[0].fragments + r.fam[1].fragments)
	if s.Fragments != s.Delivered+dropped+held || s.Dropped[FragmentDropNone] != 0 {
		return fmt.Errorf("fragments %d != delivered %d + dropped %d + held %d", s.Fragments, s.Delivered, dropped, held)
	}
	return nil
}

func mustCheckReassembly(t testing.TB, r *Reassembler) {
	t.Helper()
	if err := r.check(); err != nil {
		t.Fatal(err)
	}
}

// feed adds the fragments in the order given and returns the last result.
func feed(t testing.TB, r *Reassembler, frags [][]byte, order []int) ([]byte, FragmentVerdict, FragmentDrop) {
	t.Helper()
	var out []byte
	var v FragmentVerdict
	var d FragmentDrop
	for n, i := range order {
		out, v, d = r.Add(frags[i], make([]byte, 0, 100))
		if n < len(order)-1 && v != FragmentHeld {
			t.Fatalf("fragment %d (%d of the order): %v/%v, want held", i, n, v, d)
		}
		mustCheckReassembly(t, r)
	}
	return out, v, d
}

var families = []struct {
	name     string
	c, s     netip.AddrPort
	fragSize int // payload bytes per fragment: a 1500-byte MTU, IPv6's 1280 minimum
}{
	{"ipv4", client4, service4, 1480},
	{"ipv6", client6, service6, 1232},
}

// TestReassembleOrders: a 4000-byte UDP datagram in three or four fragments
// comes out whole, byte for byte the datagram that was cut, whatever the
// order, and classifies as a new UDP flow (its checksum covers the whole
// datagram).
func TestReassembleOrders(t *testing.T) {
	rng := testRand(t)
	for _, fam := range families {
		whole := udpPacket(fam.c, fam.s, 4000, ipOpts{})
		frags := split(whole, fam.fragSize, 0x1234)
		n := len(frags)
		shuffled := rng.Perm(n)
		reversed := make([]int, n)
		inOrder := make([]int, n)
		for i := range n {
			inOrder[i], reversed[i] = i, n-1-i
		}
		for _, o := range []struct {
			name  string
			order []int
		}{
			{"in order", inOrder},
			{"reversed", reversed},
			{"last first", append([]int{n - 1}, inOrder[:n-1]...)},
			{"shuffled", shuffled},
		} {
			t.Run(fam.name+"/"+o.name, func(t *testing.T) {
				r, _ := newTestReassembler(t, nil)
				out, v, d := feed(t, r, frags, o.order)
				if v != FragmentComplete || d != FragmentDropNone {
					t.Fatalf("last fragment: %v/%v, want complete", v, d)
				}
				if !bytes.Equal(out, whole) {
					t.Fatalf("reassembled %d bytes differ from the %d-byte datagram", len(out), len(whole))
				}
				tab, _ := newTestTable(t, nil)
				if res := tab.Classify(out, Original); res.Verdict != New || res.Tuple != MakeTuple(UDP, fam.c, fam.s) {
					t.Fatalf("reassembled datagram classifies %v/%v %v", res.Verdict, res.Reason, res.Tuple)
				}
				s := r.Stats()
				if s.Fragments != uint64(n) || s.Reassembled != 1 || s.Delivered != uint64(n) || s.Queues != 0 || s.Bytes != 0 || s.HeldFragments != 0 {
					t.Errorf("stats %+v", s)
				}
			})
		}
	}
}

// TestReassembleDuplicates: a fragment repeated, or one lying within two
// adjacent held fragments, is dropped alone (IPFRAG_DUP) and the datagram
// still completes, with the first copy's bytes.
func TestReassembleDuplicates(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			r, _ := newTestReassembler(t, nil)
			whole := udpPacket(fam.c, fam.s, 4000, ipOpts{})
			if fam.c.Addr().Is4() {
				whole = withID4(whole, 7)
			}
			frags := split(whole, 1024, 7) // [0,1024) [1024,2048) [2048,3072) [3072,4008)
			// Within fragments 0 and 1, and with other bytes.
			inner := make([]byte, 1024)
			var within []byte
			if fam.c.Addr().Is4() {
				within = frag4(fam.c.Addr(), fam.s.Addr(), 17, 7, 512, true, 0, inner)
			} else {
				within = frag6(fam.c.Addr(), fam.s.Addr(), 7, 17, 512, true, 0, nil, 0, inner)
			}
			steps := []struct {
				pkt  []byte
				want FragmentVerdict
			}{
				{frags[0], FragmentHeld},
				{frags[0], FragmentDropped},
				{frags[1], FragmentHeld},
				{within, FragmentDropped},
				{frags[1], FragmentDropped},
				{frags[3], FragmentHeld},
				{frags[2], FragmentComplete},
				{frags[2], FragmentHeld}, // the queue is gone: a late copy starts a new one
			}
			var out []byte
			for i, st := range steps {
				o, v, d := r.Add(st.pkt, nil)
				if v != st.want || (v == FragmentDropped && d != FragmentDropDuplicate) {
					t.Fatalf("step %d: %v/%v, want %v", i, v, d, st.want)
				}
				if v == FragmentComplete {
					out = o
				}
				mustCheckReassembly(t, r)
			}
			if !bytes.Equal(out, whole) {
				t.Fatal("the duplicates changed the datagram")
			}
			if s := r.Stats(); s.Dropped[FragmentDropDuplicate] != 3 || s.Reassembled != 1 || s.Queues != 1 {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestReassembleOverlap: a fragment overlapping a held one without being
// covered discards the whole datagram, in both families (RFC 5722; the
// kernel applies it to IPv4 too), and what follows starts afresh.
func TestReassembleOverlap(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			r, _ := newTestReassembler(t, nil)
			whole := udpPacket(fam.c, fam.s, 4000, ipOpts{})
			if fam.c.Addr().Is4() {
				whole = withID4(whole, 9)
			}
			frags := split(whole, 1024, 9)
			var overlap []byte // [1536, 2560): starts inside fragment 1, ends in the gap after it
			if fam.c.Addr().Is4() {
				overlap = frag4(fam.c.Addr(), fam.s.Addr(), 17, 9, 1536, true, 0, make([]byte, 1024))
			} else {
				overlap = frag6(fam.c.Addr(), fam.s.Addr(), 9, 17, 1536, true, 0, nil, 0, make([]byte, 1024))
			}
			feed(t, r, frags, []int{0, 1})
			if _, v, d := r.Add(overlap, nil); v != FragmentDropped || d != FragmentDropOverlap {
				t.Fatalf("overlapping fragment: %v/%v", v, d)
			}
			mustCheckReassembly(t, r)
			s := r.Stats()
			if s.Dropped[FragmentDropOverlap] != 3 || s.Queues != 0 || s.Bytes != 0 {
				t.Fatalf("after the overlap: %+v", s)
			}
			// The rest of the datagram alone cannot complete it.
			if _, v, _ := feed(t, r, frags, []int{2, 3}); v != FragmentHeld {
				t.Fatalf("the rest: %v, want held", v)
			}
			if s := r.Stats(); s.Reassembled != 0 || s.Queues != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// TestReassembleTimeout: a queue lives ipfrag_time (IPv4, 30 s) or
// nf_conntrack_frag6_timeout (IPv6, 60 s) from its first fragment, whatever
// arrives later; then its fragments count as timed out, whether Sweep or the
// next fragment finds it.
func TestReassembleTimeout(t *testing.T) {
	for _, fam := range families {
		timeout := DefaultReassemblyTimeout4
		if fam.c.Addr().Is6() {
			timeout = DefaultReassemblyTimeout6
		}
		t.Run(fam.name, func(t *testing.T) {
			r, clk := newTestReassembler(t, nil)
			frags := split(udpPacket(fam.c, fam.s, 4000, ipOpts{}), fam.fragSize, 3)
			feed(t, r, frags, []int{0})
			clk.Advance(timeout / 2)
			feed(t, r, frags, []int{1}) // does not restart the timer
			clk.Advance(timeout/2 - time.Millisecond)
			if n := r.Sweep(); n != 0 {
				t.Fatalf("Sweep before the timeout removed %d queues", n)
			}
			clk.Advance(time.Millisecond)
			if n := r.Sweep(); n != 1 {
				t.Fatalf("Sweep at the timeout removed %d queues, want 1", n)
			}
			mustCheckReassembly(t, r)
			if s := r.Stats(); s.Dropped[FragmentDropTimeout] != 2 || s.Queues != 0 || s.Bytes != 0 {
				t.Fatalf("stats %+v", s)
			}

			// Found by the next fragment instead of Sweep: the late
			// fragment starts a new queue.
			feed(t, r, frags, []int{0})
			clk.Advance(timeout)
			if _, v, _ := r.Add(frags[1], nil); v != FragmentHeld {
				t.Fatalf("late fragment: %v", v)
			}
			mustCheckReassembly(t, r)
			if s := r.Stats(); s.Dropped[FragmentDropTimeout] != 3 || s.Queues != 1 || s.HeldFragments != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

// TestReassembleBounds: the byte bound (ipfrag_high_thresh, per family as
// the kernel's fqdirs) refuses any fragment that would pass it, including one
// for an existing queue; the queue and fragment bounds refuse a new queue and
// discard an overgrown datagram; memory comes back when queues go.
func TestReassembleBounds(t *testing.T) {
	t.Run("bytes", func(t *testing.T) {
		// Room for one 1480-byte fragment with its queue, not two.
		max := queueCharge + 20 + 1480 + fragmentCharge + 1000
		r, clk := newTestReassembler(t, func(c *ReassemblyConfig) { c.MaxBytes = max })
		a := split(udpPacket(client4, service4, 4000, ipOpts{}), 1480, 1)
		b := split(udpPacket(netip.MustParseAddrPort("10.0.0.2:1"), service4, 4000, ipOpts{}), 1480, 1)
		feed(t, r, a, []int{0})
		for _, pkt := range [][]byte{b[0], a[1]} {
			if _, v, d := r.Add(pkt, nil); v != FragmentDropped || d != FragmentDropMemory {
				t.Fatalf("over the bound: %v/%v", v, d)
			}
			mustCheckReassembly(t, r)
		}
		if s := r.Stats(); s.Bytes > max || s.Queues != 1 || s.Dropped[FragmentDropMemory] != 2 {
			t.Fatalf("stats %+v", s)
		}
		// The other family has its own bound.
		if _, v, _ := r.Add(split(udpPacket(client6, service6, 4000, ipOpts{}), 1232, 1)[0], nil); v != FragmentHeld {
			t.Fatalf("IPv6 refused by the IPv4 bound: %v", v)
		}
		clk.Advance(DefaultReassemblyTimeout4)
		if _, v, _ := r.Add(b[0], nil); v != FragmentHeld {
			t.Fatalf("after the timeout freed the memory: %v", v)
		}
		mustCheckReassembly(t, r)
	})
	t.Run("queues", func(t *testing.T) {
		r, _ := newTestReassembler(t, func(c *ReassemblyConfig) { c.MaxQueues = 2 })
		whole := udpPacket(client4, service4, 100, ipOpts{})
		for id := uint16(1); id <= 3; id++ {
			_, v, d := r.Add(split(withID4(whole, id), 64, 0)[0], nil)
			if id == 3 && (v != FragmentDropped || d != FragmentDropQueueLimit) || id < 3 && v != FragmentHeld {
				t.Fatalf("queue %d: %v/%v", id, v, d)
			}
		}
		// An existing queue still takes fragments and completes.
		if out, v, _ := r.Add(split(withID4(whole, 1), 64, 0)[1], nil); v != FragmentComplete || !bytes.Equal(out, withID4(whole, 1)) {
			t.Fatalf("completing an existing queue: %v", v)
		}
		mustCheckReassembly(t, r)
	})
	t.Run("fragments", func(t *testing.T) {
		r, _ := newTestReassembler(t, func(c *ReassemblyConfig) { c.MaxFragments = 3 })
		frags := split(udpPacket(client6, service6, 400, ipOpts{}), 96, 5) // 5 fragments
		feed(t, r, frags, []int{0, 1, 2})
		if _, v, d := r.Add(frags[3], nil); v != FragmentDropped || d != FragmentDropFragmentLimit {
			t.Fatalf("fourth fragment: %v/%v", v, d)
		}
		if s := r.Stats(); s.Dropped[FragmentDropFragmentLimit] != 4 || s.Queues != 0 {
			t.Fatalf("stats %+v", s)
		}
		mustCheckReassembly(t, r)
	})
}

// TestReassembleTooBig: a datagram beyond 65535 bytes is refused: an IPv4
// fragment past the limit discards its datagram, an IPv4 datagram whose
// first fragment's options push it over is discarded when complete
// (ip_frag_reasm's E2BIG), an IPv6 fragment past IPV6_MAXPLEN is dropped
// alone (nf_ct_frag6_queue).
func TestReassembleTooBig(t *testing.T) {
	r, _ := newTestReassembler(t, nil)
	c, s := client4.Addr(), service4.Addr()
	feed(t, r, [][]byte{frag4(c, s, 17, 1, 0, true, 0, make([]byte, 8))}, []int{0})
	if _, v, d := r.Add(frag4(c, s, 17, 1, 65512, false, 0, make([]byte, 16)), nil); v != FragmentDropped || d != FragmentDropTooBig {
		t.Fatalf("IPv4 past 65535: %v/%v", v, d)
	}
	if st := r.Stats(); st.Dropped[FragmentDropTooBig] != 2 || st.Queues != 0 {
		t.Fatalf("stats %+v", st)
	}

	// 40 bytes of options in the first fragment, 65500 bytes of payload.
	first := frag4(c, s, 17, 2, 0, true, 0, make([]byte, 65000))
	opts := append(append([]byte{0x4f}, first[1:20]...), make([]byte, 40)...)
	opts = append(opts, first[20:]...)
	binary.BigEndian.PutUint16(opts[2:], uint16(len(opts)))
	opts[10], opts[11] = 0, 0
	binary.BigEndian.PutUint16(opts[10:], refChecksum(opts[:60]))
	feed(t, r, [][]byte{opts}, []int{0})
	if _, v, d := r.Add(frag4(c, s, 17, 2, 65000, false, 0, make([]byte, 500)), nil); v != FragmentDropped || d != FragmentDropTooBig {
		t.Fatalf("IPv4 with options past 65535: %v/%v", v, d)
	}

	c6, s6 := client6.Addr(), service6.Addr()
	feed(t, r, [][]byte{frag6(c6, s6, 3, 17, 0, true, 0, nil, 0, make([]byte, 8))}, []int{0})
	if _, v, d := r.Add(frag6(c6, s6, 3, 17, 65528, false, 0, nil, 0, make([]byte, 16)), nil); v != FragmentDropped || d != FragmentDropTooBig {
		t.Fatalf("IPv6 past 65535: %v/%v", v, d)
	}
	if st := r.Stats(); st.Dropped[FragmentDropTooBig] != 5 || st.Queues != 1 {
		t.Fatalf("stats %+v (the IPv6 queue stays)", st)
	}
	mustCheckReassembly(t, r)
}

// TestReassembleMalformed: inconsistent fragments, as ip_frag_queue and
// nf_ct_frag6_queue judge them. IPv4 discards the datagram; IPv6 drops the
// fragment alone, but for a middle fragment that is not a multiple of 8
// bytes.
func TestReassembleMalformed(t *testing.T) {
	c, s, c6, s6 := client4.Addr(), service4.Addr(), client6.Addr(), service6.Addr()
	p := func(n int) []byte { return make([]byte, n) }
	udpHdr := func(n int) []byte { b := p(n); binary.BigEndian.PutUint16(b[4:], uint16(n)); return b }
	for _, tc := range []struct {
		name       string
		held       [][]byte
		bad        []byte
		wantQueues int // after the bad fragment
	}{
		{"v4 last ends short of held data", [][]byte{frag4(c, s, 17, 1, 800, true, 0, p(80))}, frag4(c, s, 17, 1, 400, false, 0, p(80)), 0},
		{"v4 second last fragment", [][]byte{frag4(c, s, 17, 1, 800, false, 0, p(80))}, frag4(c, s, 17, 1, 800, false, 0, p(96)), 0},
		{"v4 data past the last", [][]byte{frag4(c, s, 17, 1, 80, false, 0, p(80))}, frag4(c, s, 17, 1, 160, true, 0, p(80)), 0},
		{"v4 middle fragment under 8 bytes", [][]byte{frag4(c, s, 17, 1, 0, true, 0, p(80))}, frag4(c, s, 17, 1, 80, true, 0, p(5)), 0},
		{"v6 last ends short of held data", [][]byte{frag6(c6, s6, 1, 17, 800, true, 0, nil, 0, p(80))}, frag6(c6, s6, 1, 17, 400, false, 0, nil, 0, p(80)), 1},
		{"v6 empty fragment", [][]byte{frag6(c6, s6, 1, 17, 800, true, 0, nil, 0, p(80))}, frag6(c6, s6, 1, 17, 80, true, 0, nil, 0, nil), 1},
		{"v6 middle fragment not a multiple of 8", [][]byte{frag6(c6, s6, 1, 17, 800, true, 0, nil, 0, p(80))}, frag6(c6, s6, 1, 17, 80, true, 0, nil, 0, p(81)), 0},
		{"v6 first fragment without the whole UDP header", nil, frag6(c6, s6, 1, nhDestOpts, 0, true, 0, nil, 0, extHeader(17, 0)), 0},
		{"v6 first fragment cut inside TCP", nil, frag6(c6, s6, 1, 6, 0, true, 0, nil, 0, p(16)), 0},
		{"ECN-capable and not mixed", [][]byte{frag4(c, s, 17, 1, 0, true, 2, udpHdr(80))}, frag4(c, s, 17, 1, 80, false, 0, p(8)), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := newTestReassembler(t, nil)
			feed(t, r, tc.held, seq(len(tc.held)))
			if _, v, d := r.Add(tc.bad, nil); v != FragmentDropped || d != FragmentDropMalformed {
				t.Fatalf("%v/%v, want dropped/malformed", v, d)
			}
			mustCheckReassembly(t, r)
			st := r.Stats()
			if st.Queues != tc.wantQueues || st.Dropped[FragmentDropMalformed] != uint64(1+len(tc.held)-st.HeldFragments) {
				t.Fatalf("stats %+v", st)
			}
		})
	}
	// The UDP header is whole in a first fragment that has exactly it.
	r, _ := newTestReassembler(t, nil)
	if _, v, _ := r.Add(frag6(c6, s6, 1, 17, 0, true, 0, nil, 0, p(8)), nil); v != FragmentHeld {
		t.Fatalf("an 8-byte first fragment of UDP: %v", v)
	}
}

// seq returns 0, 1, ..., n-1.
func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestReassembleECN: a CE mark on any fragment of an ECN-capable datagram
// survives reassembly (ip_frag_ecn_table).
func TestReassembleECN(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			r, _ := newTestReassembler(t, nil)
			frags := split(udpPacket(fam.c, fam.s, 4000, ipOpts{}), fam.fragSize, 4)
			for i, f := range frags {
				ecn := byte(2) // ECT(0)
				if i == 1 {
					ecn = 3 // CE
				}
				if fam.c.Addr().Is4() {
					f[1] = ecn
					f[10], f[11] = 0, 0
					binary.BigEndian.PutUint16(f[10:], refChecksum(f[:20]))
				} else {
					f[1] |= ecn << 4
				}
			}
			out, v, _ := feed(t, r, frags, seq(len(frags)))
			if v != FragmentComplete {
				t.Fatalf("%v", v)
			}
			got := out[1] & 3
			if fam.c.Addr().Is6() {
				got = out[1] >> 4 & 3
			} else if refChecksum(out[:20]) != 0 {
				t.Fatal("bad header checksum")
			}
			if got != 3 {
				t.Fatalf("ECN %d, want CE", got)
			}
		})
	}
}

// TestReassembleIPv6Headers: extension headers before the Fragment header
// are kept from the first fragment, the one before the Fragment header names
// the upper layer, and atomic fragments are whole datagrams at once, leaving
// a queue of the same ID alone (RFC 6946).
func TestReassembleIPv6Headers(t *testing.T) {
	c6, s6 := client6.Addr(), service6.Addr()
	r, _ := newTestReassembler(t, nil)
	udp := udpPacket(client6, service6, 1000, ipOpts{})[40:]
	ext := cat(extHeader(nhDestOpts, 0), extHeader(nhFragment, 1))
	first := frag6(c6, s6, 8, 17, 0, true, 0, ext, nhHopByHop, udp[:512])
	last := frag6(c6, s6, 8, 17, 512, false, 0, ext, nhHopByHop, udp[512:])
	feed(t, r, [][]byte{first}, []int{0})

	atomic := frag6(c6, s6, 8, 17, 0, false, 0, nil, 0, udp)
	out, v, _ := r.Add(atomic, nil)
	want := udpPacket(client6, service6, 1000, ipOpts{})
	if v != FragmentComplete || !bytes.Equal(out, want) {
		t.Fatalf("atomic fragment: %v, %x", v, out)
	}
	if st := r.Stats(); st.Queues != 1 || st.HeldFragments != 1 {
		t.Fatalf("the atomic fragment touched the queue: %+v", st)
	}

	out, v, _ = r.Add(last, nil)
	want = udpPacket(client6, service6, 1000, ipOpts{extHeaders: cat(extHeader(nhDestOpts, 0), extHeader(17, 1)), extFirst: nhHopByHop})
	if v != FragmentComplete || !bytes.Equal(out, want) {
		t.Fatalf("with extension headers: %v\n got %x\nwant %x", v, out, want)
	}
	tab, _ := newTestTable(t, nil)
	if res := tab.Classify(out, Original); res.Verdict != New {
		t.Fatalf("classifies %v/%v", res.Verdict, res.Reason)
	}
	mustCheckReassembly(t, r)
}

// TestNotFragment: whole packets, and fragments whose headers Classify
// refuses on its own, come back NotFragment and uncounted.
func TestNotFragment(t *testing.T) {
	r, _ := newTestReassembler(t, nil)
	c, s, c6, s6 := client4.Addr(), service4.Addr(), client6.Addr(), service6.Addr()
	badSum := frag4(c, s, 17, 1, 0, true, 0, make([]byte, 64))
	badSum[10] ^= 0xff
	routed := frag6(c6, s6, 1, 17, 0, true, 0, []byte{nhFragment, 0, 0, 1, 0, 0, 0, 0}, nhRouting, make([]byte, 64))
	for _, tc := range []struct {
		name   string
		pkt    []byte
		isFrag bool
	}{
		{"tcp4", tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1}), false},
		{"udp6", udpPacket(client6, service6, 100, ipOpts{}), false},
		{"df", tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, ip: ipOpts{fragment: 0x4000}}), false},
		{"udp6 behind destination options", udpPacket(client6, service6, 8, ipOpts{extHeaders: extHeader(17, 0), extFirst: nhDestOpts}), false},
		{"empty", nil, false},
		{"bad IPv4 header checksum", badSum, true},
		{"IPv4 total length past the buffer", frag4(c, s, 17, 1, 0, true, 0, make([]byte, 64))[:60], true},
		{"routing header with segments left", routed, true},
		{"jumbogram", func() []byte {
			b := frag6(c6, s6, 1, 17, 0, true, 0, nil, 0, make([]byte, 64))
			b[4], b[5] = 0, 0
			return b
		}(), true},
	} {
		if got := IsFragment(tc.pkt); got != tc.isFrag {
			t.Errorf("%s: IsFragment %v", tc.name, got)
		}
		if _, v, _ := r.Add(tc.pkt, nil); v != NotFragment {
			t.Errorf("%s: %v, want NotFragment", tc.name, v)
		}
	}
	if st := r.Stats(); st.Fragments != 0 {
		t.Errorf("counted %d fragments", st.Fragments)
	}
}

// TestIsFragmentNoAllocs: IsFragment runs for every packet the gate reads.
func TestIsFragmentNoAllocs(t *testing.T) {
	v4 := tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagACK, seq: 1, win: 1})
	v6 := tcpPacket(tcpSeg{src: client6, dst: service6, flags: flagACK, seq: 1, win: 1})
	if a := testing.AllocsPerRun(100, func() { IsFragment(v4); IsFragment(v6) }); a != 0 {
		t.Errorf("IsFragment allocates %.1f times", a)
	}
}

// TestReassemblyCharges: the fixed charges cover what a queue and a fragment
// really take (a fragment record twice over, for the slice's growth).
func TestReassemblyCharges(t *testing.T) {
	if q := unsafe.Sizeof(fragQueue{}) + unsafe.Sizeof(fragKey{}) + unsafe.Sizeof((*fragQueue)(nil)); q > queueCharge {
		t.Errorf("a queue takes %d bytes, charged %d", q, queueCharge)
	}
	if f := 2 * unsafe.Sizeof(fragment{}); f > fragmentCharge {
		t.Errorf("a fragment takes %d bytes, charged %d", f, fragmentCharge)
	}
}

func TestFragmentDropStrings(t *testing.T) {
	for d := FragmentDropNone; d < NumFragmentDrops; d++ {
		if s := d.String(); s == "" || s[:min(5, len(s))] == "drop_" {
			t.Errorf("FragmentDrop(%d) = %q", d, s)
		}
	}
	if _, err := NewReassembler(ReassemblyConfig{MaxBytes: -1}); err == nil {
		t.Error("a negative bound was accepted")
	}
}

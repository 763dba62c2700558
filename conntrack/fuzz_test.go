package conntrack

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// seedPackets are well-formed packets of every kind parse handles, used to
// seed both fuzzers.
func seedPackets() [][]byte {
	f := newFlow(nil, nil, nil, client4, service4)
	f6 := newFlow(nil, nil, nil, client6, service6)
	synOpts := cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(1, 0), tcpOptWScale(7))
	return [][]byte{
		tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 65535, opts: synOpts}),
		tcpPacket(f.seg(Original, flagACK|flagPSH, 64)),
		tcpPacket(tcpSeg{src: service4, dst: client4, flags: flagACK, seq: 9, ack: 2, win: 100, opts: tcpOptSack([2]uint32{5, 9})}),
		tcpPacket(f6.seg(Original, flagSYN|flagECE|flagCWR, 0)),
		tcpPacket(tcpSeg{src: client6, dst: service6, flags: flagSYN, seq: 1, win: 1,
			ip: ipOpts{extHeaders: cat(extHeader(nhDestOpts, 0), extHeader(nhTCP, 0)), extFirst: nhHopByHop}}),
		udpPacket(client4, service4, 32, ipOpts{}),
		udpPacket(client6, service6, 32, ipOpts{}),
		icmpError(client4.Addr(), service4.Addr(), 3, 3, udpPacket(service4, client4, 8, ipOpts{}), 28),
		icmpError(client6.Addr(), service6.Addr(), 2, 0, tcpPacket(f6.seg(Reply, flagACK, 100)), -1),
		icmpInfo(client4.Addr(), service4.Addr(), 8),
		tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, ip: ipOpts{ipv4Options: []byte{1, 1, 1, 0}}}),
	}
}

// FuzzParse feeds arbitrary bytes to the parser. It must never panic, and:
// verification only ever adds bad_checksum; an accepted packet yields a
// complete tuple and lengths inside the buffer; and an accepted IPv4 TCP or
// UDP packet really carries a correct checksum by the reference sum.
func FuzzParse(f *testing.F) {
	for _, p := range seedPackets() {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var pv, pn parsed
		rv := parse(b, true, &pv)
		rn := parse(b, false, &pn)
		if rv >= NumReasons || rn >= NumReasons {
			t.Fatalf("reasons out of range: %d %d", rv, rn)
		}
		if rn == ReasonNone && rv != ReasonNone && rv != ReasonBadChecksum {
			t.Fatalf("verification failed with %v", rv)
		}
		if rv != ReasonNone {
			return
		}
		if rn != ReasonNone || pv != pn {
			t.Fatalf("verification changed the outcome: %v %+v / %+v", rn, pv, pn)
		}
		tu := pv.tuple
		switch {
		case pv.kind != kindFlow && pv.kind != kindICMPError:
			t.Fatalf("kind %d", pv.kind)
		case tu.family != 4 && tu.family != 6:
			t.Fatalf("family %d", tu.family)
		case tu.proto != TCP && tu.proto != UDP:
			t.Fatalf("proto %d", tu.proto)
		case int(pv.seg.ipLen) > len(b) || pv.seg.ipLen < 20:
			t.Fatalf("ipLen %d of %d bytes", pv.seg.ipLen, len(b))
		case tu.proto == TCP && pv.kind == kindFlow && pv.seg.payload+20 > pv.seg.ipLen:
			t.Fatalf("payload %d in %d bytes", pv.seg.payload, pv.seg.ipLen)
		case pv.kind == kindFlow && tu.proto == TCP && validTCPFlags>>(pv.seg.flags&^(flagPSH|flagECE|flagCWR))&1 == 0:
			t.Fatalf("accepted flags %#x", pv.seg.flags)
		}
		if tu.family == 4 && pv.kind == kindFlow {
			ihl := int(b[0]&0x0f) * 4
			l4 := b[ihl:pv.seg.ipLen]
			src, dst := tu.SrcAddr(), tu.DstAddr()
			switch tu.proto {
			case TCP:
				if c := refChecksum(pseudoHeader(src, dst, 6, len(l4)), l4); c != 0 {
					t.Fatalf("accepted a TCP segment whose reference checksum is %#x", c)
				}
			case UDP:
				ulen := int(binary.BigEndian.Uint16(l4[4:6]))
				if binary.BigEndian.Uint16(l4[6:8]) != 0 {
					if c := refChecksum(pseudoHeader(src, dst, 17, ulen), l4[:ulen]); c != 0 {
						t.Fatalf("accepted a UDP datagram whose reference checksum is %#x", c)
					}
				}
			}
			if refChecksum(b[:ihl]) != 0 {
				t.Fatal("accepted a bad IPv4 header checksum")
			}
		}
	})
}

// FuzzParseHead parses the first cut bytes of a packet as ClassifyHead does,
// with the rest of the packet counted but missing. It must never read past
// the head; a head that parses must give what the whole packet gives, and one
// that does not fails as the whole packet does, or for the cut (truncated, or
// an ICMP error's quote cut).
func FuzzParseHead(f *testing.F) {
	for _, p := range seedPackets() {
		f.Add(p, uint16(len(p)))
		f.Add(p, uint16(min(len(p), 60)))
		f.Add(p, uint16(min(len(p), 30)))
		f.Add(append(append([]byte(nil), p...), 0, 0, 0, 0), uint16(min(len(p), 48))) // link padding
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint16) {
		k := min(int(cut), len(b))
		head := append([]byte(nil), b[:k]...) // its own array: a read past it panics
		var ph, pw parsed
		out := parseOut{t: &ph.tuple, s: &ph.seg, outerDst: &ph.outerDst, missing: len(b) - k}
		rh := parseInto(head[:k:k], false, &out)
		ph.kind = out.kind
		rw := parse(b, false, &pw)
		switch {
		case rh >= NumReasons:
			t.Fatalf("reason out of range: %d", rh)
		case rh == ReasonNone && (rw != ReasonNone || ph != pw):
			t.Fatalf("head of %d of %d bytes: %+v, whole packet %v %+v", k, len(b), ph, rw, pw)
		case rh != ReasonNone && rh != rw && rh != ReasonTruncated && rh != ReasonICMPBadInner:
			t.Fatalf("head of %d of %d bytes: %v, whole packet %v", k, len(b), rh, rw)
		}
		if k == len(b) && (rh != rw || ph != pw) {
			t.Fatalf("whole head: %v %+v, parse: %v %+v", rh, ph, rw, pw)
		}
	})
}

// fuzzFlows are the flows FuzzClassify programs talk about.
var fuzzFlows = []struct {
	proto Protocol
	c, s  netip.AddrPort
}{
	{TCP, client4, service4},
	{TCP, netip.MustParseAddrPort("10.0.0.2:4000"), service4},
	{TCP, client6, service6},
	{UDP, netip.MustParseAddrPort("10.0.0.3:5353"), netip.MustParseAddrPort("10.96.0.10:53")},
}

// FuzzClassify runs a program of packets through a small table. The program
// mixes raw bytes with packets built for the four flows from fuzzed flags,
// sequence and acknowledgement offsets, payload sizes and windows (so the
// fuzzer reaches deep into the TCP state machine instead of stopping at the
// checksum), clock steps, sweeps, deletions and ICMP errors. After every step
// the Result must be consistent and the table's invariants must hold.
func FuzzClassify(f *testing.F) {
	for _, c := range classifySeeds {
		f.Add(c.prog, c.liberal)
	}
	for _, p := range seedPackets() {
		f.Add(append([]byte{1, 0x00, byte(len(p))}, p...), false)
	}
	f.Fuzz(func(t *testing.T, prog []byte, liberal bool) {
		runProgram(t, prog, liberal)
	})
}

// runProgram interprets a FuzzClassify program (see there) and returns the
// table's final Stats.
func runProgram(t testing.TB, prog []byte, liberal bool) Stats {
	if len(prog) == 0 {
		return Stats{}
	}
	skip := prog[0]&1 != 0
	prog = prog[1:]
	clk := NewManualClock(int64(time.Hour))
	removed := 0
	tab, err := NewTable(Config{
		Max: 3, Shards: 2, Liberal: liberal, SkipChecksums: skip, Clock: clk,
		OnRemove: func(EntryInfo, RemoveReason) { removed++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	next := make([][2]uint32, len(fuzzFlows))
	for i := range next {
		next[i] = [2]uint32{uint32(i) << 28, 0x80000000 | uint32(i)<<24}
	}
	var invalid, unsupported uint64 // verdicts seen, to hold against Stats
	count := func(r Result) {
		switch {
		case r.Verdict != Invalid:
		case r.Reason.Unsupported():
			unsupported++
		default:
			invalid++
		}
	}
	take := func(n int) []byte {
		if n > len(prog) {
			n = len(prog)
		}
		b := prog[:n]
		prog = prog[n:]
		return b
	}
	for len(prog) > 0 {
		op := take(1)[0]
		var pkt []byte
		dir := Direction(op >> 4 & 1)
		switch op & 7 {
		case 0: // raw bytes
			n := take(1)
			if len(n) == 0 {
				return tab.Stats()
			}
			pkt = take(int(n[0]))
		case 1, 2, 3, 4: // a built segment or datagram
			a := take(6)
			if len(a) < 6 {
				return tab.Stats()
			}
			fi := int(op>>3&1) | int(op>>5&1)<<1
			fl := fuzzFlows[fi]
			src, dst := fl.c, fl.s
			if a[0]&1 == 1 {
				dir = Reply
				src, dst = dst, src
			} else {
				dir = Original
			}
			if fl.proto == UDP {
				pkt = udpPacket(src, dst, int(a[4]), ipOpts{})
				break
			}
			seq := next[fi][dir] + uint32(int32(int8(a[2]))*int32(a[5]&0x3f+1)*64)
			ack := next[fi][1-dir] + uint32(int32(int8(a[3]))*16)
			var opts []byte
			switch a[5] >> 6 {
			case 1:
				opts = cat(tcpOptWScale(a[5]&15), tcpOptSackPerm())
			case 2:
				opts = tcpOptSack([2]uint32{ack, ack + uint32(a[4])*8})
			case 3:
				opts = tcpOptTimestamps(uint32(a[4]), 0)
			}
			s := tcpSeg{src: src, dst: dst, flags: a[1], seq: seq, ack: ack,
				win: uint16(a[4])<<8 | 0xff, payload: int(a[4]) % 97, opts: opts}
			if a[1]&flagACK == 0 {
				s.ack = 0
			}
			pkt = tcpPacket(s)
			// Advance like a sender would; the table decides if it agrees.
			n := uint32(s.payload)
			if a[1]&flagSYN != 0 {
				n++
			}
			if a[1]&flagFIN != 0 {
				n++
			}
			if seq == next[fi][dir] {
				next[fi][dir] += n
			}
		case 5: // time passes
			a := take(1)
			if len(a) == 0 {
				return tab.Stats()
			}
			unit := []time.Duration{time.Millisecond, time.Second, 10 * time.Second, 10 * time.Minute}[op>>3&3]
			clk.Advance(time.Duration(a[0]) * unit)
			continue
		case 6: // housekeeping
			switch op >> 3 & 3 {
			case 0:
				tab.Sweep()
			case 1:
				tab.Delete(Filter{Protocol: UDP})
			case 2:
				for _, e := range tab.List(Filter{}) {
					if _, err := e.AppendText(nil); err != nil || e.Timeout <= 0 {
						t.Fatalf("listed %v", e)
					}
				}
			case 3:
				fl := fuzzFlows[int(op>>5&3)]
				tab.Bind(MakeTuple(fl.proto, fl.c, fl.s), &Binding{Endpoint: pod4, ServicePort: "ns/svc:port"})
			}
			if err := tab.check(); err != nil {
				t.Fatal(err)
			}
			continue
		case 7: // an ICMP error quoting a reply of a flow
			a := take(2)
			if len(a) < 2 {
				return tab.Stats()
			}
			fl := fuzzFlows[int(op>>3&3)]
			var q []byte
			if fl.proto == UDP {
				q = udpPacket(fl.s, fl.c, 4, ipOpts{})
			} else {
				q = tcpPacket(tcpSeg{src: fl.s, dst: fl.c, flags: flagACK, win: 1})
			}
			pkt = icmpError(fl.c.Addr(), fl.s.Addr(), a[0]%20, 0, q, int(a[1]))
			dir = Original
		}
		r := tab.Classify(pkt, dir)
		checkResult(t, r, dir)
		count(r)
		if r.Verdict == New && op&0x80 == 0 { // bit 7 set: the admission function says no
			before := r
			err := tab.Confirm(&r)
			if err != nil && err != ErrTableFull {
				t.Fatalf("Confirm: %v", err)
			}
			if err == nil {
				checkResult(t, r, dir)
				count(r)
			} else if r != before {
				t.Fatal("a refused Confirm changed the result")
			}
		}
		if err := tab.check(); err != nil {
			t.Fatalf("after %v %v: %v", dir, r.Verdict, err)
		}
	}
	s := tab.Stats()
	if got := s.Expired + s.Evicted + s.Deleted + s.Killed; got != uint64(removed) || s.Inserted != uint64(s.Entries)+got {
		t.Fatalf("removals %d, OnRemove %d, stats %+v", got, removed, s)
	}
	if s.InvalidTotal != invalid || s.UnsupportedTotal != unsupported {
		t.Fatalf("INVALID verdicts %d, unsupported %d; Stats counted %d and %d", invalid, unsupported, s.InvalidTotal, s.UnsupportedTotal)
	}
	return s
}

// Program encoding helpers for the seeds. A program starts with one byte
// whose low bit turns checksum verification off.
func seg(flowIdx int, dir Direction, flags uint8, seqDelta int8, length, opts byte) []byte {
	op := byte(1) | byte(flowIdx&1)<<3 | byte(flowIdx>>1)<<5
	return []byte{op, byte(dir), flags, byte(seqDelta), 0, length, opts}
}
func wait(seconds byte) []byte     { return []byte{0x0d, seconds} }
func icmpAbout(flowIdx int) []byte { return []byte{0x07 | byte(flowIdx)<<3, 3, 28} }

const opSweep = 0x06

var classifySeeds = []struct {
	name    string
	prog    []byte
	liberal bool
	check   func(Stats) bool
}{
	{"tcp_lifecycle", cat([]byte{0},
		seg(0, Original, flagSYN, 0, 0, 0), seg(0, Reply, flagSYN|flagACK, 0, 0, 0), seg(0, Original, flagACK, 0, 0, 0),
		seg(0, Original, flagACK|flagPSH, 0, 100, 0), seg(0, Reply, flagACK, 0, 0, 0),
		seg(0, Original, flagFIN|flagACK, 0, 0, 0), seg(0, Reply, flagACK, 0, 0, 0),
		seg(0, Reply, flagFIN|flagACK, 0, 0, 0), seg(0, Original, flagACK, 0, 0, 0),
		wait(130), []byte{opSweep}), false,
		func(s Stats) bool { return s.Inserted == 1 && s.InvalidTotal == 0 && s.Expired == 1 && s.Entries == 0 }},
	{"udp_stream", cat([]byte{0},
		seg(3, Original, 0, 0, 9, 0), seg(3, Reply, 0, 0, 9, 0), wait(3), seg(3, Original, 0, 0, 9, 0),
		icmpAbout(3), []byte{opSweep}), false,
		func(s Stats) bool { return s.Inserted == 1 && s.Related == 1 && s.Entries == 1 && s.InvalidTotal == 0 }},
	{"tcp_reset_reopen", cat([]byte{1},
		seg(1, Original, flagSYN, 0, 0, 0), seg(1, Reply, flagSYN|flagACK, 0, 0, 0), seg(1, Original, flagACK, 0, 0, 0),
		seg(1, Original, flagRST, 0, 0, 0), seg(1, Original, flagSYN, 5, 0, 0)), false,
		func(s Stats) bool { return s.Inserted == 2 && s.Killed == 1 && s.InvalidTotal == 0 }},
	{"window_strict", cat([]byte{1},
		seg(0, Original, flagSYN, 0, 0, 0x41), seg(0, Reply, flagSYN|flagACK, 0, 0, 0x47), seg(0, Original, flagACK, 0, 0, 0),
		seg(0, Original, flagACK, 100, 50, 0x3f), seg(0, Original, flagRST, -128, 0, 1)), false,
		func(s Stats) bool { return s.Invalid[ReasonOutOfWindow] == 2 }},
	{"window_liberal", cat([]byte{1},
		seg(0, Original, flagSYN, 0, 0, 0x41), seg(0, Reply, flagSYN|flagACK, 0, 0, 0x47), seg(0, Original, flagACK, 0, 0, 0),
		seg(0, Original, flagACK, 100, 50, 0x3f), seg(0, Original, flagRST, -128, 0, 1)), true,
		func(s Stats) bool { return s.Invalid[ReasonOutOfWindow] == 1 }},
	{"table_full", cat([]byte{1},
		seg(0, Original, flagSYN, 0, 0, 0), seg(0, Reply, flagSYN|flagACK, 0, 0, 0), seg(0, Original, flagACK, 0, 0, 0),
		seg(1, Original, flagSYN, 0, 0, 0), seg(1, Reply, flagSYN|flagACK, 0, 0, 0), seg(1, Original, flagACK, 0, 0, 0),
		seg(2, Original, flagSYN, 0, 0, 0), seg(3, Original, 0, 0, 1, 0),
		seg(3, Reply, 0, 0, 1, 0), wait(3), seg(3, Original, 0, 0, 1, 0), seg(2, Original, flagSYN, 0, 0, 0)), false,
		func(s Stats) bool { return s.Evicted == 1 && s.TableFull == 1 && s.Entries == 3 }},
}

// TestClassifySeeds runs the FuzzClassify seeds as plain tests and checks
// that each does what its name says, so the corpus stays meaningful.
func TestClassifySeeds(t *testing.T) {
	for _, c := range classifySeeds {
		t.Run(c.name, func(t *testing.T) {
			if s := runProgram(t, c.prog, c.liberal); !c.check(s) {
				t.Errorf("stats %+v", s)
			}
		})
	}
}

// TestWriteFuzzCorpus regenerates the committed seed corpus under
// testdata/fuzz when CONNTRACK_WRITE_CORPUS is set; otherwise it checks the
// corpus is there.
func TestWriteFuzzCorpus(t *testing.T) {
	write := os.Getenv("CONNTRACK_WRITE_CORPUS") != ""
	dirs := map[string][][]any{"FuzzParse": nil, "FuzzClassify": nil}
	names := []string{"tcp4_syn_options", "tcp4_data", "tcp4_sack", "tcp6_syn_ecn", "tcp6_exthdr",
		"udp4", "udp6", "icmp4_unreach", "icmp6_too_big", "icmp4_echo", "ipv4_options"}
	for _, p := range seedPackets() {
		dirs["FuzzParse"] = append(dirs["FuzzParse"], []any{p})
	}
	for _, c := range classifySeeds {
		dirs["FuzzClassify"] = append(dirs["FuzzClassify"], []any{c.prog, c.liberal})
	}
	var classifyNames []string
	for _, c := range classifySeeds {
		classifyNames = append(classifyNames, c.name)
	}
	for dir, entries := range dirs {
		path := filepath.Join("testdata", "fuzz", dir)
		for i, args := range entries {
			name := classifyNames
			if dir == "FuzzParse" {
				name = names
			}
			file := filepath.Join(path, name[i])
			if !write {
				if _, err := os.Stat(file); err != nil {
					t.Errorf("seed corpus file missing (set CONNTRACK_WRITE_CORPUS=1 to write it): %v", err)
				}
				continue
			}
			text := "go test fuzz v1\n"
			for _, a := range args {
				switch v := a.(type) {
				case []byte:
					text += fmt.Sprintf("[]byte(%q)\n", v)
				case bool:
					text += fmt.Sprintf("bool(%v)\n", v)
				}
			}
			if err := os.MkdirAll(path, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// fuzzRef is the payload every built fragment of FuzzReassemble carries a
// slice of: byte i of any datagram's payload is fuzzRef[i].
var fuzzRef = func() []byte {
	b := make([]byte, 1<<17)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}()

// FuzzReassemble runs a program of fragments through a small Reassembler:
// fragments built from fuzzed families, IDs, offsets, lengths, MF and ECN
// bits for two source addresses, raw packets (from a third address, so that
// they cannot meet the built ones), clock steps and sweeps. After every step
// the invariants hold (every fragment delivered, dropped or held exactly
// once; the bounds), and every datagram that comes out of built fragments is
// a well-formed IP packet carrying fuzzRef's bytes from 0.
func FuzzReassemble(f *testing.F) {
	frag := func(v6, more bool, id, ecn byte, off8 uint16, len8 byte, odd byte) []byte {
		op := byte(1)
		if v6 {
			op |= 0x08
		}
		if more {
			op |= 0x10
		}
		return []byte{op, id | ecn<<2, byte(off8 >> 8), byte(off8), len8, odd}
	}
	f.Add(cat(frag(false, true, 0, 0, 0, 100, 0), frag(false, false, 0, 0, 100, 50, 3)))
	f.Add(cat(frag(true, false, 1, 0, 50, 20, 0), frag(true, true, 1, 0, 0, 50, 0)))
	f.Add(cat(frag(false, true, 2, 2, 0, 20, 0), frag(false, true, 2, 3, 10, 20, 0), frag(false, false, 2, 2, 20, 1, 0)))
	f.Add(cat(frag(true, true, 3, 0, 0, 20, 0), frag(true, true, 3, 0, 10, 20, 0), frag(true, false, 3, 0, 30, 2, 4)))
	f.Add(cat(frag(false, true, 0, 0, 0, 10, 0), []byte{0x05, 40}, frag(false, false, 0, 0, 10, 10, 0), []byte{0x06}))
	for _, p := range seedPackets() {
		f.Add(append([]byte{0x00, byte(len(p))}, p...))
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		clk := NewManualClock(int64(time.Hour))
		r, err := NewReassembler(ReassemblyConfig{Clock: clk, MaxBytes: 20000, MaxQueues: 3, MaxFragments: 12})
		if err != nil {
			t.Fatal(err)
		}
		take := func(n int) []byte {
			n = min(n, len(prog))
			b := prog[:n]
			prog = prog[n:]
			return b
		}
		buf := make([]byte, 0, 1<<16+64)
		for len(prog) > 0 {
			op := take(1)[0]
			var pkt []byte
			built := false
			switch op & 7 {
			case 0, 7: // raw bytes, from an address no built fragment uses
				n := take(1)
				if len(n) == 0 {
					return
				}
				pkt = append([]byte(nil), take(int(n[0])*int(op>>3+1))...)
				switch {
				case len(pkt) >= 20 && pkt[0]>>4 == 4:
					pkt[12] = 0xee
					if int(pkt[0]&0x0f)*4 <= len(pkt) && pkt[0]&0x0f >= 5 {
						fix4(pkt)
					}
				case len(pkt) >= 40 && pkt[0]>>4 == 6:
					pkt[8] = 0xee
				}
			case 1, 2, 3, 4: // a built fragment
				a := take(5)
				if len(a) < 5 {
					return
				}
				v6, more := op&0x08 != 0, op&0x10 != 0
				src := []netip.Addr{client4.Addr(), netip.MustParseAddr("10.0.0.2")}[op>>5&1]
				dst := service4.Addr()
				if v6 {
					src = []netip.Addr{client6.Addr(), netip.MustParseAddr("fd00::2")}[op>>5&1]
					dst = service6.Addr()
				}
				id, ecn := a[0]&3, a[0]>>2&3
				off := int(binary.BigEndian.Uint16(a[1:3])&0x1fff) * 8
				n := int(a[3])*8 + int(a[4]&7)
				end := min(off+n, len(fuzzRef))
				payload := fuzzRef[min(off, end):end]
				if v6 {
					pkt = frag6(src, dst, uint32(id), 17, off, more, ecn, nil, 0, payload)
				} else {
					pkt = frag4(src, dst, 17, uint16(id), off, more, ecn, payload)
				}
				built = v6 || off != 0 || more // IPv4 at offset 0 without MF is no fragment
			case 5: // time passes
				a := take(1)
				if len(a) == 0 {
					return
				}
				clk.Advance(time.Duration(a[0]) * time.Second)
				continue
			case 6:
				r.Sweep()
				if err := r.check(); err != nil {
					t.Fatal(err)
				}
				continue
			}
			before := r.Stats()
			out, v, d := r.Add(pkt, buf)
			if err := r.check(); err != nil {
				t.Fatalf("after %v/%v: %v", v, d, err)
			}
			after := r.Stats()
			switch {
			case v > FragmentDropped || d >= NumFragmentDrops:
				t.Fatalf("out of range: %v %v", v, d)
			case (v == FragmentDropped) != (d != FragmentDropNone):
				t.Fatalf("verdict %v with drop %v", v, d)
			case (v == FragmentComplete) != (out != nil):
				t.Fatalf("verdict %v with %d bytes out", v, len(out))
			case v == NotFragment && after.Fragments != before.Fragments,
				v != NotFragment && after.Fragments != before.Fragments+1:
				t.Fatalf("%v counted %d fragments", v, after.Fragments-before.Fragments)
			case v == NotFragment && built:
				t.Fatalf("a built fragment came back NotFragment: %x", pkt)
			}
			if v == FragmentComplete {
				checkDatagram(t, out, built)
			}
		}
	})
}

// checkDatagram asserts that out, a datagram the Reassembler built, is a
// whole IPv4 or IPv6 packet; when built is set, one of FuzzReassemble's, that
// it is no fragment and that its payload is fuzzRef's first bytes. (An IPv6
// datagram of raw fragments may hold another Fragment header: Classify
// refuses it.)
func checkDatagram(t *testing.T, out []byte, built bool) {
	t.Helper()
	if IsFragment(out) && (built || out[0]>>4 == 4) {
		t.Fatalf("the datagram is still a fragment: %x", out[:min(len(out), 64)])
	}
	var payload []byte
	switch {
	case len(out) >= 20 && out[0]>>4 == 4:
		ihl := int(out[0]&0x0f) * 4
		if int(binary.BigEndian.Uint16(out[2:4])) != len(out) || refChecksum(out[:ihl]) != 0 {
			t.Fatalf("bad IPv4 header: %x", out[:ihl])
		}
		payload = out[ihl:]
	case len(out) >= 40 && out[0]>>4 == 6:
		if int(binary.BigEndian.Uint16(out[4:6])) != len(out)-40 {
			t.Fatalf("bad IPv6 payload length: %x", out[:40])
		}
		payload = out[40:]
	default:
		t.Fatalf("not an IP packet: %x", out[:min(len(out), 64)])
	}
	if built && !bytes.Equal(payload, fuzzRef[:len(payload)]) {
		t.Fatalf("reassembled payload of %d bytes differs from the fragments'", len(payload))
	}
}

package conntrack

import (
	"net/netip"
	"testing"
)

// benchTable builds a table with the given clock (nil: the system clock).
func benchTable(b *testing.B, clk Clock) *Table {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Clock = clk
	tab, err := NewTable(cfg)
	if err != nil {
		b.Fatal(err)
	}
	return tab
}

// establishedFlow returns a table holding one ESTABLISHED connection between
// c and s, and the flow to build its segments.
func establishedFlow(b *testing.B, clk Clock, c, s netip.AddrPort) (*Table, *flow) {
	tab := benchTable(b, clk)
	f := newFlow(b, tab, nil, c, s)
	f.synOpt = [2][]byte{cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(1, 0), tcpOptWScale(7)),
		cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(2, 1), tcpOptWScale(7))}
	f.handshake()
	return tab, f
}

func benchClassify(b *testing.B, tab *Table, pkt []byte, dir Direction, want Verdict) {
	b.Helper()
	if r := tab.Classify(pkt, dir); r.Verdict != want {
		b.Fatalf("verdict %v (%v), want %v", r.Verdict, r.Reason, want)
	}
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tab.Classify(pkt, dir)
	}
}

// BenchmarkClassifyEstablished is the gate's fast path: a segment of an
// ESTABLISHED connection. "ack" is a client ACK with timestamps (52 bytes of
// IPv4, checksum verified); "data" a 1400-byte payload, in each direction
// (the Reply direction is not checksummed). "coarse" uses a CoarseClock
// instead of reading the system clock per packet.
func BenchmarkClassifyEstablished(b *testing.B) {
	for _, v := range []struct {
		name    string
		c, s    netip.AddrPort
		dir     Direction
		payload int
		coarse  bool
	}{
		{"tcp4/ack/original", client4, service4, Original, 0, false},
		{"tcp4/ack/original/coarse", client4, service4, Original, 0, true},
		{"tcp4/data1400/reply", client4, service4, Reply, 1400, false},
		{"tcp4/data1400/original", client4, service4, Original, 1400, false},
		{"tcp6/ack/original", client6, service6, Original, 0, false},
		{"tcp6/ack/original/coarse", client6, service6, Original, 0, true},
		{"tcp6/data1400/reply", client6, service6, Reply, 1400, false},
	} {
		b.Run(v.name, func(b *testing.B) {
			var clk Clock
			if v.coarse {
				cc := NewCoarseClock()
				cc.Tick()
				clk = cc
			}
			tab, f := establishedFlow(b, clk, v.c, v.s)
			s := f.seg(v.dir, flagACK|flagPSH, v.payload)
			if v.payload == 0 {
				s.flags = flagACK
			}
			s.opts = tcpOptTimestamps(100, 200)
			benchClassify(b, tab, tcpPacket(s), v.dir, Established)
		})
	}
}

// BenchmarkClassifySYN classifies a SYN with no entry: the work before the
// gate asks the admission function. Nothing is inserted.
func BenchmarkClassifySYN(b *testing.B) {
	for _, v := range []struct {
		name string
		c, s netip.AddrPort
	}{{"tcp4", client4, service4}, {"tcp6", client6, service6}} {
		b.Run(v.name, func(b *testing.B) {
			tab := benchTable(b, nil)
			syn := tcpPacket(tcpSeg{src: v.c, dst: v.s, flags: flagSYN, seq: 1, win: 64240,
				opts: cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(1, 0), tcpOptWScale(7))})
			benchClassify(b, tab, syn, Original, New)
		})
	}
}

// BenchmarkNewFlow classifies and confirms a SYN of a new connection each
// time (distinct client ports and addresses), with the table emptied outside
// the timer every 65536 flows.
func BenchmarkNewFlow(b *testing.B) {
	for _, v6 := range []bool{false, true} {
		name := "tcp4"
		if v6 {
			name = "tcp6"
		}
		b.Run(name, func(b *testing.B) {
			tab := benchTable(b, nil)
			const batch = 1 << 16
			pkts := make([][]byte, batch)
			for i := range pkts {
				c, s := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 40000), service4
				if v6 {
					a := client6.Addr().As16()
					a[14], a[15] = byte(i>>8), byte(i)
					c, s = netip.AddrPortFrom(netip.AddrFrom16(a), 40000), service6
				}
				pkts[i] = tcpPacket(tcpSeg{src: c, dst: s, flags: flagSYN, seq: uint32(i), win: 64240,
					opts: cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(1, 0), tcpOptWScale(7))})
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if i == batch {
					b.StopTimer()
					tab.Delete(Filter{})
					i = 0
					b.StartTimer()
				}
				r := tab.Classify(pkts[i], Original)
				if r.Verdict != New || tab.Confirm(&r) != nil {
					b.Fatalf("flow %d: %v", i, r.Verdict)
				}
				i++
			}
		})
	}
}

// BenchmarkList100k lists a table of 100,000 entries.
func BenchmarkList100k(b *testing.B) {
	tab := benchTable(b, nil)
	for i := range 100000 {
		c := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, byte(i >> 8), byte(i)}), uint16(1024+i%50000))
		r := tab.Classify(udpPacket(c, netip.MustParseAddrPort("10.96.0.10:53"), 20, ipOpts{}), Original)
		if err := tab.Confirm(&r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if n := len(tab.List(Filter{})); n != 100000 {
			b.Fatalf("listed %d", n)
		}
	}
}

// BenchmarkClassifyParallel: ESTABLISHED ACKs from every P, each on its own
// connection, to show the cost of sharing the table.
func BenchmarkClassifyParallel(b *testing.B) {
	tab := benchTable(b, nil)
	ch := make(chan []byte, 64)
	for i := range 64 {
		c := netip.AddrPortFrom(client4.Addr(), uint16(10000+i))
		f := newFlow(b, tab, nil, c, service4)
		f.handshake()
		ch <- tcpPacket(f.seg(Original, flagACK, 0))
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		pkt := <-ch
		for pb.Next() {
			tab.Classify(pkt, Original)
		}
	})
}

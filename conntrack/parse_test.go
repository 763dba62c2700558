package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// corrupt returns a copy of b with byte off inverted.
func corrupt(b []byte, off int) []byte {
	c := append([]byte(nil), b...)
	c[off] ^= 0xff
	return c
}

// fix4 recomputes the IPv4 header checksum of b in place and returns b.
func fix4(b []byte) []byte {
	hl := int(b[0]&0x0f) * 4
	b[10], b[11] = 0, 0
	binary.BigEndian.PutUint16(b[10:], refChecksum(b[:hl]))
	return b
}

// setField returns a copy of b with the 16-bit field at off set to v.
func setField(b []byte, off int, v uint16) []byte {
	c := append([]byte(nil), b...)
	binary.BigEndian.PutUint16(c[off:], v)
	return c
}

func syn4(flags uint8) []byte {
	return tcpPacket(tcpSeg{src: client4, dst: service4, flags: flags, seq: 1000, win: 65535})
}

// extHeader builds an IPv6 extension header of 8*(1+len8) bytes.
func extHeader(next uint8, len8 int) []byte {
	h := make([]byte, 8*(1+len8))
	h[0] = next
	h[1] = byte(len8)
	return h // the rest is Pad1 options
}

// TestClassifyVectors is the table of INVALID packets and of valid edge
// cases. Every case runs on a fresh table; setup may establish flows first.
func TestClassifyVectors(t *testing.T) {
	tcp6 := func(flags uint8) []byte {
		return tcpPacket(tcpSeg{src: client6, dst: service6, flags: flags, seq: 1000, win: 65535})
	}
	udp4 := udpPacket(client4, service4, 20, ipOpts{})
	udp6 := udpPacket(client6, service6, 20, ipOpts{})
	routing := func(segLeft byte) []byte {
		h := extHeader(nhTCP, 0)
		h[2], h[3] = 0, segLeft
		return h
	}
	tcpWithExt := func(first uint8, ext []byte) []byte {
		return tcpPacket(tcpSeg{src: client6, dst: service6, flags: flagSYN, seq: 1, win: 1000,
			ip: ipOpts{extHeaders: ext, extFirst: first}})
	}
	// A TCP segment from a client whose options announce a data offset of
	// 15 words in a 20-byte header.
	longDoff := tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, doff: 15})
	shortDoff := tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, doff: 4})
	fullSyn := syn4(flagSYN)
	type vec struct {
		name   string
		setup  func(*flow)
		pkt    []byte
		dir    Direction
		want   Verdict
		reason Reason
		proto  Protocol // the protocol counted in Stats.Unsupported, for the Unsupported reasons
		mod    func(*Config)
	}
	established := func(f *flow) { f.handshake() }
	vecs := []vec{
		// No entry.
		{name: "stray ACK", pkt: syn4(flagACK), want: Invalid, reason: ReasonNoEntryNotSYN},
		{name: "stray ACK v6", pkt: tcp6(flagACK), want: Invalid, reason: ReasonNoEntryNotSYN},
		{name: "stray FIN+ACK", pkt: syn4(flagFIN | flagACK), want: Invalid, reason: ReasonNoEntryNotSYN},
		{name: "stray RST", pkt: syn4(flagRST), want: Invalid, reason: ReasonNoEntryNotSYN},
		{name: "stray RST+ACK", pkt: syn4(flagRST | flagACK), want: Invalid, reason: ReasonNoEntryNotSYN},
		{name: "stray SYN+ACK from the client", pkt: syn4(flagSYN | flagACK), want: Invalid, reason: ReasonNoEntryNotSYN},
		{name: "reply without entry", pkt: tcpPacket(tcpSeg{src: service4, dst: client4, flags: flagSYN | flagACK, seq: 1, ack: 1001, win: 1}), dir: Reply, want: Invalid, reason: ReasonNoEntryReply},
		{name: "udp reply without entry", pkt: udpPacket(service4, client4, 10, ipOpts{}), dir: Reply, want: Invalid, reason: ReasonNoEntryReply},
		// Flags.
		{name: "SYN+FIN", pkt: syn4(flagSYN | flagFIN), want: Invalid, reason: ReasonBadTCPFlags},
		{name: "SYN+RST", pkt: syn4(flagSYN | flagRST), want: Invalid, reason: ReasonBadTCPFlags},
		{name: "no flags", pkt: syn4(0), want: Invalid, reason: ReasonBadTCPFlags},
		{name: "PSH only", pkt: syn4(flagPSH), want: Invalid, reason: ReasonBadTCPFlags},
		{name: "FIN without ACK", pkt: syn4(flagFIN), want: Invalid, reason: ReasonBadTCPFlags},
		{name: "xmas", pkt: syn4(0xff), want: Invalid, reason: ReasonBadTCPFlags},
		{name: "SYN+FIN on a tracked flow", setup: established, pkt: syn4(flagSYN | flagFIN), want: Invalid, reason: ReasonBadTCPFlags},
		// Header lengths.
		{name: "data offset below 5", pkt: shortDoff, want: Invalid, reason: ReasonBadDataOffset},
		{name: "data offset beyond the segment", pkt: longDoff, want: Invalid, reason: ReasonBadDataOffset},
		{name: "empty", pkt: nil, want: Invalid, reason: ReasonTruncated},
		{name: "truncated IPv4 header", pkt: fullSyn[:12], want: Invalid, reason: ReasonTruncated},
		{name: "truncated TCP header", pkt: fix4(setField(fullSyn[:30], 2, 30)), want: Invalid, reason: ReasonTruncated},
		{name: "truncated IPv6 header", pkt: tcp6(flagSYN)[:30], want: Invalid, reason: ReasonTruncated},
		{name: "truncated UDP header", pkt: fix4(setField(udp4[:24], 2, 24)), want: Invalid, reason: ReasonTruncated},
		{name: "IPv4 total length beyond buffer", pkt: fullSyn[:len(fullSyn)-1], want: Invalid, reason: ReasonBadLength},
		{name: "IPv6 payload length beyond buffer", pkt: tcp6(flagSYN)[:59], want: Invalid, reason: ReasonBadLength},
		{name: "UDP length beyond payload", pkt: setField(udp4, 24, 29), want: Invalid, reason: ReasonBadLength},
		{name: "UDP length below 8", pkt: setField(udp4, 24, 7), want: Invalid, reason: ReasonBadLength},
		{name: "IPv4 IHL below 5", pkt: append([]byte{0x44}, fullSyn[1:]...), want: Invalid, reason: ReasonBadIPHeader},
		{name: "IPv4 total length below header", pkt: setField(fullSyn, 2, 19), want: Invalid, reason: ReasonBadIPHeader},
		{name: "IP version 5", pkt: append([]byte{0x55}, fullSyn[1:]...), want: Invalid, reason: ReasonBadIPHeader},
		// Checksums.
		{name: "bad TCP checksum", pkt: corrupt(fullSyn, 36), want: Invalid, reason: ReasonBadChecksum},
		{name: "bad TCP checksum v6", pkt: corrupt(tcp6(flagSYN), 56), want: Invalid, reason: ReasonBadChecksum},
		{name: "bad UDP checksum", pkt: corrupt(udp4, 30), want: Invalid, reason: ReasonBadChecksum},
		{name: "bad UDP checksum v6", pkt: corrupt(udp6, 50), want: Invalid, reason: ReasonBadChecksum},
		{name: "zero UDP checksum v6", pkt: setField(udp6, 46, 0), want: Invalid, reason: ReasonBadChecksum},
		{name: "bad IPv4 header checksum", pkt: corrupt(fullSyn, 10), want: Invalid, reason: ReasonBadChecksum},
		{name: "bad checksum on a tracked flow", setup: established, pkt: corrupt(syn4(flagACK), 39), want: Invalid, reason: ReasonBadChecksum},
		// Fragments and extension headers.
		{name: "IPv4 first fragment", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, ip: ipOpts{fragment: 0x2000}}), want: Invalid, reason: ReasonIPFragment},
		{name: "IPv4 later fragment", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, ip: ipOpts{fragment: 0x0010}}), want: Invalid, reason: ReasonIPFragment},
		{name: "IPv6 fragment header", pkt: tcpWithExt(nhFragment, extHeader(nhTCP, 0)), want: Invalid, reason: ReasonIPFragment},
		{name: "IPv6 AH", pkt: tcpWithExt(51, extHeader(nhTCP, 1)), want: Invalid, reason: ReasonIPv6ExtensionHeader},
		{name: "IPv6 routing with segments left", pkt: tcpWithExt(nhRouting, routing(1)), want: Invalid, reason: ReasonIPv6ExtensionHeader},
		{name: "IPv6 hop-by-hop not first", pkt: tcpWithExt(nhDestOpts, cat(extHeader(nhHopByHop, 0), extHeader(nhTCP, 0))), want: Invalid, reason: ReasonIPv6ExtensionHeader},
		{name: "IPv6 nine destination options", pkt: tcpWithExt(nhDestOpts, cat(
			extHeader(nhDestOpts, 0), extHeader(nhDestOpts, 0), extHeader(nhDestOpts, 0),
			extHeader(nhDestOpts, 0), extHeader(nhDestOpts, 0), extHeader(nhDestOpts, 0),
			extHeader(nhDestOpts, 0), extHeader(nhDestOpts, 0), extHeader(nhTCP, 0))), want: Invalid, reason: ReasonIPv6ExtensionHeader},
		{name: "IPv6 extension header past the payload", pkt: tcpWithExt(nhDestOpts, extHeader(nhTCP, 0))[:44], want: Invalid, reason: ReasonBadLength},
		{name: "IPv6 extension header cut short", pkt: setField(tcpWithExt(nhDestOpts, extHeader(nhTCP, 3))[:44], 4, 4), want: Invalid, reason: ReasonTruncated},
		{name: "IPv6 no next header", pkt: ipPacket(client6.Addr(), service6.Addr(), nhNone, nil, -1, ipOpts{}), want: Invalid, reason: ReasonUnsupportedProtocol, proto: nhNone},
		// Protocols.
		{name: "GRE", pkt: ipPacket(client4.Addr(), service4.Addr(), 47, make([]byte, 8), -1, ipOpts{}), want: Invalid, reason: ReasonUnsupportedProtocol, proto: 47},
		{name: "SCTP v6", pkt: ipPacket(client6.Addr(), service6.Addr(), 132, make([]byte, 12), -1, ipOpts{}), want: Invalid, reason: ReasonUnsupportedProtocol, proto: 132},
		{name: "ICMP echo request", pkt: icmpInfo(client4.Addr(), service4.Addr(), 8), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMP},
		{name: "ICMP timestamp request", pkt: icmpInfo(client4.Addr(), service4.Addr(), 13), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMP},
		{name: "ICMP address mask request", pkt: icmpInfo(client4.Addr(), service4.Addr(), 17), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMP},
		{name: "ICMPv6 echo request", pkt: icmpInfo(client6.Addr(), service6.Addr(), 128), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMPv6},
		{name: "ICMPv6 node information query", pkt: icmpInfo(client6.Addr(), service6.Addr(), 139), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMPv6},
		{name: "ICMPv6 router solicitation", pkt: icmpInfo(client6.Addr(), service6.Addr(), 133), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMPv6},
		{name: "ICMPv6 neighbour solicitation", pkt: icmpInfo(client6.Addr(), service6.Addr(), 135), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMPv6},
		{name: "ICMPv6 MLDv2 report", pkt: icmpInfo(client6.Addr(), service6.Addr(), 143), want: Invalid, reason: ReasonUnsupportedICMP, proto: ICMPv6},
		{name: "ICMP echo reply", pkt: icmpInfo(client4.Addr(), service4.Addr(), 0), want: Invalid, reason: ReasonICMPNoFlow},
		{name: "ICMP router advertisement", pkt: icmpInfo(client4.Addr(), service4.Addr(), 9), want: Invalid, reason: ReasonICMPNoFlow},
		{name: "ICMP type 40", pkt: icmpInfo(client4.Addr(), service4.Addr(), 40), want: Invalid, reason: ReasonICMPNoFlow},
		{name: "ICMPv6 echo reply", pkt: icmpInfo(client6.Addr(), service6.Addr(), 129), want: Invalid, reason: ReasonICMPNoFlow},
		{name: "ICMPv6 redirect", pkt: icmpInfo(client6.Addr(), service6.Addr(), 137), want: Invalid, reason: ReasonICMPNoFlow},
		{name: "bad ICMP checksum", pkt: corrupt(icmpInfo(client4.Addr(), service4.Addr(), 8), 30), want: Invalid, reason: ReasonBadChecksum},
		{name: "short ICMP", pkt: fix4(setField(icmpInfo(client4.Addr(), service4.Addr(), 8)[:26], 2, 26)), want: Invalid, reason: ReasonTruncated},

		// Valid edge cases.
		{name: "SYN", pkt: fullSyn, want: New},
		{name: "SYN v6", pkt: tcp6(flagSYN), want: New},
		{name: "SYN with ECE+CWR", pkt: syn4(flagSYN | flagECE | flagCWR), want: New},
		{name: "SYN+URG", pkt: syn4(flagSYN | flagURG), want: New},
		{name: "SYN+PSH", pkt: syn4(flagSYN | flagPSH), want: New},
		{name: "SYN with data", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, payload: 100}), want: New},
		{name: "SYN with all options", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1,
			opts: cat(tcpOptMSS(1460), tcpOptSackPerm(), tcpOptTimestamps(1, 0), tcpOptWScale(14))}), want: New},
		{name: "SYN with malformed options", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1,
			opts: []byte{3, 1, 7, 0, 5, 200, 0, 0}}), want: New},
		{name: "IPv4 options", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, ip: ipOpts{ipv4Options: []byte{1, 1, 1, 0}}}), want: New},
		{name: "IPv4 DF", pkt: tcpPacket(tcpSeg{src: client4, dst: service4, flags: flagSYN, seq: 1, win: 1, ip: ipOpts{fragment: 0x4000}}), want: New},
		{name: "link padding after the datagram", pkt: append(append([]byte(nil), fullSyn...), 0xde, 0xad, 0xbe, 0xef, 0, 0), want: New},
		{name: "IPv6 hop-by-hop and destination options", pkt: tcpWithExt(nhHopByHop, cat(extHeader(nhDestOpts, 0), extHeader(nhTCP, 1))), want: New},
		{name: "IPv6 exhausted routing header", pkt: tcpWithExt(nhRouting, routing(0)), want: New},
		{name: "UDP", pkt: udp4, want: New},
		{name: "UDP v6", pkt: udp6, want: New},
		{name: "zero UDP checksum v4", pkt: setField(udp4, 26, 0), want: New},
		{name: "UDP length short of the IP payload", pkt: func() []byte {
			// A 28-byte datagram in 48 bytes of IP payload: the checksum
			// covers the 28 bytes, as the receiving stack computes it.
			b := udpPacket(client4, service4, 20, ipOpts{})
			b = append(b, make([]byte, 20)...)
			return fix4(setField(b, 2, uint16(len(b))))
		}(), want: New},
		{name: "SYN+ACK reply", setup: func(f *flow) { f.mustSend(Original, flagSYN, 0) }, pkt: nil, dir: Reply, want: Established},
		{name: "retransmitted SYN", setup: func(f *flow) { f.mustSend(Original, flagSYN, 0) }, pkt: nil, want: Established},
		{name: "RST+ACK", setup: established, pkt: nil, want: Established},
		{name: "bad checksum in the reply direction is not checked", setup: established, pkt: nil, dir: Reply, want: Established},
		{name: "bad checksum with SkipChecksums", pkt: corrupt(fullSyn, 36), want: New, mod: func(c *Config) { c.SkipChecksums = true }},
	}
	// Packets that depend on the flow's sequence numbers are built in setup.
	dynamic := map[string]func(f *flow) []byte{
		"SYN+ACK reply": func(f *flow) []byte { return tcpPacket(f.seg(Reply, flagSYN|flagACK, 0)) },
		"retransmitted SYN": func(f *flow) []byte {
			s := f.seg(Original, flagSYN, 0)
			s.seq--
			return tcpPacket(s)
		},
		"RST+ACK": func(f *flow) []byte { return tcpPacket(f.seg(Original, flagRST|flagACK, 0)) },
		"bad checksum in the reply direction is not checked": func(f *flow) []byte {
			return corrupt(tcpPacket(f.seg(Reply, flagACK|flagPSH, 10)), 45)
		},
	}
	for _, v := range vecs {
		t.Run(v.name, func(t *testing.T) {
			tab, clk := newTestTable(t, v.mod)
			f := newFlow(t, tab, clk, client4, service4)
			if v.setup != nil {
				v.setup(f)
			}
			pkt := v.pkt
			if d, ok := dynamic[v.name]; ok {
				pkt = d(f)
			}
			before := tab.Stats()
			r := tab.Classify(pkt, v.dir)
			if r.Verdict != v.want || r.Reason != v.reason {
				t.Fatalf("got %v/%v, want %v/%v", r.Verdict, r.Reason, v.want, v.reason)
			}
			after := tab.Stats()
			if v.reason.Unsupported() {
				// Not INVALID: counted apart, under the protocol.
				if after.InvalidTotal != before.InvalidTotal || after.Invalid[v.reason] != 0 {
					t.Errorf("an unsupported packet counted as INVALID: InvalidTotal %d -> %d", before.InvalidTotal, after.InvalidTotal)
				}
				if got := after.UnsupportedTotal - before.UnsupportedTotal; got != 1 {
					t.Errorf("UnsupportedTotal grew by %d, want 1", got)
				}
				if got := after.Unsupported[v.proto] - before.Unsupported[v.proto]; got != 1 {
					t.Errorf("Unsupported[%v] grew by %d, want 1", v.proto, got)
				}
			} else if v.want == Invalid {
				if got := after.Invalid[v.reason] - before.Invalid[v.reason]; got != 1 {
					t.Errorf("Stats.Invalid[%v] grew by %d, want 1", v.reason, got)
				}
				if after.InvalidTotal-before.InvalidTotal != 1 {
					t.Errorf("InvalidTotal grew by %d", after.InvalidTotal-before.InvalidTotal)
				}
			} else if after.InvalidTotal != before.InvalidTotal {
				t.Errorf("InvalidTotal grew on a valid packet")
			}
			if v.want == New {
				if after.Entries != before.Entries {
					t.Error("Classify inserted an entry")
				}
				if err := tab.Confirm(&r); err != nil || r.Verdict != New {
					t.Fatalf("Confirm: %v, verdict %v", err, r.Verdict)
				}
				if tab.Stats().Entries != before.Entries+1 {
					t.Error("Confirm did not insert")
				}
			}
		})
	}
}

// TestClassifyTrusted: ClassifyTrusted skips the checksums, and only them,
// for packets the kernel vouched for (nf_ip_checksum trusts CHECKSUM_PARTIAL
// and CHECKSUM_UNNECESSARY skbs the same way); Classify still refuses them.
func TestClassifyTrusted(t *testing.T) {
	fullSyn := syn4(flagSYN)
	syn6 := tcpPacket(tcpSeg{src: client6, dst: service6, flags: flagSYN, seq: 1000, win: 65535})
	udp4 := udpPacket(client4, service4, 20, ipOpts{})
	for _, v := range []struct {
		name    string
		pkt     []byte
		trusted Verdict // ClassifyTrusted's verdict; Classify's is INVALID
		reason  Reason  // Classify's reason, and ClassifyTrusted's when it is INVALID too
	}{
		{"bad TCP checksum", corrupt(fullSyn, 36), New, ReasonBadChecksum},
		{"bad TCP checksum v6", corrupt(syn6, 56), New, ReasonBadChecksum},
		{"bad UDP checksum", corrupt(udp4, 30), New, ReasonBadChecksum},
		{"bad IPv4 header checksum", corrupt(fullSyn, 10), New, ReasonBadChecksum},
		{"SYN+FIN", syn4(flagSYN | flagFIN), Invalid, ReasonBadTCPFlags},
		{"truncated TCP header", fix4(setField(fullSyn[:30], 2, 30)), Invalid, ReasonTruncated},
	} {
		t.Run(v.name, func(t *testing.T) {
			tab, _ := newTestTable(t, nil)
			if r := tab.Classify(v.pkt, Original); r.Verdict != Invalid || r.Reason != v.reason {
				t.Errorf("Classify: %v/%v, want INVALID/%v", r.Verdict, r.Reason, v.reason)
			}
			r := tab.ClassifyTrusted(v.pkt, Original)
			want := ReasonNone
			if v.trusted == Invalid {
				want = v.reason
			}
			if r.Verdict != v.trusted || r.Reason != want {
				t.Errorf("ClassifyTrusted: %v/%v, want %v/%v", r.Verdict, r.Reason, v.trusted, want)
			}
		})
	}
}

// TestClassifyHead: a packet classified from its headers and its size gets
// what ClassifyTrusted gives the whole packet. Two tables follow one flow in
// lockstep, one given whole packets, the other heads; the flow's window
// tracking depends on every payload's length (the client's ACKs of 60,000
// bytes are in the window only if those bytes were counted), and so do the
// entry's byte counts.
func TestClassifyHead(t *testing.T) {
	for _, fam := range []struct{ c, s netip.AddrPort }{{client4, service4}, {client6, service6}} {
		whole, _ := newTestTable(t, nil)
		heads, _ := newTestTable(t, nil)
		f := newFlow(t, whole, nil, fam.c, fam.s)
		f.synOpt = [2][]byte{tcpOptWScale(7), tcpOptWScale(7)}
		step := func(dir Direction, flags uint8, payload int) Verdict {
			t.Helper()
			s := f.seg(dir, flags, payload)
			f.advance(dir, flags, payload)
			pkt := tcpPacket(s)
			rw := whole.ClassifyTrusted(pkt, dir)
			rh := heads.ClassifyHead(pkt[:len(pkt)-payload], len(pkt), dir)
			if rh != rw {
				t.Fatalf("%v %s +%d: head %+v, whole packet %+v", dir, flagNames(flags), payload, rh, rw)
			}
			if rw.Verdict == New {
				if err := whole.Confirm(&rw); err != nil {
					t.Fatal(err)
				}
				if err := heads.Confirm(&rh); err != nil {
					t.Fatal(err)
				}
			}
			return rw.Verdict
		}
		step(Original, flagSYN, 0)
		step(Reply, flagSYN|flagACK, 0)
		step(Original, flagACK, 0)
		step(Original, flagACK|flagPSH, 1000)
		for range 3 {
			step(Reply, flagACK, 60000)
		}
		if v := step(Original, flagACK, 0); v != Established {
			t.Fatalf("the ACK of 180,000 bytes: %v", v)
		}
		f.next[Reply] += 10 << 20 // a segment far past the client's window
		if v := step(Reply, flagACK, 60000); v != Invalid {
			t.Fatalf("a segment past the window: %v", v)
		}
		iw, _ := whole.Get(f.tuple())
		ih, _ := heads.Get(f.tuple())
		if ih.Bytes != iw.Bytes || ih.Packets != iw.Packets || ih.State != iw.State {
			t.Errorf("entries differ: head %v %v %v, whole packets %v %v %v", ih.Bytes, ih.Packets, ih.State, iw.Bytes, iw.Packets, iw.State)
		}
		if want := uint64(3*60000 + 3*(len(tcpPacket(f.seg(Reply, flagACK, 0))))); ih.Bytes[Reply] < want {
			t.Errorf("reply bytes %d, want at least %d", ih.Bytes[Reply], want)
		}
	}

	// Other packets, and heads that stop short of the headers, on tables
	// that track one TCP flow (client4 -> service4), so that an ICMP error
	// about it is RELATED. Head and whole packet each go to a table of
	// their own.
	data := tcpPacket(tcpSeg{src: client6, dst: service6, flags: flagSYN, seq: 1, win: 1000, opts: tcpOptMSS(1400), payload: 100})
	withOpts := tcpPacket(tcpSeg{src: client4, dst: netip.MustParseAddrPort("10.96.0.11:80"), flags: flagSYN, seq: 1, win: 1000, payload: 100,
		ip: ipOpts{ipv4Options: []byte{1, 1, 1, 0}}})
	withExt := tcpPacket(tcpSeg{src: client6, dst: service6, flags: flagSYN, seq: 1, win: 1000, payload: 100,
		ip: ipOpts{extHeaders: extHeader(nhTCP, 0), extFirst: nhDestOpts}})
	udp := udpPacket(client4, service4, 500, ipOpts{})
	quoted := tcpPacket(tcpSeg{src: service4, dst: client4, flags: flagSYN | flagACK, seq: 1, ack: 2, win: 1000, payload: 200})
	icmp := icmpError(client4.Addr(), service4.Addr(), 3, 3, quoted, 100) // about the tracked flow
	// pad appends link padding.
	pad := func(p []byte) []byte { return append(append([]byte(nil), p...), make([]byte, 12)...) }
	tracking := func(t *testing.T) *Table {
		tab, _ := newTestTable(t, nil)
		r := tab.Classify(syn4(flagSYN), Original)
		if err := tab.Confirm(&r); err != nil {
			t.Fatal(err)
		}
		return tab
	}
	for _, v := range []struct {
		name   string
		pkt    []byte // the whole packet, as ClassifyTrusted sees it; ClassifyHead is given its size
		head   int    // how much of it ClassifyHead gets
		extra  []byte // appended to the head (past the packet's end)
		reason Reason // ReasonNone: the very Result ClassifyTrusted gives the whole packet
	}{
		{"UDP", udp, 28, nil, ReasonNone},
		{"UDP with link padding", pad(udp), 28, nil, ReasonNone},
		{"TCP with link padding", pad(data), 40 + 24, nil, ReasonNone},
		{"IPv4 options", withOpts, 24 + 20, nil, ReasonNone},
		{"IPv6 extension header", withExt, 40 + 8 + 20, nil, ReasonNone},
		{"ICMP error, quote cut after the ports", icmp, 20 + 8 + 20 + 4, nil, ReasonNone},
		{"ICMP error, quote cut in its IP header", icmp, 20 + 8 + 10, nil, ReasonICMPBadInner},
		{"IPv6 extension header cut", withExt, 40 + 4, nil, ReasonTruncated},
		{"TCP options cut", data, 40 + 22, nil, ReasonTruncated},
		{"TCP header cut", data, 40 + 10, nil, ReasonTruncated},
		{"IPv6 header cut", data, 30, nil, ReasonTruncated},
		{"head longer than the packet", data, len(data), []byte{0xff, 0xff}, ReasonNone},
	} {
		t.Run(v.name, func(t *testing.T) {
			head := append(append([]byte(nil), v.pkt[:v.head]...), v.extra...)
			r := tracking(t).ClassifyHead(head, len(v.pkt), Original)
			if v.reason != ReasonNone {
				if r.Verdict != Invalid || r.Reason != v.reason {
					t.Errorf("%v/%v, want INVALID/%v", r.Verdict, r.Reason, v.reason)
				}
				return
			}
			want := tracking(t).ClassifyTrusted(v.pkt, Original)
			if want.Verdict == Invalid {
				t.Fatalf("the whole packet is INVALID: %v", want.Reason)
			}
			if r != want {
				t.Errorf("%+v, want %+v", r, want)
			}
		})
	}
}

// TestResultTuple: the Result carries the Original-direction tuple in both
// directions.
func TestResultTuple(t *testing.T) {
	tab, clk := newTestTable(t, nil)
	f := newFlow(t, tab, clk, client6, service6)
	r := f.send(Original, flagSYN, 0)
	want := MakeTuple(TCP, client6, service6)
	if r.Tuple != want || r.Tuple.Proto() != TCP || r.Tuple.Src() != client6 || r.Tuple.Dst() != service6 {
		t.Errorf("original: %v, want %v", r.Tuple, want)
	}
	if r = f.send(Reply, flagSYN|flagACK, 0); r.Tuple != want {
		t.Errorf("reply: %v, want %v", r.Tuple, want)
	}
}

// TestICMPRelated covers ICMP and ICMPv6 errors quoting tracked flows.
func TestICMPRelated(t *testing.T) {
	udpReply4 := udpPacket(service4, client4, 50, ipOpts{})
	udpOrig4 := udpPacket(client4, service4, 50, ipOpts{})
	other4 := netip.MustParseAddr("10.96.0.11")
	type tc struct {
		name   string
		v6     bool
		pkt    func(f *flow) []byte
		dir    Direction
		want   Verdict
		reason Reason
	}
	cases := []tc{
		{name: "port unreachable from the client quoting our reply", pkt: func(*flow) []byte {
			return icmpError(client4.Addr(), service4.Addr(), 3, 3, udpReply4, 28)
		}, want: Related},
		{name: "whole datagram quoted", pkt: func(*flow) []byte {
			return icmpError(client4.Addr(), service4.Addr(), 3, 3, udpReply4, -1)
		}, want: Related},
		{name: "time exceeded from a router on the client's side", pkt: func(*flow) []byte {
			return icmpError(netip.MustParseAddr("10.0.0.254"), service4.Addr(), 11, 0, udpReply4, 28)
		}, want: Related},
		{name: "error we send quoting the client's datagram", pkt: func(*flow) []byte {
			return icmpError(service4.Addr(), client4.Addr(), 3, 3, udpOrig4, 28)
		}, dir: Reply, want: Related},
		{name: "quote without ports", pkt: func(*flow) []byte {
			return icmpError(client4.Addr(), service4.Addr(), 3, 3, udpReply4, 22)
		}, want: Invalid, reason: ReasonICMPBadInner},
		{name: "quote is not IP", pkt: func(*flow) []byte {
			return icmpError(client4.Addr(), service4.Addr(), 3, 3, make([]byte, 28), -1)
		}, want: Invalid, reason: ReasonICMPBadInner},
		{name: "outer destination is not the quoted source", pkt: func(*flow) []byte {
			return icmpError(client4.Addr(), other4, 3, 3, udpReply4, 28)
		}, want: Invalid, reason: ReasonICMPUnrelated},
		{name: "quotes an unknown flow", pkt: func(*flow) []byte {
			q := udpPacket(service4, netip.MustParseAddrPort("10.0.0.2:1"), 10, ipOpts{})
			return icmpError(netip.MustParseAddr("10.0.0.2"), service4.Addr(), 3, 3, q, 28)
		}, want: Invalid, reason: ReasonICMPUnrelated},
		{name: "quotes the wrong direction", pkt: func(*flow) []byte {
			return icmpError(service4.Addr(), client4.Addr(), 3, 3, udpReply4, 28)
		}, want: Invalid, reason: ReasonICMPUnrelated},
		{name: "quotes an ICMP echo", pkt: func(*flow) []byte {
			return icmpError(client4.Addr(), service4.Addr(), 3, 3, icmpInfo(service4.Addr(), client4.Addr(), 8), -1)
		}, want: Invalid, reason: ReasonICMPUnrelated},
		{name: "bad checksum", pkt: func(*flow) []byte {
			return corrupt(icmpError(client4.Addr(), service4.Addr(), 3, 3, udpReply4, 28), 24)
		}, want: Invalid, reason: ReasonBadChecksum},
		{name: "packet too big quoting a TCP segment", v6: true, pkt: func(f *flow) []byte {
			return icmpError(client6.Addr(), service6.Addr(), 2, 0, tcpPacket(f.seg(Reply, flagACK|flagPSH, 1400)), 1232)
		}, want: Related},
		{name: "ICMPv6 quote with extension headers", v6: true, pkt: func(f *flow) []byte {
			s := f.seg(Reply, flagACK, 0)
			s.ip = ipOpts{extHeaders: extHeader(nhTCP, 0), extFirst: nhDestOpts}
			return icmpError(client6.Addr(), service6.Addr(), 1, 4, tcpPacket(s), 52)
		}, want: Related},
		{name: "ICMPv6 quote of an IPv4 packet", v6: true, pkt: func(*flow) []byte {
			return icmpError(client6.Addr(), service6.Addr(), 1, 4, udpReply4, -1)
		}, want: Invalid, reason: ReasonICMPBadInner},
		{name: "ICMPv6 bad checksum", v6: true, pkt: func(f *flow) []byte {
			return corrupt(icmpError(client6.Addr(), service6.Addr(), 2, 0, tcpPacket(f.seg(Reply, flagACK, 0)), -1), 44)
		}, want: Invalid, reason: ReasonBadChecksum},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tab, clk := newTestTable(t, nil)
			var f *flow
			if c.v6 {
				f = newFlow(t, tab, clk, client6, service6)
				f.handshake()
			} else {
				f = newFlow(t, tab, clk, client4, service4)
				r := tab.Classify(udpOrig4, Original)
				if err := tab.Confirm(&r); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := tab.Get(f.tuple())
			if !c.v6 {
				before, _ = tab.Get(MakeTuple(UDP, client4, service4))
			}
			r := tab.Classify(c.pkt(f), c.dir)
			if r.Verdict != c.want || r.Reason != c.reason {
				t.Fatalf("got %v/%v, want %v/%v", r.Verdict, r.Reason, c.want, c.reason)
			}
			if r.Verdict == Related {
				if r.Tuple != before.Original {
					t.Errorf("tuple %v, want %v", r.Tuple, before.Original)
				}
				after, _ := tab.Get(before.Original)
				if after.Packets != before.Packets || after.Timeout != before.Timeout {
					t.Errorf("a related packet changed the entry: %v -> %v", before, after)
				}
				if tab.Stats().Related != 1 {
					t.Errorf("Related = %d", tab.Stats().Related)
				}
			}
		})
	}
}

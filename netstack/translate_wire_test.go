package netstack

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/userproxy/userproxy/translate"
)

// TestTranslateSegmentsGVisorReads: the segments package translate writes
// itself (it imports no gVisor) are what gVisor's parsers read: IP header
// and TCP checksums valid, the SYN-ACK's options (MSS, window scale, SACK
// permitted, timestamps), a data segment's timestamps, and a duplicate
// ACK's SACK blocks; over IPv4 and IPv6.
func TestTranslateSegmentsGVisorReads(t *testing.T) {
	for _, tc := range []struct{ client, svc string }{
		{"10.0.0.7:40000", "10.96.0.10:80"},
		{"[fd00::7]:40001", "[fd00:96::10]:443"},
	} {
		client, svc := netip.MustParseAddrPort(tc.client), netip.MustParseAddrPort(tc.svc)
		var out [][]byte
		now := time.Unix(1000, 0)
		w := translate.NewWriter(client, svc)
		synOpts := []byte{2, 4, 0x05, 0xb4, 1, 3, 3, 7, 1, 1, 4, 2, 1, 1, 8, 10, 0, 0, 0, 42, 0, 0, 0, 0}
		p := make([]byte, 200)
		syn, ok := parseTCP(p[:w.Build(p, 5000, 0, tcpSYN, 64240, synOpts, nil)])
		if !ok || !syn.IsSYN() {
			t.Fatalf("%s: the SYN does not parse", tc.svc)
		}
		sock := &memSocket{}
		f := translate.New(translate.Config{
			Sock: sock, Writer: translate.NewWriter(svc, client), Emit: func(p []byte) { out = append(out, append([]byte(nil), p...)) },
			Now: func() time.Time { return now }, ISS: 1000, TSBase: 7000, RcvWnd: 1 << 20, RcvShift: 7, LinkMSS: 1400,
		}, syn)
		f.Start()
		check := func(what string, p []byte) header.TCP {
			t.Helper()
			var src, dst tcpip.Address
			var tcp header.TCP
			if p[0]>>4 == 4 {
				ip := header.IPv4(p)
				if !ip.IsChecksumValid() || int(ip.TotalLength()) != len(p) || ip.Protocol() != uint8(header.TCPProtocolNumber) {
					t.Fatalf("%s %s: IPv4 header %x", tc.svc, what, p[:20])
				}
				src, dst, tcp = ip.SourceAddress(), ip.DestinationAddress(), header.TCP(ip.Payload())
			} else {
				ip := header.IPv6(p)
				if int(ip.PayloadLength())+header.IPv6MinimumSize != len(p) || ip.NextHeader() != uint8(header.TCPProtocolNumber) {
					t.Fatalf("%s %s: IPv6 header %x", tc.svc, what, p[:40])
				}
				src, dst, tcp = ip.SourceAddress(), ip.DestinationAddress(), header.TCP(ip.Payload())
			}
			if src != tcpip.AddrFromSlice(svc.Addr().AsSlice()) || dst != tcpip.AddrFromSlice(client.Addr().AsSlice()) {
				t.Fatalf("%s %s: %s -> %s", tc.svc, what, src, dst)
			}
			payload := tcp[tcp.DataOffset():]
			if !tcp.IsChecksumValid(src, dst, checksum.Checksum(payload, 0), uint16(len(payload))) {
				t.Fatalf("%s %s: TCP checksum not valid", tc.svc, what)
			}
			return tcp
		}
		synAck := check("SYN-ACK", out[0])
		o := header.ParseSynOptions(synAck.Options(), true)
		if synAck.Flags() != header.TCPFlagSyn|header.TCPFlagAck || o.MSS != 1400 || o.WS != 7 || !o.SACKPermitted || !o.TS || o.TSVal != 7000 || o.TSEcr != 42 {
			t.Fatalf("%s: SYN-ACK %v, options %+v", tc.svc, synAck.Flags(), o)
		}
		tsOpt := []byte{1, 1, 8, 10, 0, 0, 0, 43, 0, 0, 0x1b, 0x58}
		ack, _ := parseTCP(p[:w.Build(p, 5001, 1001, tcpACK, 512, tsOpt, nil)])
		f.Input(ack)
		sock.queue = []byte("answer")
		f.Readable()
		data := check("data", out[len(out)-1])
		if d := header.ParseTCPOptions(data.Options()); !bytes.Equal(data[data.DataOffset():], []byte("answer")) || !d.TS || d.TSEcr != 43 {
			t.Fatalf("%s: data %q, options %+v", tc.svc, data[data.DataOffset():], d)
		}
		past, _ := parseTCP(p[:w.Build(p, 5101, 1007, tcpACK, 512, tsOpt, []byte("later"))])
		f.Input(past)
		dup := check("duplicate ACK", out[len(out)-1])
		d := header.ParseTCPOptions(dup.Options())
		if dup.AckNumber() != 5001 || len(d.SACKBlocks) != 1 || d.SACKBlocks[0].Start != 5101 || d.SACKBlocks[0].End != 5106 {
			t.Fatalf("%s: duplicate ACK %d, SACK blocks %+v", tc.svc, dup.AckNumber(), d.SACKBlocks)
		}
	}
}

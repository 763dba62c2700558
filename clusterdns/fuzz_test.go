package clusterdns_test

import (
	"encoding/binary"
	"testing"

	"github.com/miekg/dns"

	"github.com/userproxy/userproxy/clusterdns"
)

// FuzzAnswer feeds arbitrary bytes to Respond over both transports, against
// the fixture table. It must never panic; every message with a readable
// query header gets exactly one reply, with the query's ID, that unpacks;
// garbage behind a valid header gets FORMERR; nothing else gets a reply;
// a UDP reply fits 512 bytes or the query's EDNS0 size. The seed corpus
// (testdata/fuzz/FuzzAnswer) holds real queries of every shape the
// responder answers, EDNS0, and broken ones.
func FuzzAnswer(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"web.acc.svc.cluster.local.", dns.TypeA},
		{"_http._tcp.web.acc.svc.cluster.local.", dns.TypeSRV},
		{"5.5.96.10.in-addr.arpa.", dns.TypePTR},
		{"many.acc.svc.cluster.local.", dns.TypeA},
	} {
		b, err := query(q.name, q.qtype).Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0})

	tr := newTracker(f, fixture()...)
	r := newResponder(f, tr, func(c *clusterdns.Config) { c.Logger = nil })
	f.Fuzz(func(t *testing.T, msg []byte) {
		var req dns.Msg
		parsed := req.Unpack(msg) == nil
		isQuery := len(msg) >= 12 && msg[2]&0x80 == 0
		limit := dns.MinMsgSize
		if opt := req.IsEdns0(); parsed && opt != nil {
			limit = min(max(int(opt.UDPSize()), dns.MinMsgSize), 4096)
		}
		for _, transport := range []clusterdns.Transport{clusterdns.UDP, clusterdns.TCP} {
			out := r.Respond(msg, transport, nil)
			if out == nil {
				if isQuery {
					t.Fatalf("%s: a message with a query header got no reply", transport)
				}
				continue
			}
			if !isQuery {
				t.Fatalf("%s: a response or a message without a header got a reply", transport)
			}
			var reply dns.Msg
			if err := reply.Unpack(out); err != nil {
				t.Fatalf("%s: the reply does not unpack: %v", transport, err)
			}
			if reply.Id != binary.BigEndian.Uint16(msg) || !reply.Response {
				t.Fatalf("%s: reply ID %#x response %v, query ID %#x", transport, reply.Id, reply.Response, binary.BigEndian.Uint16(msg))
			}
			if !parsed && reply.Rcode != dns.RcodeFormatError {
				t.Fatalf("%s: garbage got %s, want FORMERR", transport, clusterdns.RcodeString(reply.Rcode))
			}
			if transport == clusterdns.UDP && len(out) > limit {
				t.Fatalf("a UDP reply of %d bytes, over the limit %d", len(out), limit)
			}
		}
	})
}

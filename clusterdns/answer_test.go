package clusterdns_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/miekg/dns"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/service"
)

// soa is the SOA of the fixture's first table (generation 1).
const (
	soa        = "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"
	reverseSOA = "10.in-addr.arpa. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"
)

// Every record type and name shape against the fixture table; the question
// name stays as the client wrote it.
func TestAnswer(t *testing.T) {
	nodata := func(name string) view {
		return view{Rcode: "NOERROR", AA: true, Ns: []string{soa}, QuestionName: name}
	}
	nxdomain := func(name string) view {
		return view{Rcode: "NXDOMAIN", AA: true, Ns: []string{soa}, QuestionName: name}
	}
	answer := func(name string, rrs ...string) view {
		return view{Rcode: "NOERROR", AA: true, Answer: rrs, QuestionName: name}
	}
	cases := []struct {
		name  string
		qname string
		qtype uint16
		want  view
	}{
		// A and AAAA.
		{"A of a service", "web.acc.svc.cluster.local.", dns.TypeA,
			answer("web.acc.svc.cluster.local.", "web.acc.svc.cluster.local. 5 IN A 10.96.5.5")},
		{"mixed case: the answer keeps the client's case", "WeB.AcC.SvC.ClUsTeR.LoCaL.", dns.TypeA,
			answer("WeB.AcC.SvC.ClUsTeR.LoCaL.", "WeB.AcC.SvC.ClUsTeR.LoCaL. 5 IN A 10.96.5.5")},
		{"without the trailing dot", "web.acc.svc.cluster.local", dns.TypeA,
			answer("web.acc.svc.cluster.local.", "web.acc.svc.cluster.local. 5 IN A 10.96.5.5")},
		{"AAAA of an IPv4-only service: NODATA", "web.acc.svc.cluster.local.", dns.TypeAAAA, nodata("web.acc.svc.cluster.local.")},
		{"TXT of a service: NODATA", "web.acc.svc.cluster.local.", dns.TypeTXT, nodata("web.acc.svc.cluster.local.")},
		{"dual-stack A", "dual.acc.svc.cluster.local.", dns.TypeA,
			answer("dual.acc.svc.cluster.local.", "dual.acc.svc.cluster.local. 5 IN A 10.96.5.6")},
		{"dual-stack AAAA", "dual.acc.svc.cluster.local.", dns.TypeAAAA,
			answer("dual.acc.svc.cluster.local.", "dual.acc.svc.cluster.local. 5 IN AAAA fd00:96::6")},
		{"dual-stack ANY", "dual.acc.svc.cluster.local.", dns.TypeANY,
			answer("dual.acc.svc.cluster.local.", "dual.acc.svc.cluster.local. 5 IN A 10.96.5.6", "dual.acc.svc.cluster.local. 5 IN AAAA fd00:96::6")},
		{"headless: the ready endpoints", "db.acc.svc.cluster.local.", dns.TypeA,
			answer("db.acc.svc.cluster.local.", "db.acc.svc.cluster.local. 5 IN A 10.0.0.1", "db.acc.svc.cluster.local. 5 IN A 10.0.0.2")},
		{"headless without endpoints: NODATA", "empty.acc.svc.cluster.local.", dns.TypeA, nodata("empty.acc.svc.cluster.local.")},
		{"an endpoint by hostname", "db-0.db.acc.svc.cluster.local.", dns.TypeA,
			answer("db-0.db.acc.svc.cluster.local.", "db-0.db.acc.svc.cluster.local. 5 IN A 10.0.0.1")},
		{"an endpoint by dashed address", "10-0-0-2.db.acc.svc.cluster.local.", dns.TypeA,
			answer("10-0-0-2.db.acc.svc.cluster.local.", "10-0-0-2.db.acc.svc.cluster.local. 5 IN A 10.0.0.2")},
		{"an endpoint AAAA: NODATA", "db-0.db.acc.svc.cluster.local.", dns.TypeAAAA, nodata("db-0.db.acc.svc.cluster.local.")},
		{"a not-ready endpoint: NXDOMAIN", "10-0-0-3.db.acc.svc.cluster.local.", dns.TypeA, nxdomain("10-0-0-3.db.acc.svc.cluster.local.")},
		{"an unknown endpoint: NXDOMAIN", "db-9.db.acc.svc.cluster.local.", dns.TypeA, nxdomain("db-9.db.acc.svc.cluster.local.")},
		{"endpoint names of a ClusterIP service: NXDOMAIN", "x.web.acc.svc.cluster.local.", dns.TypeA, nxdomain("x.web.acc.svc.cluster.local.")},
		{"ExternalName: a CNAME", "ext.acc.svc.cluster.local.", dns.TypeA,
			answer("ext.acc.svc.cluster.local.", "ext.acc.svc.cluster.local. 5 IN CNAME example.com.")},

		// SRV.
		{"SRV of a named port", "_http._tcp.web.acc.svc.cluster.local.", dns.TypeSRV, view{Rcode: "NOERROR", AA: true,
			Answer:       []string{"_http._tcp.web.acc.svc.cluster.local. 5 IN SRV 0 100 80 web.acc.svc.cluster.local."},
			Extra:        []string{"web.acc.svc.cluster.local. 5 IN A 10.96.5.5"},
			QuestionName: "_http._tcp.web.acc.svc.cluster.local."}},
		{"SRV of the service: every port", "web.acc.svc.cluster.local.", dns.TypeSRV, view{Rcode: "NOERROR", AA: true,
			Answer: []string{"web.acc.svc.cluster.local. 5 IN SRV 0 50 80 web.acc.svc.cluster.local.",
				"web.acc.svc.cluster.local. 5 IN SRV 0 50 9090 web.acc.svc.cluster.local."},
			Extra:        []string{"web.acc.svc.cluster.local. 5 IN A 10.96.5.5"},
			QuestionName: "web.acc.svc.cluster.local."}},
		{"SRV of a headless port: one per endpoint, endpoint ports", "_pg._tcp.db.acc.svc.cluster.local.", dns.TypeSRV, view{Rcode: "NOERROR", AA: true,
			Answer: []string{"_pg._tcp.db.acc.svc.cluster.local. 5 IN SRV 0 50 5432 db-0.db.acc.svc.cluster.local.",
				"_pg._tcp.db.acc.svc.cluster.local. 5 IN SRV 0 50 5432 10-0-0-2.db.acc.svc.cluster.local."},
			Extra: []string{"db-0.db.acc.svc.cluster.local. 5 IN A 10.0.0.1",
				"10-0-0-2.db.acc.svc.cluster.local. 5 IN A 10.0.0.2"},
			QuestionName: "_pg._tcp.db.acc.svc.cluster.local."}},
		{"SRV with the wrong protocol: NXDOMAIN", "_http._udp.web.acc.svc.cluster.local.", dns.TypeSRV, nxdomain("_http._udp.web.acc.svc.cluster.local.")},
		{"SRV of an unknown port: NXDOMAIN", "_nope._tcp.web.acc.svc.cluster.local.", dns.TypeSRV, nxdomain("_nope._tcp.web.acc.svc.cluster.local.")},
		{"A at an SRV name: NODATA", "_http._tcp.web.acc.svc.cluster.local.", dns.TypeA, nodata("_http._tcp.web.acc.svc.cluster.local.")},
		{"UDP SRV", "_dns._udp.web.other.svc.cluster.local.", dns.TypeSRV, view{Rcode: "NOERROR", AA: true,
			Answer:       []string{"_dns._udp.web.other.svc.cluster.local. 5 IN SRV 0 100 53 web.other.svc.cluster.local."},
			Extra:        []string{"web.other.svc.cluster.local. 5 IN A 10.96.6.1"},
			QuestionName: "_dns._udp.web.other.svc.cluster.local."}},
		{"_tcp under a service with TCP ports: NODATA", "_tcp.web.acc.svc.cluster.local.", dns.TypeSRV, nodata("_tcp.web.acc.svc.cluster.local.")},
		{"_udp under a service without UDP ports: NXDOMAIN", "_udp.web.acc.svc.cluster.local.", dns.TypeSRV, nxdomain("_udp.web.acc.svc.cluster.local.")},

		// The rest of the domain.
		{"an unknown service: NXDOMAIN", "nope.acc.svc.cluster.local.", dns.TypeA, nxdomain("nope.acc.svc.cluster.local.")},
		{"a known namespace: NODATA", "acc.svc.cluster.local.", dns.TypeA, nodata("acc.svc.cluster.local.")},
		{"an unknown namespace: NXDOMAIN", "nope.svc.cluster.local.", dns.TypeA, nxdomain("nope.svc.cluster.local.")},
		{"svc.<domain>: NODATA", "svc.cluster.local.", dns.TypeA, nodata("svc.cluster.local.")},
		{"pod names are not served", "10-0-0-1.acc.pod.cluster.local.", dns.TypeA, nxdomain("10-0-0-1.acc.pod.cluster.local.")},
		{"too many labels", "a.b.c.web.acc.svc.cluster.local.", dns.TypeA, nxdomain("a.b.c.web.acc.svc.cluster.local.")},
		{"an escaped label", `we\.b.acc.svc.cluster.local.`, dns.TypeA, nxdomain(`we\.b.acc.svc.cluster.local.`)},
		{"SOA of the domain", "cluster.local.", dns.TypeSOA, answer("cluster.local.", soa)},
		{"NS of the domain", "cluster.local.", dns.TypeNS, view{Rcode: "NOERROR", AA: true,
			Answer: []string{"cluster.local. 5 IN NS ns.dns.cluster.local."}, Extra: []string{"ns.dns.cluster.local. 5 IN A 10.96.0.10"},
			QuestionName: "cluster.local."}},
		{"A of the domain: NODATA", "cluster.local.", dns.TypeA, nodata("cluster.local.")},
		{"the name server's address", "ns.dns.cluster.local.", dns.TypeA,
			answer("ns.dns.cluster.local.", "ns.dns.cluster.local. 5 IN A 10.96.0.10")},

		// PTR.
		{"PTR of a ClusterIP", "5.5.96.10.in-addr.arpa.", dns.TypePTR,
			answer("5.5.96.10.in-addr.arpa.", "5.5.96.10.in-addr.arpa. 5 IN PTR web.acc.svc.cluster.local.")},
		{"PTR of an IPv6 ClusterIP", "6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR,
			answer("6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.",
				"6.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa. 5 IN PTR dual.acc.svc.cluster.local.")},
		{"PTR of a free service address: NXDOMAIN", "9.9.96.10.in-addr.arpa.", dns.TypePTR,
			view{Rcode: "NXDOMAIN", AA: true, Ns: []string{reverseSOA}, QuestionName: "9.9.96.10.in-addr.arpa."}},
		{"A at a ClusterIP's reverse name: NODATA", "5.5.96.10.in-addr.arpa.", dns.TypeA,
			view{Rcode: "NOERROR", AA: true, Ns: []string{reverseSOA}, QuestionName: "5.5.96.10.in-addr.arpa."}},
		{"PTR outside the service CIDRs: REFUSED", "1.0.0.127.in-addr.arpa.", dns.TypePTR, view{Rcode: "REFUSED", QuestionName: "1.0.0.127.in-addr.arpa."}},
		{"a partial reverse name: REFUSED", "96.10.in-addr.arpa.", dns.TypePTR, view{Rcode: "REFUSED", QuestionName: "96.10.in-addr.arpa."}},

		// Outside the domain.
		{"outside the domain: REFUSED", "example.com.", dns.TypeA, view{Rcode: "REFUSED", QuestionName: "example.com."}},
		{"a suffix that is not a label boundary", "xcluster.local.", dns.TypeA, view{Rcode: "REFUSED", QuestionName: "xcluster.local."}},
		{"zone transfer: REFUSED", "cluster.local.", dns.TypeAXFR, view{Rcode: "REFUSED", QuestionName: "cluster.local."}},
	}
	r := newResponder(t, newTracker(t, fixture()...))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := viewOf(r.Answer(query(c.qname, c.qtype), clusterdns.UDP))
			if diff := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("%s %s (-want +got):\n%s", c.qname, dns.TypeToString[c.qtype], diff)
			}
		})
	}
}

// Messages that are not plain queries.
func TestAnswerMalformed(t *testing.T) {
	r := newResponder(t, newTracker(t, fixture()...))
	withOPT := func(version uint8) *dns.Msg {
		m := query("web.acc.svc.cluster.local.", dns.TypeA)
		m.SetEdns0(1232, false)
		m.IsEdns0().SetVersion(version)
		return m
	}
	cases := []struct {
		name string
		req  *dns.Msg
		want view
	}{
		{"no question: FORMERR", &dns.Msg{MsgHdr: dns.MsgHdr{Id: 7}}, view{Rcode: "FORMERR"}},
		{"two questions: FORMERR", func() *dns.Msg {
			m := query("web.acc.svc.cluster.local.", dns.TypeA)
			m.Question = append(m.Question, m.Question[0])
			return m
		}(), view{Rcode: "FORMERR", QuestionName: "web.acc.svc.cluster.local."}},
		{"NOTIFY: NOTIMP", func() *dns.Msg {
			m := query("cluster.local.", dns.TypeSOA)
			m.Opcode = dns.OpcodeNotify
			return m
		}(), view{Rcode: "NOTIMP", QuestionName: "cluster.local."}},
		{"class CHAOS: REFUSED", func() *dns.Msg {
			m := query("version.bind.", dns.TypeTXT)
			m.Question[0].Qclass = dns.ClassCHAOS
			return m
		}(), view{Rcode: "REFUSED", QuestionName: "version.bind."}},
		{"EDNS0: the reply has an OPT record", withOPT(0), view{Rcode: "NOERROR", AA: true,
			Answer: []string{"web.acc.svc.cluster.local. 5 IN A 10.96.5.5"}, Extra: []string{"OPT"}, QuestionName: "web.acc.svc.cluster.local."}},
		{"EDNS version 1: BADVERS", withOPT(1), view{Rcode: "BADVERS", Extra: []string{"OPT"}, QuestionName: "web.acc.svc.cluster.local."}},
		{"a response: no reply", func() *dns.Msg {
			m := query("web.acc.svc.cluster.local.", dns.TypeA)
			m.Response = true
			return m
		}(), view{Rcode: "no reply"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reply := r.Answer(c.req, clusterdns.UDP)
			if diff := cmp.Diff(c.want, viewOf(reply), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if reply != nil {
				if reply.Id != c.req.Id || !reply.Response {
					t.Errorf("reply ID %d response %v, want ID %d and the response bit", reply.Id, reply.Response, c.req.Id)
				}
				if _, err := reply.Pack(); err != nil {
					t.Errorf("the reply does not pack: %v", err)
				}
			}
		})
	}
}

// A changed Service is answered from the next table: the responder reads
// the live table on every query.
func TestAnswerFollowsTheTable(t *testing.T) {
	tr := newTracker(t, svcObj("acc/web", "10.96.5.5", "", "http/TCP/80"))
	r := newResponder(t, tr)
	ask := func() []string {
		return viewOf(r.Answer(query("web.acc.svc.cluster.local.", dns.TypeA), clusterdns.UDP)).Answer
	}
	if got := ask(); len(got) != 1 || got[0] != "web.acc.svc.cluster.local. 5 IN A 10.96.5.5" {
		t.Fatalf("before: %v", got)
	}
	tr.OnServiceUpdate(nil, svcObj("acc/web", "10.96.7.7", "", "http/TCP/80"))
	if got := ask(); len(got) != 1 || got[0] != "web.acc.svc.cluster.local. 5 IN A 10.96.7.7" {
		t.Fatalf("after the change: %v", got)
	}
	tr.OnServiceDelete(svcObj("acc/web", "10.96.7.7", ""))
	if got := viewOf(r.Answer(query("web.acc.svc.cluster.local.", dns.TypeA), clusterdns.UDP)); got.Rcode != "NXDOMAIN" {
		t.Fatalf("after the delete: %+v", got)
	}
}

// Before the first table, names in the domain are SERVFAIL (the client
// retries) and other names are unaffected.
func TestAnswerWithoutTable(t *testing.T) {
	r, err := clusterdns.New(clusterdns.Config{Table: func() *service.Table { return nil }, ServiceCIDRs: serviceCIDRs})
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		name  string
		qtype uint16
		want  string
	}{
		{"web.acc.svc.cluster.local.", dns.TypeA, "SERVFAIL"},
		{"5.5.96.10.in-addr.arpa.", dns.TypePTR, "SERVFAIL"},
		{"example.com.", dns.TypeA, "REFUSED"},
	} {
		if got := viewOf(r.Answer(query(q.name, q.qtype), clusterdns.UDP)).Rcode; got != q.want {
			t.Errorf("%s: %s, want %s", q.name, got, q.want)
		}
	}
}

// Stats count queries by type and rcode.
func TestStats(t *testing.T) {
	r := newResponder(t, newTracker(t, fixture()...))
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{"web.acc.svc.cluster.local.", dns.TypeA},
		{"web.acc.svc.cluster.local.", dns.TypeA},
		{"nope.acc.svc.cluster.local.", dns.TypeA},
		{"_http._tcp.web.acc.svc.cluster.local.", dns.TypeSRV},
		{"example.com.", dns.TypeMX},
	} {
		r.Answer(query(q.name, q.qtype), clusterdns.UDP)
	}
	r.Answer(&dns.Msg{}, clusterdns.UDP)
	r.Answer(&dns.Msg{MsgHdr: dns.MsgHdr{Response: true}}, clusterdns.UDP)
	want := clusterdns.Stats{
		Queries: []clusterdns.QueryCount{
			{Type: "A", Rcode: "NOERROR", N: 2},
			{Type: "A", Rcode: "NXDOMAIN", N: 1},
			{Type: "SRV", Rcode: "NOERROR", N: 1},
			{Type: "other", Rcode: "REFUSED", N: 1},
			{Type: "none", Rcode: "FORMERR", N: 1},
		},
		Dropped: 1,
	}
	if diff := cmp.Diff(want, r.Stats()); diff != "" {
		t.Errorf("Stats (-want +got):\n%s", diff)
	}
}

// The responder steps aside for a Service that owns its address on port 53,
// and Status says so.
func TestStatusSteppedAside(t *testing.T) {
	tr := newTracker(t, fixture()...)
	r := newResponder(t, tr)
	if s := r.Status(); len(s.Addrs) != 1 || s.Addrs[0].SteppedAsideFor != "" || s.Domain != "cluster.local." {
		t.Fatalf("Status without kube-dns: %+v", s)
	}
	tr.OnServiceAdd(svcObj("kube-system/kube-dns", "10.96.0.10", "", "dns/UDP/53", "dns-tcp/TCP/53"))
	if s := r.Status(); s.Addrs[0].SteppedAsideFor != "kube-system/kube-dns" {
		t.Fatalf("Status with kube-dns: %+v", s)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	tr := newTracker(t)
	for _, cfg := range []clusterdns.Config{
		{},
		{Table: tr.Current, Domain: "bad..domain"},
		{Table: tr.Current, Upstream: "dns.example:53"},
		{Table: tr.Current, Upstream: "192.0.2.1"},
	} {
		if _, err := clusterdns.New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

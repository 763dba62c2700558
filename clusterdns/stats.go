package clusterdns

import (
	"net/netip"
	"strconv"
	"sync/atomic"

	"github.com/miekg/dns"

	"github.com/userproxy/userproxy/service"
)

// The query types and response codes counted by name; others are "other".
var (
	countedTypes  = []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypePTR, dns.TypeCNAME, dns.TypeSOA, dns.TypeNS, dns.TypeTXT, dns.TypeANY}
	countedRcodes = []int{dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure, dns.RcodeNameError, dns.RcodeNotImplemented, dns.RcodeRefused, dns.RcodeBadVers}
)

// Type and rcode indexes: the counted ones, then "other", then (types only)
// "none" for a query without a question.
const (
	typeOther  = 9
	typeNone   = 10
	numTypes   = 11
	rcodeOther = 7
	numRcodes  = 8
)

type counters struct {
	queries   [numTypes][numRcodes]atomic.Uint64
	dropped   atomic.Uint64
	truncated atomic.Uint64
	forwarded atomic.Uint64
	upstream  atomic.Uint64 // upstream failures
}

func typeIndex(req *dns.Msg) int {
	if req == nil || len(req.Question) == 0 {
		return typeNone
	}
	for i, t := range countedTypes {
		if t == req.Question[0].Qtype {
			return i
		}
	}
	return typeOther
}

func rcodeIndex(rc int) int {
	for i, c := range countedRcodes {
		if c == rc {
			return i
		}
	}
	return rcodeOther
}

// count records a query that was answered with rcode.
func (c *counters) count(req *dns.Msg, rcode int) {
	c.queries[typeIndex(req)][rcodeIndex(rcode)].Add(1)
}

// Stats is a snapshot of a Responder's counters.
type Stats struct {
	// Queries counts the answered queries by query type and response code;
	// only the pairs seen are listed, ordered by type then rcode index.
	Queries []QueryCount
	// Dropped counts messages that got no answer: responses, and messages
	// too short to hold a header.
	Dropped uint64
	// Truncated counts UDP replies sent with the TC bit.
	Truncated uint64
	// Forwarded counts queries sent upstream; UpstreamErrors those that
	// got no answer in time (answered SERVFAIL).
	Forwarded, UpstreamErrors uint64
}

// QueryCount is the number of queries of one type answered with one rcode.
// Type is the type's mnemonic ("A", "SRV", ...), "other", or "none" (no
// question); Rcode the code's ("NOERROR", "NXDOMAIN", ...) or "other".
type QueryCount struct {
	Type, Rcode string
	N           uint64
}

// Stats returns a snapshot of the counters.
func (r *Responder) Stats() Stats {
	s := Stats{
		Dropped:        r.stats.dropped.Load(),
		Truncated:      r.stats.truncated.Load(),
		Forwarded:      r.stats.forwarded.Load(),
		UpstreamErrors: r.stats.upstream.Load(),
	}
	for ti := range numTypes {
		for ri := range numRcodes {
			if n := r.stats.queries[ti][ri].Load(); n > 0 {
				s.Queries = append(s.Queries, QueryCount{Type: typeName(ti), Rcode: rcodeName(ri), N: n})
			}
		}
	}
	return s
}

func typeName(i int) string {
	switch i {
	case typeOther:
		return "other"
	case typeNone:
		return "none"
	}
	return dns.TypeToString[countedTypes[i]]
}

func rcodeName(i int) string {
	if i == rcodeOther {
		return "other"
	}
	return RcodeString(countedRcodes[i])
}

// RcodeString returns a response code's mnemonic, as dig prints it:
// "NOERROR", "NXDOMAIN", ... (16 is BADVERS: a query never carries the
// TSIG that would make it BADSIG).
func RcodeString(rc int) string {
	if rc == dns.RcodeBadVers {
		return "BADVERS"
	}
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return "RCODE" + strconv.Itoa(rc)
}

// Status is what /debug/dns shows.
type Status struct {
	// Domain is the cluster domain, fully qualified.
	Domain string
	// Upstream is the forwarding server, "" for none.
	Upstream string
	// Addrs are the responder's addresses (port 53), each with the Service
	// it steps aside for, if any.
	Addrs []AddrStatus
}

// AddrStatus is one address of the responder.
type AddrStatus struct {
	Addr netip.AddrPort
	// SteppedAsideFor is the Service that has a port at Addr in the current
	// table (kube-dns reached through the proxy): it gets the queries, and
	// the responder answers none there. Empty when the responder serves.
	SteppedAsideFor string
}

// Status reports the responder's configuration and, against the current
// table, whom it steps aside for.
func (r *Responder) Status() Status {
	s := Status{Domain: r.zone, Upstream: r.cfg.Upstream}
	t := r.cfg.Table()
	for _, ip := range r.cfg.Addrs {
		as := AddrStatus{Addr: netip.AddrPortFrom(ip, 53)}
		if owner, ok := SteppedAside(t, ip); ok {
			as.SteppedAsideFor = owner.String()
		}
		s.Addrs = append(s.Addrs, as)
	}
	return s
}

// SteppedAside reports the Service that owns ip:53 in t (either protocol),
// for which a responder at ip steps aside.
func SteppedAside(t *service.Table, ip netip.Addr) (service.ServiceName, bool) {
	return t.PortOwner(ip, 53)
}

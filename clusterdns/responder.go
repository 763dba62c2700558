package clusterdns

// A query, from the message to the answer (Answer):
//
//  1. checks: a response is never answered; opcodes other than QUERY are
//     NOTIMP; not exactly one question is FORMERR; EDNS0 versions above 0
//     are BADVERS; classes other than IN (and ANY) and zone transfers are
//     REFUSED.
//  2. the name, lowercased and fully qualified, is looked up where it
//     belongs: the cluster domain (cluster.go), the reverse name of an
//     address in a service CIDR (PTR), or elsewhere (REFUSED, or forwarded
//     upstream: forward.go).
//  3. the reply: authoritative for the cluster domain and the service
//     CIDRs' reverse names, the SOA in the authority section of NXDOMAIN
//     and NODATA answers, an OPT record when the query had one. Fitting
//     it into the transport (TC over UDP) is serve.go's part.

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/service"
)

// Defaults of Config.
const (
	DefaultDomain          = "cluster.local"
	DefaultTTL             = 5
	DefaultUpstreamTimeout = 2 * time.Second
	DefaultUDPIdle         = 2 * time.Second
	DefaultTCPIdle         = 10 * time.Second
)

// ednsSize is the UDP payload size the responder advertises in its OPT
// records (the DNS flag day 2020 value).
const ednsSize = 1232

// Config configures a Responder.
type Config struct {
	// Domain is the cluster domain (kubelet's --cluster-domain); empty
	// means DefaultDomain. Without a trailing dot.
	Domain string
	// Table returns the live service table (required); nil tables answer
	// SERVFAIL for names in the domain.
	Table func() *service.Table
	// Addrs are the responder's own addresses (it serves port 53 on them):
	// ns.dns.<domain> resolves to them, and Status reports, per address,
	// the Service it steps aside for.
	Addrs []netip.Addr
	// ServiceCIDRs are the service CIDRs: PTR queries for addresses inside
	// them are answered here (NXDOMAIN when no ClusterIP matches), never
	// forwarded.
	ServiceCIDRs []netip.Prefix
	// Upstream is "ip:port" of a server for names outside the domain and
	// the service CIDRs; empty answers those REFUSED.
	Upstream string
	// UpstreamTimeout bounds one forwarded query; 0 means
	// DefaultUpstreamTimeout.
	UpstreamTimeout time.Duration
	// TTL of every record and of negative answers, in seconds; 0 means
	// DefaultTTL.
	TTL uint32
	// UDPIdle ends a UDP flow after this long without a query; TCPIdle a
	// TCP connection. 0 means DefaultUDPIdle and DefaultTCPIdle.
	UDPIdle, TCPIdle time.Duration
	// Now is the clock the idle deadlines are computed from; nil means
	// time.Now.
	Now func() time.Time
	// Logger gets one debug line per query (checked first, so it costs
	// nothing at info); nil means zap.NewNop().
	Logger *zap.Logger
}

// Transport is how a query arrived.
type Transport uint8

// The transports.
const (
	UDP Transport = iota
	TCP
)

// String returns "udp" or "tcp".
func (t Transport) String() string {
	if t == TCP {
		return "tcp"
	}
	return "udp"
}

// Responder answers cluster DNS queries. Safe for concurrent use.
type Responder struct {
	cfg      Config
	zone     string // the domain, fully qualified, lowercase
	nsName   string // ns.dns.<zone>
	reverse  []string
	logger   *zap.Logger
	stats    counters
	upstream *upstream
}

// New returns a Responder for cfg.
func New(cfg Config) (*Responder, error) {
	if cfg.Table == nil {
		return nil, errors.New("clusterdns: Config.Table is required")
	}
	if cfg.Domain == "" {
		cfg.Domain = DefaultDomain
	}
	zone := dns.CanonicalName(cfg.Domain)
	if _, ok := dns.IsDomainName(zone); !ok || zone == "." || strings.Contains(zone, "\\") {
		return nil, fmt.Errorf("clusterdns: cluster domain %q is not a domain name", cfg.Domain)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.UpstreamTimeout <= 0 {
		cfg.UpstreamTimeout = DefaultUpstreamTimeout
	}
	if cfg.UDPIdle <= 0 {
		cfg.UDPIdle = DefaultUDPIdle
	}
	if cfg.TCPIdle <= 0 {
		cfg.TCPIdle = DefaultTCPIdle
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	r := &Responder{cfg: cfg, zone: zone, nsName: "ns.dns." + zone, logger: cfg.Logger}
	for _, p := range cfg.ServiceCIDRs {
		r.reverse = append(r.reverse, reverseZone(p))
	}
	if cfg.Upstream != "" {
		if _, err := netip.ParseAddrPort(cfg.Upstream); err != nil {
			return nil, fmt.Errorf("clusterdns: upstream %q: want ip:port: %w", cfg.Upstream, err)
		}
		r.upstream = &upstream{addr: cfg.Upstream, timeout: cfg.UpstreamTimeout}
	}
	return r, nil
}

// Domain returns the cluster domain, fully qualified ("cluster.local.").
func (r *Responder) Domain() string { return r.zone }

// Answer returns the reply to req, or nil when req gets none (it is a
// response). It never fails: problems become response codes. The reply is
// not fitted to a transport (serve.go truncates UDP replies); tr only
// chooses how a forwarded query travels. Everything but forwarding is a
// pure function of req and the table.
func (r *Responder) Answer(req *dns.Msg, tr Transport) *dns.Msg {
	if req == nil || req.Response {
		r.stats.dropped.Add(1)
		return nil
	}
	reply := r.answer(req, tr)
	r.stats.count(req, reply.Rcode)
	return reply
}

func (r *Responder) answer(req *dns.Msg, tr Transport) *dns.Msg {
	reply := new(dns.Msg)
	reply.SetReply(req) // 1
	reply.RecursionAvailable = r.upstream != nil
	opt := req.IsEdns0()
	if opt != nil {
		reply.SetEdns0(ednsSize, false)
		if opt.Version() != 0 {
			reply.Rcode = dns.RcodeBadVers
			return reply
		}
	}
	switch {
	case req.Opcode != dns.OpcodeQuery:
		reply.Rcode = dns.RcodeNotImplemented
		return reply
	case len(req.Question) != 1:
		reply.Rcode = dns.RcodeFormatError
		return reply
	}
	q := req.Question[0]
	// A question built in code may lack the final dot (the wire form
	// always has it): the reply carries the name fully qualified.
	q.Name = dns.Fqdn(q.Name)
	reply.Question[0].Name = q.Name
	if (q.Qclass != dns.ClassINET && q.Qclass != dns.ClassANY) || q.Qtype == dns.TypeAXFR || q.Qtype == dns.TypeIXFR {
		reply.Rcode = dns.RcodeRefused
		return reply
	}
	name := dns.CanonicalName(q.Name) // 2
	if labels, ok := splitUnder(name, r.zone); ok {
		t := r.cfg.Table()
		if t == nil {
			reply.Rcode = dns.RcodeServerFailure
			return reply
		}
		r.answerCluster(reply, t, q, labels)
		return reply
	}
	if ip, ok := reverseAddr(name); ok {
		if zone := r.reverseZoneOf(ip); zone != "" {
			t := r.cfg.Table()
			if t == nil {
				reply.Rcode = dns.RcodeServerFailure
				return reply
			}
			r.answerPTR(reply, t, q, ip, zone)
			return reply
		}
	}
	if r.upstream != nil {
		return r.forward(req, reply, tr)
	}
	reply.Rcode = dns.RcodeRefused
	return reply
}

// reverseZoneOf returns the reverse zone of the service CIDR that holds
// ip, or "" when no service CIDR does (see Config.ServiceCIDRs).
func (r *Responder) reverseZoneOf(ip netip.Addr) string {
	for i, p := range r.cfg.ServiceCIDRs {
		if p.Contains(ip) {
			return r.reverse[i]
		}
	}
	return ""
}

// answerPTR answers the reverse name of an address in a service CIDR: the
// PTR of a ClusterIP; NXDOMAIN for other addresses; NODATA for other types.
func (r *Responder) answerPTR(reply *dns.Msg, t *service.Table, q dns.Question, ip netip.Addr, zone string) {
	reply.Authoritative = true
	owner, ok := t.DNSByIP(ip)
	switch {
	case !ok:
		r.negative(reply, t, zone, dns.RcodeNameError)
	case q.Qtype == dns.TypePTR || q.Qtype == dns.TypeANY:
		reply.Answer = append(reply.Answer, &dns.PTR{Hdr: r.hdr(q.Name, dns.TypePTR), Ptr: r.serviceName(owner)})
	default:
		r.negative(reply, t, zone, dns.RcodeSuccess)
	}
}

// negative makes reply an NXDOMAIN (rcode NameError) or NODATA (Success)
// answer: no records, the zone's SOA in the authority section.
func (r *Responder) negative(reply *dns.Msg, t *service.Table, zone string, rcode int) {
	reply.Rcode = rcode
	reply.Answer = nil
	reply.Extra = onlyOPT(reply.Extra)
	reply.Ns = []dns.RR{r.soa(zone, t)}
}

// soa is the SOA record of zone (the cluster domain or a reverse zone):
// CoreDNS's shape, with the table's generation as the serial, so it moves
// when the table does.
func (r *Responder) soa(zone string, t *service.Table) *dns.SOA {
	return &dns.SOA{
		Hdr:     dns.RR_Header{Name: zone, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: r.cfg.TTL},
		Ns:      r.nsName,
		Mbox:    "hostmaster." + r.zone,
		Serial:  uint32(t.Generation()),
		Refresh: 7200,
		Retry:   1800,
		Expire:  86400,
		Minttl:  r.cfg.TTL,
	}
}

// hdr is the header of an answer record: the owner name as the client
// spelled it (case preserved, RFC 4343), class IN, the TTL.
func (r *Responder) hdr(name string, typ uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: typ, Class: dns.ClassINET, Ttl: r.cfg.TTL}
}

// serviceName is "<svc>.<ns>.svc.<zone>".
func (r *Responder) serviceName(n service.ServiceName) string {
	return n.Name + "." + n.Namespace + ".svc." + r.zone
}

// addrRR returns the A or AAAA record of ip under name.
func (r *Responder) addrRR(name string, ip netip.Addr) dns.RR {
	if ip.Is4() {
		a := ip.As4()
		return &dns.A{Hdr: r.hdr(name, dns.TypeA), A: a[:]}
	}
	a := ip.As16()
	return &dns.AAAA{Hdr: r.hdr(name, dns.TypeAAAA), AAAA: a[:]}
}

// wants reports whether a query of qtype asks for the address ip.
func wants(qtype uint16, ip netip.Addr) bool {
	switch qtype {
	case dns.TypeA:
		return ip.Is4()
	case dns.TypeAAAA:
		return ip.Is6()
	case dns.TypeANY:
		return true
	}
	return false
}

func onlyOPT(extra []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range extra {
		if rr.Header().Rrtype == dns.TypeOPT {
			out = append(out, rr)
		}
	}
	return out
}

package clusterdns

import (
	"net/netip"
	"strings"

	"github.com/miekg/dns"

	"github.com/userproxy/userproxy/service"
)

// Names in the cluster domain, by their labels under it (see doc.go for the
// records):
//
//	[]                                  the domain: SOA, NS
//	["ns", "dns"]                       ns.dns.<domain>: our addresses
//	["svc"]                             NODATA
//	[ns, "svc"]                         NODATA for a known namespace
//	[svc, ns, "svc"]                    a service
//	["_proto", svc, ns, "svc"]          NODATA when a port has the protocol
//	[endpoint, svc, ns, "svc"]          a headless service's endpoint
//	["_port", "_proto", svc, ns, "svc"] SRV
//
// Anything else is NXDOMAIN.

// answerCluster fills reply for a name under the cluster domain.
func (r *Responder) answerCluster(reply *dns.Msg, t *service.Table, q dns.Question, labels []string) {
	reply.Authoritative = true
	for i, l := range labels {
		if labels[i] = plainLabel(l); labels[i] == "" {
			r.negative(reply, t, r.zone, dns.RcodeNameError)
			return
		}
	}
	n := len(labels)
	switch {
	case n == 0:
		r.answerApex(reply, t, q)
		return
	case n == 2 && labels[0] == "ns" && labels[1] == "dns":
		for _, ip := range r.cfg.Addrs {
			if wants(q.Qtype, ip) {
				reply.Answer = append(reply.Answer, r.addrRR(q.Name, ip))
			}
		}
		if len(reply.Answer) == 0 {
			r.negative(reply, t, r.zone, dns.RcodeSuccess)
		}
		return
	case labels[n-1] != "svc" || n > 5:
		r.negative(reply, t, r.zone, dns.RcodeNameError)
		return
	case n == 1:
		r.negative(reply, t, r.zone, dns.RcodeSuccess)
		return
	case n == 2:
		if t.DNSNamespace(labels[0]) {
			r.negative(reply, t, r.zone, dns.RcodeSuccess)
		} else {
			r.negative(reply, t, r.zone, dns.RcodeNameError)
		}
		return
	}
	svc, ok := t.DNSService(labels[n-2], labels[n-3])
	if !ok {
		r.negative(reply, t, r.zone, dns.RcodeNameError)
		return
	}
	switch n {
	case 3:
		r.answerService(reply, t, q, svc)
	case 4:
		if proto, ok := protocolLabel(labels[0]); ok {
			for _, p := range svc.Ports {
				if p.Protocol == proto {
					r.negative(reply, t, r.zone, dns.RcodeSuccess)
					return
				}
			}
			r.negative(reply, t, r.zone, dns.RcodeNameError)
			return
		}
		r.answerEndpoint(reply, t, q, svc, labels[0])
	case 5:
		portName, ok := strings.CutPrefix(labels[0], "_")
		proto, okProto := protocolLabel(labels[1])
		if !ok || !okProto || portName == "" {
			r.negative(reply, t, r.zone, dns.RcodeNameError)
			return
		}
		r.answerSRV(reply, t, q, svc, portName, proto)
	}
}

// protocolLabel reads "_tcp" and "_udp".
func protocolLabel(l string) (service.Protocol, bool) {
	switch l {
	case "_tcp":
		return service.TCP, true
	case "_udp":
		return service.UDP, true
	}
	return 0, false
}

// answerApex answers the domain itself: SOA and NS, else NODATA.
func (r *Responder) answerApex(reply *dns.Msg, t *service.Table, q dns.Question) {
	if q.Qtype == dns.TypeSOA || q.Qtype == dns.TypeANY {
		soa := r.soa(r.zone, t)
		soa.Hdr.Name = q.Name
		reply.Answer = append(reply.Answer, soa)
	}
	if q.Qtype == dns.TypeNS || q.Qtype == dns.TypeANY {
		reply.Answer = append(reply.Answer, &dns.NS{Hdr: r.hdr(q.Name, dns.TypeNS), Ns: r.nsName})
		for _, ip := range r.cfg.Addrs {
			reply.Extra = append(reply.Extra, r.addrRR(r.nsName, ip))
		}
	}
	if len(reply.Answer) == 0 {
		r.negative(reply, t, r.zone, dns.RcodeSuccess)
	}
}

// answerService answers <svc>.<ns>.svc.<domain>.
func (r *Responder) answerService(reply *dns.Msg, t *service.Table, q dns.Question, svc *service.DNSService) {
	switch {
	case svc.ExternalName != "":
		// A CNAME answers every type at its name (the client follows it).
		reply.Answer = append(reply.Answer, &dns.CNAME{Hdr: r.hdr(q.Name, dns.TypeCNAME), Target: dns.Fqdn(svc.ExternalName)})
	case q.Qtype == dns.TypeSRV:
		r.answerSRV(reply, t, q, svc, "", 0)
		return
	case svc.Headless:
		for i := range svc.Endpoints {
			if ip := svc.Endpoints[i].Addr; wants(q.Qtype, ip) {
				reply.Answer = append(reply.Answer, r.addrRR(q.Name, ip))
			}
		}
	default:
		for _, ip := range svc.ClusterIPs {
			if wants(q.Qtype, ip) {
				reply.Answer = append(reply.Answer, r.addrRR(q.Name, ip))
			}
		}
	}
	if len(reply.Answer) == 0 {
		r.negative(reply, t, r.zone, dns.RcodeSuccess)
	}
}

// answerEndpoint answers <endpoint>.<svc>.<ns>.svc.<domain> of a headless
// service.
func (r *Responder) answerEndpoint(reply *dns.Msg, t *service.Table, q dns.Question, svc *service.DNSService, label string) {
	for i := range svc.Endpoints {
		e := &svc.Endpoints[i]
		if e.Label != label {
			continue
		}
		if wants(q.Qtype, e.Addr) {
			reply.Answer = append(reply.Answer, r.addrRR(q.Name, e.Addr))
		} else {
			r.negative(reply, t, r.zone, dns.RcodeSuccess)
		}
		return
	}
	r.negative(reply, t, r.zone, dns.RcodeNameError)
}

// srvTarget is one SRV record before its weight is known.
type srvTarget struct {
	name string
	port uint16
	ip   []netip.Addr
}

// answerSRV answers the SRV name of port portName over proto ("" and 0: the
// service name itself, every port). Other types at an existing SRV name are
// NODATA; an unknown port NXDOMAIN.
func (r *Responder) answerSRV(reply *dns.Msg, t *service.Table, q dns.Question, svc *service.DNSService, portName string, proto service.Protocol) {
	match := func(p service.DNSPort) bool {
		return portName == "" || (p.Name == portName && p.Protocol == proto)
	}
	exists := portName == ""
	var targets []srvTarget
	svcName := r.serviceName(svc.Name)
	if svc.Headless {
		for _, p := range svc.Ports {
			exists = exists || match(p)
		}
		for i := range svc.Endpoints {
			e := &svc.Endpoints[i]
			for _, p := range e.Ports {
				if match(p) {
					exists = true
					targets = append(targets, srvTarget{name: e.Label + "." + svcName, port: p.Port, ip: []netip.Addr{e.Addr}})
				}
			}
		}
	} else if svc.ExternalName == "" {
		for _, p := range svc.Ports {
			if match(p) {
				exists = true
				targets = append(targets, srvTarget{name: svcName, port: p.Port, ip: svc.ClusterIPs})
			}
		}
	}
	switch {
	case !exists:
		r.negative(reply, t, r.zone, dns.RcodeNameError)
		return
	case q.Qtype != dns.TypeSRV && q.Qtype != dns.TypeANY, len(targets) == 0:
		r.negative(reply, t, r.zone, dns.RcodeSuccess)
		return
	}
	// CoreDNS spreads a weight of 100 over the records.
	weight := uint16(max(1, 100/len(targets)))
	added := map[string]bool{}
	for _, tg := range targets {
		reply.Answer = append(reply.Answer, &dns.SRV{Hdr: r.hdr(q.Name, dns.TypeSRV), Priority: 0, Weight: weight, Port: tg.port, Target: tg.name})
		if added[tg.name] {
			continue
		}
		added[tg.name] = true
		for _, ip := range tg.ip {
			reply.Extra = append(reply.Extra, r.addrRR(tg.name, ip))
		}
	}
}

package admin

// The /debug views: plain-text pages of the datapath's state for people and
// for the CLI's client helpers (client.go).
//
//  1. /debug/conntrack lists the entries a ConntrackQuery selects, sorted;
//     POST /debug/conntrack/flush deletes them and answers how many;
//  2. /debug/services lists the service table's ports, endpoints and
//     skipped services;
//  3. /debug/dns shows the cluster DNS responder's addresses and counters;
//  4. /debug/rules prints the iptables rules kube-proxy would write
//     (package rules);
//  5. /debug/ipvs prints the table as ipvsadm -Ln would list it on a node
//     in IPVS mode (ipvs.go, package rules);
//  6. /debug/dial shows how flows reach endpoints (--dial-via): what the
//     auto policy remembers and the tunnels through the API server.

import (
	"bytes"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// ConntrackQuery selects conntrack entries for /debug/conntrack and its
// flush; the zero value selects every entry. Its fields are the query
// parameters of the same names (lower case).
type ConntrackQuery struct {
	// Protocol is "tcp" or "udp".
	Protocol string
	// Service is "namespace/name" (every port of the service) or
	// "namespace/name:port" (one port; "namespace/name:" is the unnamed
	// port): the service port the proxy bound the flow to.
	Service string
	// Src and Dst are the original direction's source (client) and
	// destination (ClusterIP) addresses.
	Src, Dst string
	// Endpoint is the address of the endpoint the flow was sent to.
	Endpoint string
}

func (q ConntrackQuery) values() map[string]string {
	return map[string]string{"protocol": q.Protocol, "service": q.Service, "src": q.Src, "dst": q.Dst, "endpoint": q.Endpoint}
}

// conntrackSelector is a parsed ConntrackQuery: a conntrack.Filter, plus a
// service name matched against every port of the service.
type conntrackSelector struct {
	filter conntrack.Filter
	// service, when set, matches ServicePort "ns/name" and "ns/name:*".
	service string
}

func (c conntrackSelector) match(e *conntrack.EntryInfo) bool {
	if c.service == "" {
		return true
	}
	rest, ok := strings.CutPrefix(e.ServicePort, c.service)
	return ok && (rest == "" || rest[0] == ':')
}

func parseConntrackQuery(r *http.Request) (conntrackSelector, error) {
	var sel conntrackSelector
	q := r.URL.Query()
	known := ConntrackQuery{}.values()
	for k := range q {
		if _, ok := known[k]; !ok {
			return sel, fmt.Errorf("unknown parameter %q: want protocol, service, src, dst or endpoint", k)
		}
	}
	switch p := strings.ToLower(q.Get("protocol")); p {
	case "":
	case "tcp":
		sel.filter.Protocol = conntrack.TCP
	case "udp":
		sel.filter.Protocol = conntrack.UDP
	default:
		return sel, fmt.Errorf("protocol %q: want tcp or udp", p)
	}
	if svc := q.Get("service"); svc != "" {
		ns, rest, ok := strings.Cut(svc, "/")
		if !ok || ns == "" || rest == "" || strings.HasPrefix(rest, ":") {
			return sel, fmt.Errorf("service %q: want namespace/name or namespace/name:port", svc)
		}
		if name, port, hasPort := strings.Cut(rest, ":"); hasPort {
			// One port; "ns/name:" is the unnamed port, "ns/name".
			sel.filter.ServicePort = service.PortName{Namespace: ns, Name: name, Port: port}.String()
		} else {
			sel.service = svc
		}
	}
	for _, a := range []struct {
		key string
		dst *netip.Addr
	}{{"src", &sel.filter.Src}, {"dst", &sel.filter.Dst}, {"endpoint", &sel.filter.Endpoint}} {
		if v := q.Get(a.key); v != "" {
			ip, err := netip.ParseAddr(v)
			if err != nil {
				return sel, fmt.Errorf("%s %q: want an IP address", a.key, v)
			}
			*a.dst = ip
		}
	}
	return sel, nil
}

func (s *Server) conntrackList(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Conntrack == nil {
		writeText(w, http.StatusServiceUnavailable, "no conntrack table configured\n")
		return
	}
	sel, err := parseConntrackQuery(r)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error()+"\n")
		return
	}
	entries := s.cfg.Conntrack.List(sel.filter)
	lines := make([]string, 0, len(entries))
	var buf []byte
	for i := range entries {
		if !sel.match(&entries[i]) {
			continue
		}
		buf, _ = entries[i].AppendText(buf[:0])
		if v, ok := entries[i].Owner.(interface{ Via() string }); ok {
			if via := v.Via(); via != "" { // --dial-via apiserver|auto: the way the flow went
				buf = append(append(buf, " via="...), via...)
			}
		}
		lines = append(lines, string(buf))
	}
	// conntrack -L prints in hash order; sorted is easier to read and diff.
	slices.Sort(lines)
	var out strings.Builder
	for _, l := range lines {
		out.WriteString(l)
		out.WriteByte('\n')
	}
	writeText(w, http.StatusOK, out.String())
}

func (s *Server) conntrackFlush(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.Control {
		writeText(w, http.StatusForbidden, "the conntrack flush resets flows: it is served on the control socket only (userproxy conntrack flush), not on a TCP address\n")
		return
	}
	if s.cfg.Conntrack == nil {
		writeText(w, http.StatusServiceUnavailable, "no conntrack table configured\n")
		return
	}
	sel, err := parseConntrackQuery(r)
	if err != nil {
		writeText(w, http.StatusBadRequest, err.Error()+"\n")
		return
	}
	n := 0
	if sel.service == "" {
		n = s.cfg.Conntrack.Delete(sel.filter)
	} else {
		// A whole service: delete by each port name its entries carry.
		// Entries of those ports created meanwhile match the query too.
		var ports []string
		for _, e := range s.cfg.Conntrack.List(sel.filter) {
			if sel.match(&e) && !slices.Contains(ports, e.ServicePort) {
				ports = append(ports, e.ServicePort)
			}
		}
		for _, p := range ports {
			f := sel.filter
			f.ServicePort = p
			n += s.cfg.Conntrack.Delete(f)
		}
	}
	s.log.Info("conntrack entries flushed", zap.String("query", r.URL.RawQuery), zap.Int("deleted", n))
	writeText(w, http.StatusOK, strconv.Itoa(n)+"\n")
}

func (s *Server) currentTable() *service.Table {
	if s.cfg.Table == nil {
		return nil
	}
	return s.cfg.Table()
}

func (s *Server) services(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Table == nil {
		writeText(w, http.StatusServiceUnavailable, "no service table configured\n")
		return
	}
	var b bytes.Buffer
	writeServices(&b, s.currentTable())
	if s.cfg.Notes != nil {
		if notes := s.cfg.Notes(); len(notes) > 0 {
			b.WriteString("# not served as asked\n")
			for _, n := range notes {
				b.WriteString(n + "\n")
			}
		}
	}
	writeText(w, http.StatusOK, b.String())
}

// writeServices lists the table: one line per service port with its
// verdict, one indented line per endpoint, then the skipped services.
func writeServices(b *bytes.Buffer, t *service.Table) {
	if t == nil {
		b.WriteString("# no service table yet (the source has not synced)\n")
		return
	}
	fmt.Fprintf(b, "# service table %d, built %s: %d services, %d ports, %d skipped\n",
		t.Generation(), t.Built().UTC().Format(time.RFC3339Nano), t.Services(), t.Len(), len(t.Skipped()))
	for _, p := range t.Ports() {
		fmt.Fprintf(b, "%s %s %s %s", p.Name, p.Protocol, netip.AddrPortFrom(p.ClusterIP, p.Port), p.Family)
		switch p.Verdict {
		case service.Forward:
			fmt.Fprintf(b, " forward to %d endpoints", len(p.Endpoints))
		case service.NoLocalEndpoints:
			b.WriteString(" no local endpoints: DROP")
		default:
			b.WriteString(" no endpoints: REJECT")
		}
		if p.Affinity.ClientIP {
			fmt.Fprintf(b, ", affinity ClientIP %s", p.Affinity.Timeout)
		}
		if p.InternalTrafficPolicyLocal {
			b.WriteString(", internalTrafficPolicy Local")
		}
		if p.Topology != "" {
			b.WriteString(", topology " + p.Topology)
		}
		if p.Scheduler != (service.Scheduler{}) {
			b.WriteString(", scheduler " + strings.TrimSpace(p.Scheduler.Name+" "+p.Scheduler.Flags))
		}
		if p.ProxyProtocol != "" {
			b.WriteString(", proxy-protocol " + p.ProxyProtocol)
		}
		b.WriteByte('\n')
		writeExternal(b, p)
		for i := range p.Endpoints {
			e := &p.Endpoints[i]
			b.WriteString("    " + p.EndpointKeys[i])
			for _, c := range []struct {
				on   bool
				name string
			}{{e.Ready, "ready"}, {e.Serving, "serving"}, {e.Terminating, "terminating"}, {e.Local, "local"}} {
				if c.on {
					b.WriteString(" " + c.name)
				}
			}
			if e.NodeName != "" {
				b.WriteString(" node=" + e.NodeName)
			}
			if e.Zone != "" {
				b.WriteString(" zone=" + e.Zone)
			}
			if len(e.ZoneHints) > 0 {
				b.WriteString(" zone-hints=" + strings.Join(e.ZoneHints, ","))
			}
			if len(e.NodeHints) > 0 {
				b.WriteString(" node-hints=" + strings.Join(e.NodeHints, ","))
			}
			b.WriteByte('\n')
		}
	}
	if skipped := t.Skipped(); len(skipped) > 0 {
		b.WriteString("# skipped\n")
		for _, sk := range skipped {
			b.WriteString(sk.Service.String())
			if sk.Port != "" || sk.PortNumber != 0 {
				fmt.Fprintf(b, " port %q (%d)", sk.Port, sk.PortNumber)
			}
			b.WriteString(": " + sk.Reason + "\n")
		}
	}
}

// writeExternal lists a port's external destinations, if any, with the
// external set's verdict: one line "  external ..." per kind.
func writeExternal(b *bytes.Buffer, p *service.Port) {
	if p.ExternalVerdict == service.NotService {
		return
	}
	var dsts []string
	if p.NodePort != 0 {
		dsts = append(dsts, fmt.Sprintf("nodePort %d", p.NodePort))
	}
	for _, a := range p.ExternalIPs {
		dsts = append(dsts, "externalIP "+netip.AddrPortFrom(a, p.Port).String())
	}
	for _, a := range p.LoadBalancerIPs {
		dsts = append(dsts, "loadBalancerIP "+netip.AddrPortFrom(a, p.Port).String())
	}
	b.WriteString("  external: " + strings.Join(dsts, ", "))
	switch p.ExternalVerdict {
	case service.Forward:
		fmt.Fprintf(b, "; forward to %d endpoints", len(p.ExternalEndpoints))
	case service.NoLocalEndpoints:
		b.WriteString("; no local endpoints: DROP")
	default:
		b.WriteString("; no endpoints: REJECT")
	}
	if p.ExternalPolicyLocal {
		b.WriteString(", externalTrafficPolicy Local")
	}
	if p.HealthCheckNodePort != 0 {
		fmt.Fprintf(b, ", healthCheckNodePort %d", p.HealthCheckNodePort)
	}
	if len(p.SourceRanges) > 0 {
		r := make([]string, len(p.SourceRanges))
		for i, s := range p.SourceRanges {
			r[i] = s.String()
		}
		b.WriteString(", loadBalancerSourceRanges " + strings.Join(r, ","))
	}
	b.WriteByte('\n')
}

func (s *Server) dns(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.DNS == nil {
		writeText(w, http.StatusServiceUnavailable, "cluster DNS is off (--dns=false)\n")
		return
	}
	var b bytes.Buffer
	writeDNS(&b, s.cfg.DNS.Status(), s.cfg.DNS.Stats())
	writeText(w, http.StatusOK, b.String())
}

// writeDNS prints the responder's state: one line per address, saying
// whether it answers or steps aside for a Service, then the counters.
func writeDNS(b *bytes.Buffer, st clusterdns.Status, stats clusterdns.Stats) {
	upstream := st.Upstream
	if upstream == "" {
		upstream = "none (names outside the domain are REFUSED)"
	}
	fmt.Fprintf(b, "# cluster DNS for %s, upstream %s\n", st.Domain, upstream)
	for _, a := range st.Addrs {
		if a.SteppedAsideFor != "" {
			fmt.Fprintf(b, "dns %s: stepped aside for %s (its Service owns the address; queries go to its endpoints)\n", a.Addr, a.SteppedAsideFor)
		} else {
			fmt.Fprintf(b, "dns %s: answering (udp, tcp)\n", a.Addr)
		}
	}
	fmt.Fprintf(b, "# dropped %d, truncated %d, forwarded %d, upstream errors %d; answered queries by type and rcode:\n",
		stats.Dropped, stats.Truncated, stats.Forwarded, stats.UpstreamErrors)
	for _, q := range stats.Queries {
		fmt.Fprintf(b, "%s %s %d\n", q.Type, q.Rcode, q.N)
	}
}

func (s *Server) rules(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Table == nil {
		writeText(w, http.StatusServiceUnavailable, "no service table configured\n")
		return
	}
	opts := s.cfg.Rules
	q := r.URL.Query()
	if v := q.Get("format"); v != "" {
		f, err := rules.ParseFormat(v)
		if err != nil {
			writeText(w, http.StatusBadRequest, err.Error()+"\n")
			return
		}
		opts.Format = f
	}
	switch v := q.Get("family"); v {
	case "":
	case "4", "ipv4", "IPv4":
		opts.Family = service.IPv4
	case "6", "ipv6", "IPv6":
		opts.Family = service.IPv6
	default:
		writeText(w, http.StatusBadRequest, fmt.Sprintf("family %q: want 4 or 6\n", v))
		return
	}
	var b bytes.Buffer
	if err := rules.Write(&b, s.currentTable(), opts); err != nil {
		writeText(w, http.StatusInternalServerError, err.Error()+"\n")
		return
	}
	writeText(w, http.StatusOK, b.String())
}

// DialView is what /debug/dial shows.
type DialView struct {
	// Via is the policy (--dial-via).
	Via string
	// Remembered is what the auto policy remembers per endpoint address.
	Remembered []proxy.RememberedWay
	// Tunnels maps each pod with an open tunnel ("namespace/name") to the
	// flows it carries now.
	Tunnels map[string]int
}

func (s *Server) dial(w http.ResponseWriter, _ *http.Request) {
	var v DialView
	if s.cfg.Dial != nil {
		v = s.cfg.Dial()
	} else {
		v.Via = "direct"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "dial-via %s\n", v.Via)
	if len(v.Remembered) > 0 {
		b.WriteString("# endpoint address, the way that worked, remembered for\n")
		for _, r := range v.Remembered {
			fmt.Fprintf(&b, "%s %s %s\n", r.Endpoint, r.Way, r.Left.Round(time.Second))
		}
	}
	if len(v.Tunnels) > 0 {
		b.WriteString("# tunnels through the API server: pod, flows\n")
		pods := make([]string, 0, len(v.Tunnels))
		for p := range v.Tunnels {
			pods = append(pods, p)
		}
		slices.Sort(pods)
		for _, p := range pods {
			fmt.Fprintf(&b, "%s %d\n", p, v.Tunnels[p])
		}
	}
	writeText(w, http.StatusOK, b.String())
}

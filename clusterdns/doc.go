// Package clusterdns answers cluster DNS (*.svc.<cluster-domain>) from the
// live service table, inside the proxy's network stack: the responder
// behind the DNS service IP (kubeadm's 10.96.0.10) that cluster workloads
// expect, for a laptop with no cluster DNS of its own.
//
// Names and records follow CoreDNS's kubernetes plugin (its README is the
// reference for the record shapes; the code is ours):
//
//   - A/AAAA  <svc>.<ns>.svc.<domain>: the ClusterIPs of that family; for a
//     headless service, the addresses of its published endpoints; an
//     ExternalName service is a CNAME to its external name.
//   - A/AAAA  <endpoint>.<svc>.<ns>.svc.<domain>: one endpoint of a headless
//     service, by its hostname or its dashed address (10-0-0-1).
//   - SRV     _<port>._<proto>.<svc>.<ns>.svc.<domain>: priority 0, the
//     port, target <svc>.<ns>.svc.<domain> (headless: one per endpoint,
//     target <endpoint>.<svc>...), with the targets' A/AAAA records in the
//     additional section. An SRV query for <svc>.<ns>.svc.<domain> itself
//     lists every port.
//   - PTR     the reverse name of a ClusterIP: <svc>.<ns>.svc.<domain>.
//   - SOA/NS  at <domain>: ns.dns.<domain>, whose A/AAAA are the
//     responder's own addresses.
//
// Every record has TTL 5 s. A name in the domain that does not exist is
// NXDOMAIN with the SOA in the authority section (negative TTL 5 s); a name
// that exists without records of the asked type is NODATA (NOERROR, no
// answer, the SOA): that holds for <domain>, svc.<domain>, <ns>.svc.<domain>
// of a namespace with a service (unknown namespaces are NXDOMAIN, as in
// CoreDNS), _<proto>.<svc>... when the service has a port of that protocol,
// a headless service without endpoints, and, for example, AAAA of a
// service with only an IPv4 ClusterIP. Pod records (<ip>.<ns>.pod...) are
// not served (CoreDNS's "pods disabled", its default): NXDOMAIN. PTR
// queries for addresses inside the service CIDRs that no ClusterIP has are
// NXDOMAIN. Everything else is REFUSED, or forwarded to the upstream
// server when one is configured (SERVFAIL when it does not answer in
// time).
//
// The core is Responder.Answer, a pure function of a query and the table
// (except forwarding), tested without sockets. ServeUDP and ServeTCP serve
// one client flow each over a net.Conn: UDP replies larger than 512 bytes,
// or than the client's EDNS0 size, are truncated with the TC bit (the
// client then asks over TCP); TCP carries length-framed messages, several
// per connection, until the client closes or stays idle. A query that does
// not parse is answered FORMERR when its header can be read, and not at
// all otherwise (nor is any message with the response bit set).
//
// Callers: cmd wires a Responder into the proxy as a proxy.LocalHandler at
// the DNS service IP; admin reads Stats and Status.
//
// It imports service of userproxy (and github.com/miekg/dns, zap); never
// proxy, netstack or gVisor. Responder is safe for concurrent use; it
// starts no goroutine of its own (forwarding runs on the caller's).
package clusterdns

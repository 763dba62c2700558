// Package service turns Kubernetes Services and EndpointSlices into an
// immutable Table of service ports with their usable endpoints, in the order
// and with the selection rules of kube-proxy's iptables mode, and coalesces
// changes into new tables (Tracker).
//
// Callers: source (feeds objects into a Tracker through the Handler
// interface), proxy (looks flows up in Tracker.Current, reacts to Changes),
// clusterdns (answers names from the table's DNS view: DNSService, DNSByIP,
// DNSNamespace), admin (lists Ports, Skipped and Stats).
//
// The DNS view (dns.go) is built in the same sync as the ports: every
// Service with a ClusterIP, every headless service with the endpoints DNS
// publishes (ready ones, or all with publishNotReadyAddresses), and every
// ExternalName service. Headless and ExternalName services are in the view
// but still not proxied.
//
// What it matches, and where kube-proxy does it:
//   - which services are proxied: servicechangetracker.go and
//     ShouldSkipService (headless and ExternalName are skipped; so is SCTP,
//     which kube-proxy supports and we do not);
//   - which endpoints, in which order: endpointslicecache.go (merge slices
//     by port name and protocol, de-duplicate by "ip:port", sort by that
//     string) and topology.go CategorizeEndpoints (Ready endpoints allowed by
//     topology hints, else Serving+Terminating; internalTrafficPolicy Local);
//     slices labelled service.kubernetes.io/headless, which kube-proxy's
//     informer never lists (cmd/kube-proxy/app/server.go), feed the DNS
//     view only;
//   - what a flow gets: proxier.go syncProxyRules (no endpoints: REJECT;
//     Local policy with no local endpoint: DROP);
//   - external destinations (external.go): NodePorts, externalIPs and
//     load-balancer IPs with ipMode unset or VIP, per family, as
//     serviceport.go newBaseServiceInfo reads them; externalTrafficPolicy
//     Local (local endpoints, terminating fallback, none: DROP) and the
//     KUBE-EXT short-circuit to the cluster set for traffic from this host;
//     loadBalancerSourceRanges (KUBE-FW) for LB IPs. Table.Lookup answers
//     ClusterIPs, LookupExternal externalIPs and LB IPs, LookupNodePort
//     NodePorts; ExternalAddrs lists the addresses to route.
//
// Deliberate differences: one Port per IP family of a dual-stack service
// (kube-proxy runs one proxier per family, which is the same thing); where
// two slices carry the same endpoint the first slice by name wins (kube-proxy
// keeps an arbitrary copy; both prefer a local one); node hints
// (PreferSameNode) always apply, as with kube-proxy's feature gate on; two
// services claiming one external IP:port or NodePort resolve to the lower
// name (kube-proxy's outcome depends on map order); the source ranges'
// allowance for the node's own LB IPs is not modelled (see AllowsSource).
//
// Concurrency: a Table is immutable and read without locks; a Tracker is
// safe for concurrent use and owns no goroutine (builds run in the caller's
// or a timer's goroutine, see Tracker). Time comes from a Clock.
//
// It is pure: it imports only k8s.io/api and k8s.io/apimachinery types to
// convert them, and no other userproxy package; no client-go, no logging —
// it reports through return values, Skipped and Stats.
package service

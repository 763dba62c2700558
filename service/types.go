package service

import (
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// Protocol is the transport protocol of a service port. Its values are the
// IANA protocol numbers, so the datapath can compare them with the IP header
// directly. The zero value is no protocol and matches nothing.
type Protocol uint8

// The protocols a Table serves. SCTP is refused (see Skipped).
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

// String returns the Kubernetes spelling: "TCP", "UDP", or "proto(N)".
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return "proto(" + strconv.Itoa(int(p)) + ")"
}

// Family is an IP family. kube-proxy runs one proxier per family, so a
// dual-stack Service yields one Port per family, each with the endpoints of
// its own family only.
type Family uint8

// The IP families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// String returns "IPv4" or "IPv6" (the spelling of v1.IPFamily).
func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return "family(" + strconv.Itoa(int(f)) + ")"
}

func familyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// ServiceName names a Service: its namespace and name.
type ServiceName struct {
	Namespace, Name string
}

// String returns "namespace/name", like types.NamespacedName.
func (n ServiceName) String() string { return n.Namespace + "/" + n.Name }

func (n ServiceName) less(o ServiceName) bool {
	if n.Namespace != o.Namespace {
		return n.Namespace < o.Namespace
	}
	return n.Name < o.Name
}

// PortName names one port of a Service, as kube-proxy's ServicePortName does.
// Port is the service port's name, empty for a single unnamed port.
type PortName struct {
	Namespace, Name, Port string
}

// String returns "namespace/name:port", or "namespace/name" when the port has
// no name — the format of kube-proxy's ServicePortName.String (used in
// iptables comments, so the rules printer can reproduce them).
func (n PortName) String() string {
	if n.Port == "" {
		return n.Namespace + "/" + n.Name
	}
	return n.Namespace + "/" + n.Name + ":" + n.Port
}

// Service returns the name of the Service the port belongs to.
func (n PortName) Service() ServiceName { return ServiceName{n.Namespace, n.Name} }

func (n PortName) compare(o PortName) int {
	switch {
	case n.Namespace != o.Namespace:
		return cmpString(n.Namespace, o.Namespace)
	case n.Name != o.Name:
		return cmpString(n.Name, o.Name)
	}
	return cmpString(n.Port, o.Port)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Endpoint is one backend of a service port, from an EndpointSlice.
type Endpoint struct {
	// Addr is the endpoint's first address and the port number of the
	// EndpointSlice port that matched the service port.
	Addr netip.AddrPort
	// NodeName and Zone are copied from the EndpointSlice ("" when unset).
	NodeName string
	Zone     string
	// Pod is the Pod the EndpointSlice's targetRef names; zero when the
	// endpoint has no targetRef of kind Pod. It is how an endpoint is
	// reached through the API server (pods/portforward).
	Pod PodRef
	// Local is true when NodeName is this node's name (Config.NodeName).
	Local bool
	// Conditions, with the EndpointSlice defaults applied: Ready and Serving
	// default to true when unset, Terminating to false.
	Ready, Serving, Terminating bool
	// ZoneHints and NodeHints are the topology hints (hints.forZones,
	// hints.forNodes), sorted; nil when none.
	ZoneHints []string
	NodeHints []string
}

// PodRef names a Pod by namespace and name.
type PodRef struct {
	Namespace, Name string
}

// IsZero reports whether r names no Pod.
func (r PodRef) IsZero() bool { return r.Name == "" }

// String returns "namespace/name", or "" for the zero PodRef.
func (r PodRef) String() string {
	if r.Name == "" {
		return ""
	}
	return r.Namespace + "/" + r.Name
}

// Key returns "ip:port", or "[ip]:port" for IPv6: kube-proxy's
// Endpoint.String(), the string endpoints are de-duplicated and sorted by.
// It allocates; Port.EndpointKeys holds the keys precomputed.
func (e Endpoint) Key() string { return e.Addr.String() }

func (e *Endpoint) equal(o *Endpoint) bool {
	return e.Addr == o.Addr && e.NodeName == o.NodeName && e.Zone == o.Zone && e.Pod == o.Pod &&
		e.Local == o.Local && e.Ready == o.Ready && e.Serving == o.Serving &&
		e.Terminating == o.Terminating && equalStrings(e.ZoneHints, o.ZoneHints) &&
		equalStrings(e.NodeHints, o.NodeHints)
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Affinity is a service port's session affinity.
type Affinity struct {
	// ClientIP is true for sessionAffinity: ClientIP.
	ClientIP bool
	// Timeout is sessionAffinityConfig.clientIP.timeoutSeconds, defaulted to
	// DefaultAffinityTimeout; zero when ClientIP is false.
	Timeout time.Duration
}

// Scheduler is the endpoint scheduler a Service asks for with its
// annotations, as written there; the proxy parses it (balancer's
// ParseScheduler) and the Tracker refuses, through Config.CheckScheduler,
// a Service whose scheduler does not parse.
type Scheduler struct {
	// Name is the userproxy.io/scheduler annotation: "random" or one of
	// IPVS's schedulers ("rr", "lc", "mh", ...); "" for the default.
	Name string
	// Flags is the userproxy.io/scheduler-flags annotation, in ipvsadm's
	// -b syntax ("mh-port,mh-fallback"); "" for none.
	Flags string
}

// The annotations a Service chooses its scheduler with.
const (
	AnnotationScheduler      = "userproxy.io/scheduler"
	AnnotationSchedulerFlags = "userproxy.io/scheduler-flags"
	// AnnotationProxyProtocol asks for a PROXY protocol header (v1 or v2)
	// on each endpoint connection (Port.ProxyProtocol).
	AnnotationProxyProtocol = "userproxy.io/proxy-protocol"
)

// Session affinity limits, as the API server defaults and validates them.
const (
	DefaultAffinityTimeout = 10800 * time.Second
	MaxAffinityTimeout     = 86400 * time.Second
)

// Topology modes of a Port, as kube-proxy's topologyModeFromHints names them
// ("" is the default: no topology filtering).
const (
	TopologyPreferSameZone = "PreferSameZone"
	TopologyPreferSameNode = "PreferSameNode"
)

// Verdict is what a lookup tells the datapath to do with a new flow.
type Verdict uint8

// The verdicts. The zero value is NotService, so an unset verdict rejects.
const (
	// NotService: the destination IP is no ClusterIP of any service. REJECT.
	NotService Verdict = iota
	// UnknownPort: the IP is a ClusterIP, but no port of that service has
	// this port number and protocol. REJECT.
	UnknownPort
	// NoEndpoints: the service port has no usable endpoint anywhere. REJECT
	// (kube-proxy's KUBE-SERVICES "has no endpoints" reject rule).
	NoEndpoints
	// NoLocalEndpoints: internalTrafficPolicy Local (for Verdict) or
	// externalTrafficPolicy Local (for ExternalVerdict) and no usable
	// endpoint on this node, though there are some elsewhere. DROP
	// (kube-proxy's "has no local endpoints" drop rules in KUBE-SERVICES
	// and KUBE-EXTERNAL-SERVICES).
	NoLocalEndpoints
	// Forward: pick one of Port.Endpoints.
	Forward
)

// String returns the verdict's name.
func (v Verdict) String() string {
	switch v {
	case NotService:
		return "NotService"
	case UnknownPort:
		return "UnknownPort"
	case NoEndpoints:
		return "NoEndpoints"
	case NoLocalEndpoints:
		return "NoLocalEndpoints"
	case Forward:
		return "Forward"
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Reject reports whether the flow is to be refused with an ICMP
// port-unreachable.
func (v Verdict) Reject() bool { return v == NotService || v == UnknownPort || v == NoEndpoints }

// Drop reports whether the flow is to be dropped silently.
func (v Verdict) Drop() bool { return v == NoLocalEndpoints }

// Port is one service port of one IP family: what traffic to ClusterIP:Port
// over Protocol becomes. A Port is immutable once it is in a Table, and is
// shared between successive tables while nothing about it changes: a changed
// port is a new *Port, so pointer equality means "unchanged".
type Port struct {
	// Name is namespace/name:portname.
	Name PortName
	// Protocol is TCP or UDP.
	Protocol Protocol
	// Family is the IP family of ClusterIP and of every endpoint.
	Family Family
	// ClusterIP is the service's ClusterIP of this family: the address this
	// Port answers on.
	ClusterIP netip.Addr
	// ClusterIPs are all of the service's ClusterIPs, in spec order (both
	// families for a dual-stack service). For display; matching uses
	// ClusterIP.
	ClusterIPs []netip.Addr
	// Port is the service port number.
	Port uint16
	// Endpoints are the endpoints cluster traffic from this node may use,
	// chosen as kube-proxy's CategorizeEndpoints chooses them, de-duplicated
	// by Key across slices and sorted by Key (string order: "10.0.0.10:80"
	// before "10.0.0.2:80"), the order of kube-proxy's iptables rules.
	// Empty unless Verdict is Forward.
	Endpoints []Endpoint
	// EndpointKeys are Endpoints[i].Key(), in the same order.
	EndpointKeys []string
	// Serving, for UDP ports, are every endpoint that is serving (Ready, or
	// Terminating and still serving), whatever the traffic policy and
	// topology, in Endpoints' order: the endpoints whose UDP flows survive
	// a table change (kube-proxy pkg/proxy/conntrack/cleanup.go). nil for
	// TCP ports and when no endpoint serves.
	Serving []netip.AddrPort
	// Affinity is the session affinity of the service.
	Affinity Affinity
	// Scheduler is what the service's annotations ask for; the zero value
	// means the proxy's default (--scheduler).
	Scheduler Scheduler
	// ProxyProtocol is the userproxy.io/proxy-protocol annotation as
	// written ("", "v1", "v2"): the PROXY protocol header the proxy sends
	// first on each endpoint connection. The proxy parses it.
	ProxyProtocol string
	// InternalTrafficPolicyLocal is true for internalTrafficPolicy: Local.
	InternalTrafficPolicyLocal bool
	// Topology is the topology mode used to pick Endpoints: "",
	// TopologyPreferSameZone or TopologyPreferSameNode.
	Topology string
	// Verdict is what a lookup of this port answers: Forward, NoEndpoints
	// or NoLocalEndpoints.
	Verdict Verdict

	// External destinations, of this Port's family only (kube-proxy
	// pkg/proxy/serviceport.go newBaseServiceInfo; see external.go).

	// NodePort is spec.ports[].nodePort, 0 when none.
	NodePort uint16
	// ExternalIPs are spec.externalIPs of this family, in spec order,
	// without repeats; invalid entries are left out.
	ExternalIPs []netip.Addr
	// LoadBalancerIPs are status.loadBalancer.ingress[].ip of this family
	// whose ipMode is unset or VIP, in status order, without repeats. An
	// ingress IP with ipMode Proxy is not captured: the load balancer
	// delivers that traffic to the nodes itself.
	LoadBalancerIPs []netip.Addr
	// SourceRanges are spec.loadBalancerSourceRanges of this family,
	// trimmed, parsed and masked; invalid entries are left out. Empty
	// (also when every range is of the other family) lets every source in.
	// They apply to LoadBalancerIPs only (AllowsSource, Firewalls).
	SourceRanges []netip.Prefix
	// ExternalPolicyLocal is externalTrafficPolicy: Local on a service that
	// is externally accessible (type NodePort or LoadBalancer, or
	// ClusterIP with externalIPs): kube-proxy's ExternalPolicyLocal.
	ExternalPolicyLocal bool
	// HealthCheckNodePort is spec.healthCheckNodePort when kube-proxy
	// serves it (type LoadBalancer with ExternalPolicyLocal), else 0.
	HealthCheckNodePort uint16
	// ExternalEndpoints are the endpoints a new flow from elsewhere to an
	// external destination (NodePort, ExternalIPs, LoadBalancerIPs) may
	// use: the local ones (with the terminating fallback) under
	// ExternalPolicyLocal, else the cluster set. Sorted like Endpoints;
	// shared with Endpoints or ClusterEndpoints when equal. Empty unless
	// ExternalVerdict is Forward.
	ExternalEndpoints []Endpoint
	// ExternalEndpointKeys are ExternalEndpoints[i].Key(), in order.
	ExternalEndpointKeys []string
	// ExternalVerdict is what a lookup of an external destination answers:
	// Forward, NoEndpoints (REJECT) or NoLocalEndpoints (DROP); NotService
	// when the Port has no external destination.
	ExternalVerdict Verdict
	// ClusterEndpoints are the cluster-policy endpoints (those Endpoints
	// holds under internalTrafficPolicy Cluster), which a flow from this
	// host to an external destination uses whatever the policies
	// (ExternalFromHost). Set only when the Port has an external
	// destination; shared with Endpoints when equal.
	ClusterEndpoints []Endpoint
	// ClusterEndpointKeys are ClusterEndpoints[i].Key(), in order.
	ClusterEndpointKeys []string
}

func (p *Port) equal(o *Port) bool {
	return p.Name == o.Name && p.Protocol == o.Protocol && p.Family == o.Family &&
		p.ClusterIP == o.ClusterIP && p.Port == o.Port && p.Affinity == o.Affinity && p.Scheduler == o.Scheduler && p.ProxyProtocol == o.ProxyProtocol &&
		p.InternalTrafficPolicyLocal == o.InternalTrafficPolicyLocal &&
		p.Topology == o.Topology && p.Verdict == o.Verdict &&
		slices.Equal(p.ClusterIPs, o.ClusterIPs) && slices.Equal(p.Serving, o.Serving) &&
		equalEndpoints(p.Endpoints, o.Endpoints) &&
		p.NodePort == o.NodePort && p.ExternalPolicyLocal == o.ExternalPolicyLocal &&
		p.HealthCheckNodePort == o.HealthCheckNodePort && p.ExternalVerdict == o.ExternalVerdict &&
		slices.Equal(p.ExternalIPs, o.ExternalIPs) && slices.Equal(p.LoadBalancerIPs, o.LoadBalancerIPs) &&
		slices.Equal(p.SourceRanges, o.SourceRanges) &&
		equalEndpoints(p.ExternalEndpoints, o.ExternalEndpoints) &&
		equalEndpoints(p.ClusterEndpoints, o.ClusterEndpoints)
}

func equalEndpoints(a, b []Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].equal(&b[i]) {
			return false
		}
	}
	return true
}

// comparePorts orders ports by name, then protocol, then family: the order
// of Table.Ports.
func comparePorts(a, b *Port) int {
	if c := a.Name.compare(b.Name); c != 0 {
		return c
	}
	if a.Protocol != b.Protocol {
		return int(a.Protocol) - int(b.Protocol)
	}
	return int(a.Family) - int(b.Family)
}

// Skipped is a Service, or one port of it, that the table leaves out, and why.
type Skipped struct {
	Service ServiceName
	// Port is the service port's name when only that port is skipped (an
	// unnamed port is "" too: see PortNumber); empty with PortNumber 0 when
	// the whole service is skipped.
	Port       string
	PortNumber uint16
	Reason     string
}

// Reasons for skipping, as Skipped.Reason.
const (
	ReasonHeadless     = "headless service (clusterIP: None)"
	ReasonExternalName = "ExternalName service"
	ReasonNoClusterIP  = "service has no ClusterIP"
	ReasonSCTP         = "protocol SCTP is not supported"
)

package service

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// This file turns API objects into the compact forms the Tracker keeps
// (svcInfo, sliceInfo), at handler time, as kube-proxy's change trackers do
// (servicechangetracker.go serviceToServiceMap, endpointslicecache.go
// newEndpointSliceInfo). Conversion is lenient: what kube-proxy would ignore
// is ignored, what it cannot proxy is recorded as Skipped. Strict checking
// for hand-written files is in validate.go.

// svcInfo is what the Tracker keeps of a Service.
type svcInfo struct {
	name ServiceName
	// skip is why the whole service is left out ("" if it is not).
	skip string
	// clusterIPs are the parsed ClusterIPs in spec order, at most one per
	// family.
	clusterIPs []netip.Addr
	// ports are the proxied ports, in spec order (they are also the DNS
	// view's ports of a service with a ClusterIP).
	ports []DNSPort
	// nodePorts are the ports' spec.ports[].nodePort, index for index; 0
	// for none or out of range.
	nodePorts []uint16
	// ext is what the service says about external destinations
	// (external.go).
	ext externalInfo
	// skipped lists the whole service (when skip != "") or its skipped ports.
	skipped   []Skipped
	affinity  Affinity
	itpLocal  bool
	scheduler Scheduler
	proxyProt string
	// dns is what cluster DNS publishes of the service, when hasDNS; for a
	// headless service, the endpoints are added at build time from its
	// slices (buildDNS). Kept by value: one allocation less per service.
	dns    DNSService
	hasDNS bool
}

// newSvcInfo converts a Service, following kube-proxy's ShouldSkipService
// (headless and ExternalName services are not proxied) and newBaseServiceInfo
// (serviceport.go).
//
// checkScheduler, when set, checks the scheduler the Service's annotations
// ask for (Config.CheckScheduler); a Service it refuses is skipped whole.
func newSvcInfo(s *v1.Service, checkScheduler func(name, flags string) error) *svcInfo {
	info := &svcInfo{name: ServiceName{s.Namespace, s.Name}}
	skipAll := func(reason string) *svcInfo {
		info.skip = reason
		info.clusterIPs, info.ports, info.nodePorts = nil, nil, nil
		info.ext = externalInfo{}
		info.skipped = []Skipped{{Service: info.name, Reason: reason}}
		return info
	}
	if s.Spec.Type == v1.ServiceTypeExternalName {
		if s.Spec.ExternalName != "" {
			info.dns, info.hasDNS = DNSService{Name: info.name, ExternalName: s.Spec.ExternalName}, true
		}
		return skipAll(ReasonExternalName)
	}
	raw := s.Spec.ClusterIPs
	if len(raw) == 0 && s.Spec.ClusterIP != "" {
		raw = []string{s.Spec.ClusterIP}
	}
	primary := s.Spec.ClusterIP
	if primary == "" && len(raw) > 0 {
		primary = raw[0]
	}
	switch primary {
	case v1.ClusterIPNone:
		info.dns = DNSService{Name: info.name, Headless: true, Ports: dnsPorts(s),
			PublishNotReadyAddresses: s.Spec.PublishNotReadyAddresses}
		info.hasDNS = true
		return skipAll(ReasonHeadless)
	case "":
		return skipAll(ReasonNoClusterIP)
	}
	var seen [2]bool
	for i, str := range raw {
		ip, err := netip.ParseAddr(str)
		if err != nil || ip.Zone() != "" || ip.Is4In6() {
			return skipAll(fmt.Sprintf("invalid spec.clusterIPs[%d] %q", i, str))
		}
		f := 0
		if ip.Is6() {
			f = 1
		}
		if seen[f] {
			return skipAll(fmt.Sprintf("spec.clusterIPs[%d] %q: a second %s ClusterIP", i, str, familyOf(ip)))
		}
		seen[f] = true
		info.clusterIPs = append(info.clusterIPs, ip)
	}

	if s.Spec.SessionAffinity == v1.ServiceAffinityClientIP {
		info.affinity = Affinity{ClientIP: true, Timeout: DefaultAffinityTimeout}
		if c := s.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
			secs := time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second
			if secs <= 0 || secs > MaxAffinityTimeout {
				return skipAll(fmt.Sprintf("invalid sessionAffinityConfig.clientIP.timeoutSeconds %d", *c.ClientIP.TimeoutSeconds))
			}
			info.affinity.Timeout = secs
		}
	}
	info.itpLocal = s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == v1.ServiceInternalTrafficPolicyLocal
	info.scheduler = Scheduler{Name: s.Annotations[AnnotationScheduler], Flags: s.Annotations[AnnotationSchedulerFlags]}
	info.proxyProt = s.Annotations[AnnotationProxyProtocol]
	if info.scheduler != (Scheduler{}) && checkScheduler != nil {
		if err := checkScheduler(info.scheduler.Name, info.scheduler.Flags); err != nil {
			return skipAll(fmt.Sprintf("annotation %s: %v", AnnotationScheduler, err))
		}
	}
	info.ext = newExternalInfo(s)

	for _, sp := range s.Spec.Ports {
		skipPort := func(reason string) {
			info.skipped = append(info.skipped, Skipped{Service: info.name, Port: sp.Name, PortNumber: uint16(max(0, min(sp.Port, 65535))), Reason: reason})
		}
		var proto Protocol
		switch sp.Protocol {
		case v1.ProtocolTCP, "":
			proto = TCP
		case v1.ProtocolUDP:
			proto = UDP
		case v1.ProtocolSCTP:
			skipPort(ReasonSCTP)
			continue
		default:
			skipPort(fmt.Sprintf("unknown protocol %q", sp.Protocol))
			continue
		}
		if sp.Port < 1 || sp.Port > 65535 {
			skipPort(fmt.Sprintf("invalid port number %d", sp.Port))
			continue
		}
		ps := DNSPort{Name: sp.Name, Protocol: proto, Port: uint16(sp.Port)}
		dup := false
		for _, o := range info.ports {
			if o.Name == ps.Name || (o.Port == ps.Port && o.Protocol == ps.Protocol) {
				dup = true
			}
		}
		if dup {
			skipPort("duplicate port name or port number and protocol")
			continue
		}
		info.ports = append(info.ports, ps)
		var np uint16
		if sp.NodePort > 0 && sp.NodePort <= 65535 {
			np = uint16(sp.NodePort)
		}
		info.nodePorts = append(info.nodePorts, np)
	}
	info.dns = DNSService{Name: info.name, ClusterIPs: info.clusterIPs, Ports: info.ports}
	info.hasDNS = true
	return info
}

// dnsPorts returns the TCP and UDP ports of a headless service for SRV
// records, in spec order: every port with a valid number, named or not (an
// unnamed port is only in the answers to an SRV query for the service name
// itself).
func dnsPorts(s *v1.Service) []DNSPort {
	var out []DNSPort
	for _, sp := range s.Spec.Ports {
		proto, ok := protocolOf(sp.Protocol)
		if !ok || sp.Port < 1 || sp.Port > 65535 {
			continue
		}
		out = append(out, DNSPort{Name: sp.Name, Protocol: proto, Port: uint16(sp.Port)})
	}
	return out
}

// protocolOf converts a service or endpoint port's protocol ("" is TCP);
// ok is false for SCTP and unknown protocols.
func protocolOf(p v1.Protocol) (Protocol, bool) {
	switch p {
	case v1.ProtocolTCP, "":
		return TCP, true
	case v1.ProtocolUDP:
		return UDP, true
	}
	return 0, false
}

// sliceInfo is what the Tracker keeps of an EndpointSlice.
type sliceInfo struct {
	name string
	// family is the slice's address type; slices of other address types
	// (FQDN) are not kept at all.
	family Family
	// dnsOnly is true for a slice labelled service.kubernetes.io/headless,
	// as the EndpointSlice controller labels every slice of a headless
	// Service: cluster DNS publishes its endpoints, the datapath never uses
	// them (kube-proxy's EndpointSlice informer does not even list such a
	// slice: labelSelectorNoHeadlessEndpoints in cmd/kube-proxy/app/server.go).
	dnsOnly   bool
	ports     []slicePort
	endpoints []sliceEndpoint
}

type slicePort struct {
	name  string
	proto Protocol
	port  uint16
}

type sliceEndpoint struct {
	addr                        netip.Addr
	hostname                    string
	nodeName, zone              string
	pod                         PodRef
	ready, serving, terminating bool
	zoneHints, nodeHints        []string
}

// sliceKey returns the service an EndpointSlice belongs to (its namespace
// and kubernetes.io/service-name label), as kube-proxy's
// endpointSliceCacheKeys does; ok is false when it has none.
func sliceKey(es *discoveryv1.EndpointSlice) (svc ServiceName, ok bool) {
	name := es.Labels[discoveryv1.LabelServiceName]
	if name == "" || es.Namespace == "" || es.Name == "" {
		return ServiceName{}, false
	}
	return ServiceName{es.Namespace, name}, true
}

// newSliceInfo converts an EndpointSlice as kube-proxy's
// newEndpointSliceInfo and addEndpoints do: ports without a name or a
// number are ignored, each endpoint counts by its first address, an address
// of the wrong family is ignored, unset conditions take their defaults; a
// slice labelled service.kubernetes.io/headless is kept for DNS only.
// It returns nil for an address type kube-proxy does not handle (FQDN).
func newSliceInfo(es *discoveryv1.EndpointSlice) *sliceInfo {
	info := &sliceInfo{name: es.Name}
	_, info.dnsOnly = es.Labels[v1.IsHeadlessService]
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		info.family = IPv4
	case discoveryv1.AddressTypeIPv6:
		info.family = IPv6
	default:
		return nil
	}
	for _, p := range es.Ports {
		if p.Name == nil || p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
			continue
		}
		proto := TCP
		if p.Protocol != nil {
			switch *p.Protocol {
			case v1.ProtocolTCP:
			case v1.ProtocolUDP:
				proto = UDP
			default:
				continue
			}
		}
		info.ports = append(info.ports, slicePort{name: *p.Name, proto: proto, port: uint16(*p.Port)})
	}
	info.endpoints = make([]sliceEndpoint, 0, len(es.Endpoints))
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		if len(e.Addresses) == 0 {
			continue
		}
		addr, err := netip.ParseAddr(e.Addresses[0])
		if err != nil || addr.Zone() != "" || addr.Is4In6() || familyOf(addr) != info.family {
			continue
		}
		se := sliceEndpoint{
			addr:        addr,
			ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
			serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
			terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		}
		if e.Hostname != nil {
			se.hostname = *e.Hostname
		}
		if e.NodeName != nil {
			se.nodeName = *e.NodeName
		}
		if e.Zone != nil {
			se.zone = *e.Zone
		}
		if r := e.TargetRef; r != nil && r.Kind == "Pod" && r.Name != "" {
			// A targetRef without a namespace is in the slice's own.
			se.pod = PodRef{Namespace: r.Namespace, Name: r.Name}
			if se.pod.Namespace == "" {
				se.pod.Namespace = es.Namespace
			}
		}
		if h := e.Hints; h != nil {
			for _, z := range h.ForZones {
				se.zoneHints = append(se.zoneHints, z.Name)
			}
			for _, n := range h.ForNodes {
				se.nodeHints = append(se.nodeHints, n.Name)
			}
			se.zoneHints = sortedSet(se.zoneHints)
			se.nodeHints = sortedSet(se.nodeHints)
		}
		info.endpoints = append(info.endpoints, se)
	}
	return info
}

func sortedSet(s []string) []string {
	if len(s) < 2 {
		return s
	}
	slices.Sort(s)
	return slices.Compact(s)
}

// triggerTime returns the EndpointSlice's
// endpoints.kubernetes.io/last-change-trigger-time annotation, or the zero
// time when it is absent or unparsable (kube-proxy's getLastChangeTriggerTime).
func triggerTime(es *discoveryv1.EndpointSlice) time.Time {
	s, ok := es.Annotations[v1.EndpointsLastChangeTriggerTime]
	if !ok {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

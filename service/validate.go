package service

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ValidateService checks the fields of a Service that the proxy reads, the
// way the API server would, and returns every problem with its field path
// (for example `spec.clusterIP: Invalid value: "10.0.0.300": must be a valid
// IP address or "None"`), or nil. Sources of hand-written objects (files)
// use it to refuse nonsense; the Tracker itself is lenient and skips what it
// cannot proxy.
func ValidateService(svc *v1.Service) error {
	var errs field.ErrorList
	errs = append(errs, validateMeta(svc.Namespace, svc.Name, validation.IsDNS1035Label)...)
	spec := field.NewPath("spec")

	switch svc.Spec.Type {
	case "", v1.ServiceTypeClusterIP, v1.ServiceTypeNodePort, v1.ServiceTypeLoadBalancer, v1.ServiceTypeExternalName:
	default:
		errs = append(errs, field.NotSupported(spec.Child("type"), svc.Spec.Type,
			[]string{string(v1.ServiceTypeClusterIP), string(v1.ServiceTypeNodePort), string(v1.ServiceTypeLoadBalancer), string(v1.ServiceTypeExternalName)}))
	}

	headless := svc.Spec.ClusterIP == v1.ClusterIPNone
	if svc.Spec.ClusterIP != "" && !headless {
		if _, err := parseIP(svc.Spec.ClusterIP); err != nil {
			errs = append(errs, field.Invalid(spec.Child("clusterIP"), svc.Spec.ClusterIP, `must be a valid IP address or "None"`))
		}
	}
	ipsPath := spec.Child("clusterIPs")
	if len(svc.Spec.ClusterIPs) > 2 {
		errs = append(errs, field.TooMany(ipsPath, len(svc.Spec.ClusterIPs), 2))
	}
	var families []Family
	for i, s := range svc.Spec.ClusterIPs {
		p := ipsPath.Index(i)
		if s == v1.ClusterIPNone {
			if i != 0 || len(svc.Spec.ClusterIPs) != 1 {
				errs = append(errs, field.Invalid(p, s, `"None" must be the only ClusterIP`))
			}
			continue
		}
		ip, err := parseIP(s)
		if err != nil {
			errs = append(errs, field.Invalid(p, s, "must be a valid IP address"))
			continue
		}
		for _, f := range families {
			if f == familyOf(ip) {
				errs = append(errs, field.Invalid(p, s, "at most one ClusterIP per IP family"))
			}
		}
		families = append(families, familyOf(ip))
	}
	if len(svc.Spec.ClusterIPs) > 0 && svc.Spec.ClusterIP != "" && svc.Spec.ClusterIPs[0] != svc.Spec.ClusterIP {
		errs = append(errs, field.Invalid(ipsPath.Index(0), svc.Spec.ClusterIPs[0], "must match spec.clusterIP"))
	}

	portsPath := spec.Child("ports")
	if len(svc.Spec.Ports) == 0 && !headless && svc.Spec.Type != v1.ServiceTypeExternalName {
		errs = append(errs, field.Required(portsPath, "a service with a ClusterIP needs at least one port"))
	}
	names := map[string]bool{}
	type numProto struct {
		port  int32
		proto v1.Protocol
	}
	seen := map[numProto]bool{}
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		p := portsPath.Index(i)
		if sp.Name == "" {
			if len(svc.Spec.Ports) > 1 {
				errs = append(errs, field.Required(p.Child("name"), "required when there is more than one port"))
			}
		} else {
			for _, msg := range validation.IsDNS1123Label(sp.Name) {
				errs = append(errs, field.Invalid(p.Child("name"), sp.Name, msg))
			}
			if names[sp.Name] {
				errs = append(errs, field.Duplicate(p.Child("name"), sp.Name))
			}
			names[sp.Name] = true
		}
		if sp.Port < 1 || sp.Port > 65535 {
			errs = append(errs, field.Invalid(p.Child("port"), sp.Port, "must be between 1 and 65535"))
		}
		proto := sp.Protocol
		switch proto {
		case "":
			proto = v1.ProtocolTCP
		case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
		default:
			errs = append(errs, field.NotSupported(p.Child("protocol"), sp.Protocol, []string{"TCP", "UDP", "SCTP"}))
		}
		if seen[numProto{sp.Port, proto}] {
			errs = append(errs, field.Duplicate(p, fmt.Sprintf("%d/%s", sp.Port, proto)))
		}
		seen[numProto{sp.Port, proto}] = true
		errs = append(errs, validateTargetPort(p.Child("targetPort"), sp.TargetPort)...)
	}

	switch svc.Spec.SessionAffinity {
	case "", v1.ServiceAffinityNone, v1.ServiceAffinityClientIP:
	default:
		errs = append(errs, field.NotSupported(spec.Child("sessionAffinity"), svc.Spec.SessionAffinity, []string{"None", "ClientIP"}))
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		if ts := *c.ClientIP.TimeoutSeconds; ts < 1 || ts > int32(MaxAffinityTimeout.Seconds()) {
			errs = append(errs, field.Invalid(spec.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds"), ts, "must be between 1 and 86400"))
		}
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		switch *p {
		case v1.ServiceInternalTrafficPolicyCluster, v1.ServiceInternalTrafficPolicyLocal:
		default:
			errs = append(errs, field.NotSupported(spec.Child("internalTrafficPolicy"), *p, []string{"Cluster", "Local"}))
		}
	}
	errs = append(errs, validateExternal(svc)...)
	return errs.ToAggregate()
}

// validateExternal checks the external fields as the API server does
// (pkg/apis/core/validation/validation.go: ValidateService's nodePort,
// externalIPs and loadBalancerSourceRanges checks,
// validateServiceExternalTrafficPolicy, ValidateLoadBalancerStatus), with
// the same field paths. What the API server itself fills in is not
// demanded of a file: an externalTrafficPolicy left empty (defaulted to
// Cluster) and a healthCheckNodePort left 0 (allocated) are accepted, and
// a nodePort may be anything from 1 to 65535 (the
// --service-node-port-range is the API server's allocator's business;
// kube-proxy takes any port).
func validateExternal(svc *v1.Service) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	typ := svc.Spec.Type
	clusterIPType := typ == "" || typ == v1.ServiceTypeClusterIP

	type protoPort struct {
		proto v1.Protocol
		port  int32
	}
	nodePorts := map[protoPort]bool{}
	for i := range svc.Spec.Ports {
		sp := &svc.Spec.Ports[i]
		if sp.NodePort == 0 {
			continue
		}
		p := spec.Child("ports").Index(i).Child("nodePort")
		if clusterIPType {
			errs = append(errs, field.Forbidden(p, "may not be used when `type` is 'ClusterIP'"))
			continue
		}
		for _, msg := range validation.IsValidPortNum(int(sp.NodePort)) {
			errs = append(errs, field.Invalid(p, sp.NodePort, msg))
		}
		proto := sp.Protocol
		if proto == "" {
			proto = v1.ProtocolTCP
		}
		if k := (protoPort{proto, sp.NodePort}); nodePorts[k] {
			errs = append(errs, field.Duplicate(p, sp.NodePort))
		} else {
			nodePorts[k] = true
		}
	}

	for i, s := range svc.Spec.ExternalIPs {
		p := spec.Child("externalIPs").Index(i)
		ip, err := parseIP(s)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(p, s, "must be a valid IP address"))
		case ip.IsUnspecified():
			errs = append(errs, field.Invalid(p, s, "may not be unspecified (0.0.0.0 or ::)"))
		case ip.IsLoopback():
			errs = append(errs, field.Invalid(p, s, "may not be in the loopback range"))
		case ip.IsLinkLocalUnicast():
			errs = append(errs, field.Invalid(p, s, "may not be in the link-local range"))
		case ip.IsMulticast() || ip.IsLinkLocalMulticast():
			errs = append(errs, field.Invalid(p, s, "may not be in the multicast range"))
		}
	}

	if len(svc.Spec.LoadBalancerSourceRanges) > 0 && typ != v1.ServiceTypeLoadBalancer {
		errs = append(errs, field.Forbidden(spec.Child("loadBalancerSourceRanges"), "may only be used when `type` is 'LoadBalancer'"))
	}
	for i, s := range svc.Spec.LoadBalancerSourceRanges {
		// Space padding is allowed, for historical reasons; kube-proxy
		// trims it too.
		if _, err := netip.ParsePrefix(strings.TrimSpace(s)); err != nil {
			errs = append(errs, field.Invalid(spec.Child("loadBalancerSourceRanges").Index(i), s,
				"must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"))
		}
	}

	etp := svc.Spec.ExternalTrafficPolicy
	switch {
	case etp == "":
	case !externallyAccessible(svc):
		errs = append(errs, field.Invalid(spec.Child("externalTrafficPolicy"), etp, "may only be set for externally-accessible services"))
	case etp != v1.ServiceExternalTrafficPolicyCluster && etp != v1.ServiceExternalTrafficPolicyLocal:
		errs = append(errs, field.NotSupported(spec.Child("externalTrafficPolicy"), etp, []string{"Cluster", "Local"}))
	}
	if hc := svc.Spec.HealthCheckNodePort; hc != 0 {
		p := spec.Child("healthCheckNodePort")
		if typ != v1.ServiceTypeLoadBalancer || etp != v1.ServiceExternalTrafficPolicyLocal {
			errs = append(errs, field.Invalid(p, hc, "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"))
		} else {
			for _, msg := range validation.IsValidPortNum(int(hc)) {
				errs = append(errs, field.Invalid(p, hc, msg))
			}
		}
	}

	for i := range svc.Status.LoadBalancer.Ingress {
		ing := &svc.Status.LoadBalancer.Ingress[i]
		p := field.NewPath("status", "loadBalancer", "ingress").Index(i)
		if ing.IP != "" {
			if _, err := parseIP(ing.IP); err != nil {
				errs = append(errs, field.Invalid(p.Child("ip"), ing.IP, "must be a valid IP address"))
			}
		}
		if ing.IPMode != nil {
			switch {
			case ing.IP == "":
				errs = append(errs, field.Required(p.Child("ip"), "must be specified when `ipMode` is set"))
			case *ing.IPMode != v1.LoadBalancerIPModeVIP && *ing.IPMode != v1.LoadBalancerIPModeProxy:
				errs = append(errs, field.NotSupported(p.Child("ipMode"), *ing.IPMode, []string{"VIP", "Proxy"}))
			}
		}
	}
	return errs
}

func validateTargetPort(p *field.Path, tp intstr.IntOrString) field.ErrorList {
	if tp.Type == intstr.String {
		var errs field.ErrorList
		for _, msg := range validation.IsValidPortName(tp.StrVal) {
			errs = append(errs, field.Invalid(p, tp.StrVal, msg))
		}
		return errs
	}
	if tp.IntVal < 0 || tp.IntVal > 65535 {
		return field.ErrorList{field.Invalid(p, tp.IntVal, "must be between 0 and 65535")}
	}
	return nil
}

// ValidateEndpointSlice checks the fields of an EndpointSlice that the proxy
// reads, like ValidateService.
func ValidateEndpointSlice(es *discoveryv1.EndpointSlice) error {
	var errs field.ErrorList
	errs = append(errs, validateMeta(es.Namespace, es.Name, validation.IsDNS1123Subdomain)...)
	if es.Labels[discoveryv1.LabelServiceName] == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "labels").Key(discoveryv1.LabelServiceName),
			"names the service the slice belongs to"))
	}
	var fam Family
	switch es.AddressType {
	case discoveryv1.AddressTypeIPv4:
		fam = IPv4
	case discoveryv1.AddressTypeIPv6:
		fam = IPv6
	case discoveryv1.AddressTypeFQDN:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("addressType"), es.AddressType, []string{"IPv4", "IPv6", "FQDN"}))
	}
	for i := range es.Endpoints {
		e := &es.Endpoints[i]
		p := field.NewPath("endpoints").Index(i)
		if len(e.Addresses) == 0 {
			errs = append(errs, field.Required(p.Child("addresses"), "at least one address"))
		}
		for j, a := range e.Addresses {
			if fam == 0 {
				continue
			}
			ip, err := parseIP(a)
			switch {
			case err != nil:
				errs = append(errs, field.Invalid(p.Child("addresses").Index(j), a, "must be a valid IP address"))
			case familyOf(ip) != fam:
				errs = append(errs, field.Invalid(p.Child("addresses").Index(j), a, "must be an "+fam.String()+" address (addressType)"))
			}
		}
		if h := e.Hints; h != nil {
			for j, z := range h.ForZones {
				if z.Name == "" {
					errs = append(errs, field.Required(p.Child("hints", "forZones").Index(j).Child("name"), ""))
				}
			}
			for j, n := range h.ForNodes {
				if n.Name == "" {
					errs = append(errs, field.Required(p.Child("hints", "forNodes").Index(j).Child("name"), ""))
				}
			}
		}
	}
	names := map[string]bool{}
	for i := range es.Ports {
		ep := &es.Ports[i]
		p := field.NewPath("ports").Index(i)
		if ep.Port != nil && (*ep.Port < 1 || *ep.Port > 65535) {
			errs = append(errs, field.Invalid(p.Child("port"), *ep.Port, "must be between 1 and 65535"))
		}
		if ep.Protocol != nil {
			switch *ep.Protocol {
			case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
			default:
				errs = append(errs, field.NotSupported(p.Child("protocol"), *ep.Protocol, []string{"TCP", "UDP", "SCTP"}))
			}
		}
		name := ""
		if ep.Name != nil {
			name = *ep.Name
			if name != "" {
				for _, msg := range validation.IsDNS1123Label(name) {
					errs = append(errs, field.Invalid(p.Child("name"), name, msg))
				}
			}
		}
		if names[name] {
			errs = append(errs, field.Duplicate(p.Child("name"), name))
		}
		names[name] = true
	}
	return errs.ToAggregate()
}

func validateMeta(namespace, name string, nameCheck func(string) []string) field.ErrorList {
	var errs field.ErrorList
	meta := field.NewPath("metadata")
	if name == "" {
		errs = append(errs, field.Required(meta.Child("name"), ""))
	} else {
		for _, msg := range nameCheck(name) {
			errs = append(errs, field.Invalid(meta.Child("name"), name, msg))
		}
	}
	if namespace == "" {
		errs = append(errs, field.Required(meta.Child("namespace"), ""))
	} else {
		for _, msg := range validation.IsDNS1123Label(namespace) {
			errs = append(errs, field.Invalid(meta.Child("namespace"), namespace, msg))
		}
	}
	return errs
}

// parseIP accepts what the API server accepts as an IP: no zone, no
// IPv4-mapped IPv6 form (netip already refuses leading zeros in IPv4).
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return ip, err
	}
	if ip.Zone() != "" || ip.Is4In6() {
		return ip, fmt.Errorf("%q: not a plain IP address", s)
	}
	return ip, nil
}

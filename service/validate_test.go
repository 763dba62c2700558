package service_test

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

func TestValidateService(t *testing.T) {
	ok := func() *v1.Service {
		return svc("ns1/web", "10.96.0.10", ports(tcp("http", 80, intstr.FromInt32(8080)), udp("dns", 53, intstr.FromString("dns"))))
	}
	cases := []struct {
		name string
		mod  func(*v1.Service)
		want []string // substrings of the error; none: valid
	}{
		{name: "valid", mod: func(*v1.Service) {}},
		{name: "valid headless", mod: func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "None", []string{"None"} }},
		{name: "valid dual-stack", mod: func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "fd00::10"} }},
		{name: "missing name", mod: func(s *v1.Service) { s.Name = "" }, want: []string{"metadata.name: Required value"}},
		{name: "bad name", mod: func(s *v1.Service) { s.Name = "Web_1" }, want: []string{"metadata.name: Invalid value"}},
		{name: "missing namespace", mod: func(s *v1.Service) { s.Namespace = "" }, want: []string{"metadata.namespace: Required value"}},
		{name: "bad clusterIP", mod: func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.256", nil }, want: []string{`spec.clusterIP: Invalid value: "10.96.0.256"`}},
		{name: "clusterIP with zone", mod: func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = "fe80::1%eth0", nil }, want: []string{"spec.clusterIP"}},
		{name: "clusterIPs mismatch", mod: func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.11"} }, want: []string{"spec.clusterIPs[0]", "must match spec.clusterIP"}},
		{name: "two IPv4 clusterIPs", mod: func(s *v1.Service) { s.Spec.ClusterIPs = []string{"10.96.0.10", "10.96.0.11"} }, want: []string{"spec.clusterIPs[1]", "one ClusterIP per IP family"}},
		{name: "no ports", mod: func(s *v1.Service) { s.Spec.Ports = nil }, want: []string{"spec.ports: Required value"}},
		{name: "port zero", mod: func(s *v1.Service) { s.Spec.Ports[0].Port = 0 }, want: []string{"spec.ports[0].port: Invalid value: 0"}},
		{name: "unnamed port among two", mod: func(s *v1.Service) { s.Spec.Ports[1].Name = "" }, want: []string{"spec.ports[1].name: Required value"}},
		{name: "duplicate port name", mod: func(s *v1.Service) { s.Spec.Ports[1].Name = "http" }, want: []string{"spec.ports[1].name: Duplicate value"}},
		{name: "duplicate port and protocol", mod: func(s *v1.Service) { s.Spec.Ports[1].Port, s.Spec.Ports[1].Protocol = 80, v1.ProtocolTCP }, want: []string{"spec.ports[1]: Duplicate value"}},
		{name: "bad protocol", mod: func(s *v1.Service) { s.Spec.Ports[0].Protocol = "ICMP" }, want: []string{"spec.ports[0].protocol: Unsupported value"}},
		{name: "bad targetPort name", mod: func(s *v1.Service) { s.Spec.Ports[0].TargetPort = intstr.FromString("no spaces") }, want: []string{"spec.ports[0].targetPort"}},
		{name: "bad affinity", mod: func(s *v1.Service) { s.Spec.SessionAffinity = "Cookie" }, want: []string{"spec.sessionAffinity"}},
		{name: "affinity timeout too long", mod: clientIP(86401), want: []string{"spec.sessionAffinityConfig.clientIP.timeoutSeconds"}},
		{name: "bad internalTrafficPolicy", mod: func(s *v1.Service) { s.Spec.InternalTrafficPolicy = ptr(v1.ServiceInternalTrafficPolicy("Node")) }, want: []string{"spec.internalTrafficPolicy"}},
		{name: "bad type", mod: func(s *v1.Service) { s.Spec.Type = "Magic" }, want: []string{"spec.type"}},
		// External fields, as pkg/apis/core/validation/validation.go checks them.
		{name: "valid LoadBalancer", mod: lbMods(nodePorts(30080, 30053), externalIPs("192.168.99.1", "2001:db8::1"),
			sourceRanges("10.0.0.0/8", " 2001:db8::/32 "), ingress("203.0.113.1", v1.LoadBalancerIPModeProxy), etpLocal,
			func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 })},
		{name: "valid: any nodePort, the same number on TCP and UDP", mod: lbMods(nodePorts(80, 80))},
		{name: "valid: LB and Local without healthCheckNodePort (the API server allocates it)", mod: lbMods(etpLocal)},
		{name: "valid: externalIPs on a ClusterIP service, Local policy", mod: func(s *v1.Service) { externalIPs("192.168.99.1")(s); etpLocal(s) }},
		{name: "nodePort out of range", mod: lbMods(nodePorts(65536)), want: []string{"spec.ports[0].nodePort: Invalid value: 65536"}},
		{name: "nodePort on a ClusterIP service", mod: nodePorts(30080), want: []string{"spec.ports[0].nodePort: Forbidden"}},
		{name: "duplicate nodePort", mod: lbMods(nodePorts(30080, 30080), func(s *v1.Service) { s.Spec.Ports[1].Protocol = v1.ProtocolTCP; s.Spec.Ports[1].Port = 54 }),
			want: []string{"spec.ports[1].nodePort: Duplicate value: 30080"}},
		{name: "bad externalIP", mod: externalIPs("192.168.99.1", "192.168.99.300"), want: []string{`spec.externalIPs[1]: Invalid value: "192.168.99.300"`}},
		{name: "loopback externalIP", mod: externalIPs("127.0.0.1"), want: []string{"spec.externalIPs[0]", "loopback"}},
		{name: "bad source range", mod: lbMods(sourceRanges("10.0.0.0/8", "10.0.0.0/33")), want: []string{`spec.loadBalancerSourceRanges[1]: Invalid value: "10.0.0.0/33"`}},
		{name: "source ranges on a NodePort service", mod: func(s *v1.Service) { svcType(v1.ServiceTypeNodePort)(s); sourceRanges("10.0.0.0/8")(s) },
			want: []string{"spec.loadBalancerSourceRanges: Forbidden"}},
		{name: "bad externalTrafficPolicy", mod: lbMods(func(s *v1.Service) { s.Spec.ExternalTrafficPolicy = "Node" }), want: []string{"spec.externalTrafficPolicy: Unsupported value"}},
		{name: "externalTrafficPolicy on a ClusterIP service", mod: etpLocal, want: []string{"spec.externalTrafficPolicy: Invalid value", "externally-accessible"}},
		{name: "healthCheckNodePort with Cluster policy", mod: lbMods(func(s *v1.Service) { s.Spec.HealthCheckNodePort = 32000 }),
			want: []string{"spec.healthCheckNodePort: Invalid value: 32000"}},
		{name: "bad ingress IP", mod: lbMods(ingress("203.0.113.300", "")), want: []string{"status.loadBalancer.ingress[0].ip: Invalid value"}},
		{name: "bad ipMode", mod: lbMods(ingress("203.0.113.1", "Tunnel")), want: []string{"status.loadBalancer.ingress[0].ipMode: Unsupported value"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := ok()
			c.mod(s)
			err := service.ValidateService(s)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("valid service refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("invalid service accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestValidateEndpointSlice(t *testing.T) {
	ok := func() *discoveryv1.EndpointSlice {
		return slice("ns1/web-1", "web", discoveryv1.AddressTypeIPv4, eports(eport("http", v1.ProtocolTCP, 8080)),
			ep("10.0.0.1", zoneHints("a")), ep("10.0.0.2"))
	}
	cases := []struct {
		name string
		mod  func(*discoveryv1.EndpointSlice)
		want []string
	}{
		{name: "valid", mod: func(*discoveryv1.EndpointSlice) {}},
		{name: "valid FQDN", mod: func(s *discoveryv1.EndpointSlice) {
			s.AddressType = discoveryv1.AddressTypeFQDN
			s.Endpoints[0].Addresses = []string{"example.com"}
		}},
		{name: "no service label", mod: func(s *discoveryv1.EndpointSlice) { s.Labels = nil }, want: []string{"metadata.labels[kubernetes.io/service-name]: Required value"}},
		{name: "bad address type", mod: func(s *discoveryv1.EndpointSlice) { s.AddressType = "IPX" }, want: []string{"addressType: Unsupported value"}},
		{name: "bad address", mod: func(s *discoveryv1.EndpointSlice) { s.Endpoints[1].Addresses = []string{"10.0.0"} }, want: []string{"endpoints[1].addresses[0]"}},
		{name: "IPv6 in IPv4 slice", mod: func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = []string{"fd00::1"} }, want: []string{"endpoints[0].addresses[0]", "IPv4"}},
		{name: "no addresses", mod: func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Addresses = nil }, want: []string{"endpoints[0].addresses: Required value"}},
		{name: "empty zone hint", mod: func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].Hints.ForZones[0].Name = "" }, want: []string{"endpoints[0].hints.forZones[0].name"}},
		{name: "port out of range", mod: func(s *discoveryv1.EndpointSlice) { s.Ports[0].Port = ptr(int32(65536)) }, want: []string{"ports[0].port"}},
		{name: "duplicate port name", mod: func(s *discoveryv1.EndpointSlice) { s.Ports = append(s.Ports, s.Ports[0]) }, want: []string{"ports[1].name: Duplicate value"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := ok()
			c.mod(s)
			err := service.ValidateEndpointSlice(s)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatalf("valid slice refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("invalid slice accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// lbMods makes the service a LoadBalancer and applies mods.
func lbMods(mods ...func(*v1.Service)) func(*v1.Service) {
	return func(s *v1.Service) {
		svcType(v1.ServiceTypeLoadBalancer)(s)
		for _, m := range mods {
			m(s)
		}
	}
}

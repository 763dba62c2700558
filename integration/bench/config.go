package main

import (
	"fmt"
	"strings"
)

// endpoints is the number of endpoint addresses, 198.51.100.1 and on.
const endpoints = 10

func endpointAddr(i int) string { return fmt.Sprintf("198.51.100.%d", i+1) }

// benchConfig is the services file both paths read: the three services of
// the datapath cells, then n services of 10 endpoints each (svc-00000 ...,
// ClusterIPs from 10.97.0.0) for the control-plane table.
func benchConfig(n int) string {
	var b strings.Builder
	three := []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"}
	writeService(&b, "bench-tcp", "10.96.1.1", "TCP", 80, 8080, nodePortTCP, three)
	writeService(&b, "bench-udp", "10.96.1.2", "UDP", 53, 5353, nodePortUDP, three)
	// iperf3's control and data connections must meet the same server.
	writeService(&b, "bench-iperf", "10.96.1.3", "TCP", 5201, 5201, nodePortIperf, three[:1])
	ten := make([]string, endpoints)
	for i := range ten {
		ten[i] = endpointAddr(i)
	}
	for i := range n {
		writeService(&b, manyName(i), manyIP(i), "TCP", 80, 8080, 0, ten)
	}
	return b.String()
}

func manyName(i int) string { return fmt.Sprintf("svc-%05d", i) }

func manyIP(i int) string { return fmt.Sprintf("10.97.%d.%d", i/256, i%256) }

// The NodePorts of the datapath services: userproxy serves them on
// 127.0.0.1 in its namespace (its default --nodeport-addresses), the
// "NodePort" path.
const (
	nodePortTCP   = 30080
	nodePortUDP   = 30053
	nodePortIperf = 30201
)

// writeService writes a Service (of type NodePort when nodePort is not 0)
// and its EndpointSlice.
func writeService(b *strings.Builder, name, ip, proto string, port, target, nodePort int, eps []string) {
	fmt.Fprintf(b, "---\napiVersion: v1\nkind: Service\nmetadata: {name: %s, namespace: bench}\n", name)
	fmt.Fprintf(b, "spec:\n  clusterIP: %s\n  clusterIPs: [%s]\n", ip, ip)
	if nodePort != 0 {
		fmt.Fprintf(b, "  type: NodePort\n  ports: [{name: p, protocol: %s, port: %d, targetPort: %d, nodePort: %d}]\n", proto, port, target, nodePort)
	} else {
		fmt.Fprintf(b, "  ports: [{name: p, protocol: %s, port: %d, targetPort: %d}]\n", proto, port, target)
	}
	fmt.Fprintf(b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\n")
	fmt.Fprintf(b, "metadata: {name: %s-1, namespace: bench, labels: {kubernetes.io/service-name: %s}}\n", name, name)
	items := make([]string, len(eps))
	for i, a := range eps {
		items[i] = fmt.Sprintf("{addresses: [%s]}", a)
	}
	fmt.Fprintf(b, "addressType: IPv4\nendpoints: [%s]\nports: [{name: p, protocol: %s, port: %d}]\n",
		strings.Join(items, ", "), proto, target)
}

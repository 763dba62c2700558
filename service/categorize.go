package service

import (
	"bytes"
	"net/netip"
	"slices"
)

// This file computes the Ports of one Service from its svcInfo and
// EndpointSlices:
//
//  1. per IP family of the service's ClusterIPs, per service port,
//  2. gather the endpoints of every slice of that family whose port matches
//     the service port by name and protocol (endpointslicecache.go
//     endpointInfoByServicePort; a named targetPort has already been resolved
//     to a number per slice by the EndpointSlice controller), leaving out
//     the slices labelled service.kubernetes.io/headless, which kube-proxy
//     never watches (sliceInfo.dnsOnly),
//  3. de-duplicate by "ip:port" and sort by that string (addEndpoints,
//     endpointsMapFromEndpointInfo),
//  4. choose the usable ones (topology.go CategorizeEndpoints) and the
//     verdict (proxier.go syncProxyRules: no endpoints -> REJECT, Local
//     policy and none local -> DROP);
//  5. for UDP, note the addresses of every serving endpoint, whatever the
//     policy and topology: the flows conntrack cleanup keeps;
//  6. for a port with external destinations, the external and cluster
//     endpoint sets and the external verdict (setExternal, external.go).

// nodeInfo is what endpoint selection needs to know about this node.
type nodeInfo struct {
	name string // Config.NodeName
	zone string // Config.Zone
}

// scratch holds buffers one build reuses from service to service, so that
// only what a Port keeps is allocated.
type scratch struct {
	candidates []Endpoint
	deduped    []Endpoint
	keys       []epKey
	text       []byte
}

// buildPorts returns the Ports of a service, ordered by family (in ClusterIP
// order) then by spec port order. slices must be sorted by name.
func buildPorts(info *svcInfo, sl []*sliceInfo, node nodeInfo, sc *scratch) []*Port {
	if info == nil || info.skip != "" || len(info.ports) == 0 {
		return nil
	}
	ports := make([]*Port, 0, len(info.clusterIPs)*len(info.ports))
	for _, ip := range info.clusterIPs {
		fam := familyOf(ip)
		ext := info.ext.forFamily(fam)
		for i, ps := range info.ports {
			eps := gatherEndpoints(sl, fam, ps, node, sc)
			p := &Port{
				Name:                       PortName{info.name.Namespace, info.name.Name, ps.Name},
				Protocol:                   ps.Protocol,
				Family:                     fam,
				ClusterIP:                  ip,
				ClusterIPs:                 info.clusterIPs,
				Port:                       ps.Port,
				Affinity:                   info.affinity,
				Scheduler:                  info.scheduler,
				ProxyProtocol:              info.proxyProt,
				InternalTrafficPolicyLocal: info.itpLocal,
				NodePort:                   info.nodePorts[i],
				ExternalIPs:                ext.externalIPs,
				LoadBalancerIPs:            ext.lbIPs,
				SourceRanges:               ext.sourceRanges,
				ExternalPolicyLocal:        info.ext.policyLocal,
				HealthCheckNodePort:        info.ext.healthCheckNodePort,
			}
			p.Endpoints, p.Topology, p.Verdict = categorize(eps, info.itpLocal, node)
			p.EndpointKeys = endpointKeys(p.Endpoints, sc)
			if p.Protocol == UDP {
				p.Serving = servingAddrs(eps)
			}
			setExternal(p, eps, node, sc)
			ports = append(ports, p)
		}
	}
	return ports
}

// servingAddrs returns the endpoints of eps that are serving (step 5), in
// eps' order (sorted by key, distinct). kube-proxy's stale-entry cleanup
// (pkg/proxy/conntrack/cleanup.go CleanStaleEntries) keeps the UDP flows of
// every endpoint that IsServing, ignoring traffic policies, topology and
// terminating state, so that a rolling update does not cut UDP flows to a
// pod that still serves. It matches endpoints by IP alone; we keep the port,
// so that two endpoints on one address (host-network pods) are told apart.
// nil when none serves.
func servingAddrs(eps []Endpoint) []netip.AddrPort {
	var out []netip.AddrPort
	for i := range eps {
		if eps[i].Serving {
			out = append(out, eps[i].Addr)
		}
	}
	return out
}

// endpointKeys returns the keys of eps, all cut from one string.
func endpointKeys(eps []Endpoint, sc *scratch) []string {
	if len(eps) == 0 {
		return nil
	}
	sc.text = sc.text[:0]
	for i := range eps {
		sc.text = eps[i].Addr.AppendTo(sc.text)
	}
	all := string(sc.text)
	keys := make([]string, len(eps))
	off := 0
	for i := range eps {
		n := len(eps[i].Addr.AppendTo(sc.text[:0]))
		keys[i] = all[off : off+n]
		off += n
	}
	return keys
}

// gatherEndpoints returns every endpoint of the matching slice ports (of
// the slices that are not for DNS only), de-duplicated by "ip:port" and sorted by that string, in a scratch buffer
// valid until the next call. When two slices carry the same endpoint, the
// first by slice name wins, unless a later copy is local and the first is
// not (kube-proxy keeps an arbitrary one, but prefers a local copy; we make
// "arbitrary" deterministic).
func gatherEndpoints(sl []*sliceInfo, fam Family, ps DNSPort, node nodeInfo, sc *scratch) []Endpoint {
	dst := sc.candidates[:0]
	for _, s := range sl {
		if s.family != fam || s.dnsOnly {
			continue
		}
		for _, sp := range s.ports {
			if sp.name != ps.Name || sp.proto != ps.Protocol {
				continue
			}
			for i := range s.endpoints {
				se := &s.endpoints[i]
				dst = append(dst, Endpoint{
					Addr:        netip.AddrPortFrom(se.addr, sp.port),
					NodeName:    se.nodeName,
					Zone:        se.zone,
					Pod:         se.pod,
					Local:       node.name != "" && se.nodeName == node.name,
					Ready:       se.ready,
					Serving:     se.serving,
					Terminating: se.terminating,
					ZoneHints:   se.zoneHints,
					NodeHints:   se.nodeHints,
				})
			}
		}
	}
	sc.candidates = dst
	if len(dst) < 2 {
		return dst
	}
	// Sort by the key string, compared as bytes in a fixed-size buffer so
	// that no comparison allocates.
	keys := sc.keys[:0]
	for i := range dst {
		keys = append(keys, makeEpKey(dst[i].Addr, i))
	}
	sc.keys = keys
	slices.SortStableFunc(keys, func(a, b epKey) int { return bytes.Compare(a.text(), b.text()) })
	out := sc.deduped[:0]
	for i := 0; i < len(keys); {
		j := i + 1
		best := keys[i].idx
		for j < len(keys) && bytes.Equal(keys[j].text(), keys[i].text()) {
			if dst[keys[j].idx].Local && !dst[best].Local {
				best = keys[j].idx
			}
			j++
		}
		out = append(out, dst[best])
		i = j
	}
	sc.deduped = out
	return out
}

// epKey holds the "ip:port" text of an endpoint in a fixed buffer (the
// longest form, "[ffff:...:ffff]:65535", is 47 bytes).
type epKey struct {
	buf [48]byte
	n   uint8
	idx int
}

func makeEpKey(ap netip.AddrPort, idx int) epKey {
	k := epKey{idx: idx}
	// Zone-less addresses always fit; copy guards the impossible case.
	k.n = uint8(copy(k.buf[:], ap.AppendTo(k.buf[:0])))
	return k
}

func (k *epKey) text() []byte { return k.buf[:k.n] }

// categorize picks the endpoints cluster traffic from this node uses, as
// kube-proxy's CategorizeEndpoints (topology.go) does for a ClusterIP:
//
//   - internalTrafficPolicy Cluster: the Ready endpoints the topology mode
//     allows; if there are none, every Serving and Terminating endpoint
//     (hints ignored). None at all: NoEndpoints.
//   - internalTrafficPolicy Local: the local Ready endpoints, else the local
//     Serving and Terminating ones. None usable anywhere in the cluster:
//     NoEndpoints (REJECT); some elsewhere but none here: NoLocalEndpoints
//     (DROP).
//
// eps is sorted; the result keeps its order and is freshly allocated.
func categorize(eps []Endpoint, itpLocal bool, node nodeInfo) (usable []Endpoint, mode string, v Verdict) {
	if !itpLocal {
		mode = topologyMode(eps, node)
		usable = filterEndpoints(eps, func(e *Endpoint) bool { return e.Ready && availableForTopology(e, mode, node) })
		if len(usable) == 0 {
			usable = filterEndpoints(eps, func(e *Endpoint) bool { return e.Serving && e.Terminating })
		}
		if len(usable) == 0 {
			return nil, mode, NoEndpoints
		}
		return usable, mode, Forward
	}
	hasAny, localReady, localTerminating := false, false, false
	for i := range eps {
		e := &eps[i]
		switch {
		case e.Ready:
			hasAny = true
			localReady = localReady || e.Local
		case e.Serving && e.Terminating:
			hasAny = true
			localTerminating = localTerminating || e.Local
		}
	}
	switch {
	case !hasAny:
		return nil, "", NoEndpoints
	case localReady:
		usable = filterEndpoints(eps, func(e *Endpoint) bool { return e.Local && e.Ready })
	case localTerminating:
		usable = filterEndpoints(eps, func(e *Endpoint) bool { return e.Local && e.Serving && e.Terminating })
	default:
		return nil, "", NoLocalEndpoints
	}
	return usable, "", Forward
}

// topologyMode is kube-proxy's topologyModeFromHints: PreferSameNode when
// every Ready endpoint has node hints and one names this node; else
// PreferSameZone when every Ready endpoint has zone hints and one names this
// node's zone; else "" (hints ignored).
func topologyMode(eps []Endpoint, node nodeInfo) string {
	anyReady := false
	allNode, forNode := true, false
	allZone, forZone := true, false
	for i := range eps {
		e := &eps[i]
		if !e.Ready {
			continue
		}
		anyReady = true
		if len(e.NodeHints) == 0 {
			allNode = false
		} else if slices.Contains(e.NodeHints, node.name) {
			forNode = true
		}
		if len(e.ZoneHints) == 0 {
			allZone = false
		} else if slices.Contains(e.ZoneHints, node.zone) {
			forZone = true
		}
	}
	switch {
	case !anyReady:
		return ""
	case allNode && forNode:
		return TopologyPreferSameNode
	case allZone && forZone:
		return TopologyPreferSameZone
	}
	return ""
}

// availableForTopology is kube-proxy's function of that name.
func availableForTopology(e *Endpoint, mode string, node nodeInfo) bool {
	switch mode {
	case TopologyPreferSameNode:
		return slices.Contains(e.NodeHints, node.name)
	case TopologyPreferSameZone:
		return slices.Contains(e.ZoneHints, node.zone)
	}
	return true
}

func filterEndpoints(eps []Endpoint, keep func(*Endpoint) bool) []Endpoint {
	n := 0
	for i := range eps {
		if keep(&eps[i]) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	out := make([]Endpoint, 0, n)
	for i := range eps {
		if keep(&eps[i]) {
			out = append(out, eps[i])
		}
	}
	return out
}

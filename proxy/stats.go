package proxy

import (
	"sync/atomic"
	"time"

	"github.com/userproxy/userproxy/conntrack"
)

// Result is the outcome of a new flow, the `result` label of
// userproxy_flows_total.
type Result int

// Results.
const (
	ResultProxied Result = iota
	ResultRejectedNoService
	ResultRejectedNoEndpoints
	ResultDroppedLocalPolicy
	ResultDialFailed
	ResultTableFull
	// ResultLocal: served by a local handler (SetLocal), such as cluster
	// DNS.
	ResultLocal
	// ResultDroppedSourceRange: a flow to a load-balancer IP from outside
	// its loadBalancerSourceRanges (kube-proxy's KUBE-PROXY-FIREWALL).
	ResultDroppedSourceRange
	// ResultInFlightLimited: a NodePort connection reset because too many
	// were being set up at once.
	ResultInFlightLimited
	// ResultNoWay: a flow to an endpoint that only the API server reaches
	// and that cannot go that way: UDP (pods/portforward carries TCP only),
	// or an endpoint whose EndpointSlice names no Pod (dialvia.go).
	ResultNoWay
	// ResultDroppedUnusableSource: a flow from an address no reply can
	// reach (0.0.0.0, ::, multicast, broadcast): a client host without an
	// address the route into the TUN can take as its source.
	ResultDroppedUnusableSource
	numResults
)

var resultNames = [numResults]string{"proxied", "rejected_no_service", "rejected_no_endpoints", "dropped_local_policy", "dial_failed", "table_full", "local", "dropped_source_range", "in_flight_limited", "no_way_to_endpoint", "dropped_unusable_source"}

func (r Result) String() string { return resultNames[r] }

// DialBuckets are the upper bounds, in seconds, of the dial duration
// histogram.
var DialBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type counters struct {
	flows        [2][numResults]atomic.Uint64 // [tcp, udp]
	affinityHits atomic.Uint64
	bytes        [2]atomic.Uint64 // [client->endpoint, endpoint->client]
	dials        [NumWays]dialCounters
	ways         [2][NumWays]atomic.Uint64 // proxied flows [tcp, udp] per way
	fallbacks    atomic.Uint64             // ViaAuto's direct attempts that went unanswered
}

// countWay counts a proxied flow of protocol pr that went way w.
func (c *counters) countWay(pr conntrack.Protocol, w Way) { c.ways[protoIndex(pr)][w].Add(1) }

// dialCounters count the dials of one Way.
type dialCounters struct {
	count    atomic.Uint64
	sumNanos atomic.Uint64
	buckets  [16]atomic.Uint64 // len(DialBuckets)
	failed   atomic.Uint64
}

func protoIndex(p conntrack.Protocol) int {
	if p == conntrack.UDP {
		return 1
	}
	return 0
}

func (c *counters) count(p conntrack.Protocol, r Result) { c.flows[protoIndex(p)][r].Add(1) }

// observeDial counts one dial of way that took d; ok is false for a
// failure.
func (c *counters) observeDial(way Way, d time.Duration, ok bool) {
	dc := &c.dials[way]
	dc.count.Add(1)
	dc.sumNanos.Add(uint64(d))
	if !ok {
		dc.failed.Add(1)
	}
	s := d.Seconds()
	for i, b := range DialBuckets {
		if s <= b {
			dc.buckets[i].Add(1)
		}
	}
}

// Stats is a snapshot of the proxy's counters.
type Stats struct {
	// Flows[protocol][result]: protocol index 0 is TCP, 1 is UDP.
	Flows [2][numResults]uint64
	// AffinityHits counts flows whose endpoint ClientIP affinity chose.
	AffinityHits uint64
	// BytesToEndpoint and BytesToClient are the spliced payload bytes.
	BytesToEndpoint, BytesToClient uint64
	// Dials per Way (direct, apiserver): the duration histogram and the
	// failures.
	Dials [NumWays]DialStats
	// FlowsByWay[protocol][way] counts the proxied flows by the way they
	// went (protocol index as in Flows).
	FlowsByWay [2][NumWays]uint64
	// Fallbacks counts --dial-via auto's first direct dials that went
	// unanswered, after which the flow went through the API server; they
	// are not dial failures.
	Fallbacks uint64
	// Flows live now, and UDP sessions among them.
	LiveFlows, UDPSessions int
}

// DialStats count the endpoint dials of one Way.
type DialStats struct {
	// Count dials took Sum in all; Buckets are the cumulative counts per
	// DialBuckets bound; Failed of them failed.
	Count   uint64
	Sum     time.Duration
	Buckets [16]uint64
	Failed  uint64
}

// Stats returns a snapshot of the counters.
func (p *Proxy) Stats() Stats {
	c := &p.stats
	var s Stats
	for i := range c.flows {
		for r := range c.flows[i] {
			s.Flows[i][r] = c.flows[i][r].Load()
		}
	}
	s.AffinityHits = c.affinityHits.Load()
	s.BytesToEndpoint, s.BytesToClient = c.bytes[0].Load(), c.bytes[1].Load()
	for w := range c.dials {
		dc, ds := &c.dials[w], &s.Dials[w]
		ds.Count, ds.Sum, ds.Failed = dc.count.Load(), time.Duration(dc.sumNanos.Load()), dc.failed.Load()
		for i := range dc.buckets {
			ds.Buckets[i] = dc.buckets[i].Load()
		}
	}
	for i := range c.ways {
		for w := range c.ways[i] {
			s.FlowsByWay[i][w] = c.ways[i][w].Load()
		}
	}
	s.Fallbacks = c.fallbacks.Load()
	s.LiveFlows = p.Flows()
	s.UDPSessions = int(p.udpSessions.Load())
	return s
}

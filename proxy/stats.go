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
	numResults
)

var resultNames = [numResults]string{"proxied", "rejected_no_service", "rejected_no_endpoints", "dropped_local_policy", "dial_failed", "table_full", "local", "dropped_source_range", "in_flight_limited"}

func (r Result) String() string { return resultNames[r] }

// DialBuckets are the upper bounds, in seconds, of the dial duration
// histogram.
var DialBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

type counters struct {
	flows        [2][numResults]atomic.Uint64 // [tcp, udp]
	affinityHits atomic.Uint64
	bytes        [2]atomic.Uint64 // [client->endpoint, endpoint->client]
	dialCount    atomic.Uint64
	dialSumNanos atomic.Uint64
	dialBuckets  [16]atomic.Uint64 // len(DialBuckets)
}

func protoIndex(p conntrack.Protocol) int {
	if p == conntrack.UDP {
		return 1
	}
	return 0
}

func (c *counters) count(p conntrack.Protocol, r Result) { c.flows[protoIndex(p)][r].Add(1) }

func (c *counters) observeDial(d time.Duration) {
	c.dialCount.Add(1)
	c.dialSumNanos.Add(uint64(d))
	s := d.Seconds()
	for i, b := range DialBuckets {
		if s <= b {
			c.dialBuckets[i].Add(1)
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
	// Dial duration histogram: cumulative counts per DialBuckets bound.
	DialCount   uint64
	DialSum     time.Duration
	DialBuckets [16]uint64
	// Flows live now, and UDP sessions among them.
	LiveFlows, UDPSessions int
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
	s.DialCount, s.DialSum = c.dialCount.Load(), time.Duration(c.dialSumNanos.Load())
	for i := range c.dialBuckets {
		s.DialBuckets[i] = c.dialBuckets[i].Load()
	}
	s.LiveFlows = p.Flows()
	s.UDPSessions = int(p.udpSessions.Load())
	return s
}

package service

import "time"

// Stats is a snapshot of a Tracker's counters: the inputs of kube-proxy's
// sync_proxy_rules_* and network_programming_duration_seconds metrics.
type Stats struct {
	// Syncs counts the tables published.
	Syncs uint64
	// LastSyncDuration is how long building the last table took.
	LastSyncDuration time.Duration
	// LastSyncTime is when the last table went live.
	LastSyncTime time.Time
	// SyncDuration is the distribution of table build times
	// (sync_proxy_rules_duration_seconds).
	SyncDuration Histogram
	// ServiceChanges counts Service events received
	// (sync_proxy_rules_service_changes_total).
	ServiceChanges uint64
	// EndpointChanges counts EndpointSlice events received for a service
	// (sync_proxy_rules_endpoint_changes_total).
	EndpointChanges uint64
	// IgnoredEndpointSlices counts EndpointSlice events ignored: no
	// kubernetes.io/service-name label, or an address type other than IPv4
	// and IPv6.
	IgnoredEndpointSlices uint64
	// PendingChanges is the number of services changed since the last table.
	PendingChanges int
	// ServiceChangesPending and EndpointChangesPending split PendingChanges
	// by what changed, as kube-proxy's two change trackers do
	// (sync_proxy_rules_service_changes_pending, ..._endpoint_changes_pending:
	// services with a pending Service change, and services with a pending
	// EndpointSlice change). A service with both is in both.
	ServiceChangesPending, EndpointChangesPending int
	// LastQueuedTime is when a change last queued a build
	// (sync_proxy_rules_last_queued_timestamp_seconds); zero before the
	// first.
	LastQueuedTime time.Time
	// NoLocalEndpoints counts, in the last table, the service ports whose
	// traffic policy is Local and that have no local endpoint
	// (sync_proxy_rules_no_local_endpoints_total{traffic_policy}).
	NoLocalEndpoints NoLocalEndpointsCount
	// NoLocalEndpointsByFamily splits NoLocalEndpoints by the family of the
	// service port (kube-proxy's label ip_family: one proxier per family).
	NoLocalEndpointsByFamily PerFamily[NoLocalEndpointsCount]
	// NetworkProgrammingLatency is the distribution of the time from an
	// object's change to the table that reflects it going live
	// (network_programming_duration_seconds). The change time is the
	// EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time
	// annotation when it has one, else the time the Tracker received the
	// event. Changes received before the first table are not measured.
	NetworkProgrammingLatency Histogram
	// NetworkProgrammingLatencyByFamily splits NetworkProgrammingLatency by
	// the family of the change (kube-proxy's label ip_family, where each
	// family's proxier measures the slices of its address type): an
	// EndpointSlice change counts for its address type; a Service change
	// for each family of its ClusterIPs, before and after the change (a
	// dual-stack service's change is one sample of each family). A change
	// with no family (a service without ClusterIP) is in neither.
	NetworkProgrammingLatencyByFamily PerFamily[Histogram]
	// Services, Ports and Skipped describe the last table.
	Services, Ports, Skipped int
}

// NoLocalEndpointsCount counts service ports with a Local traffic policy and no
// local endpoint, per policy, like kube-proxy's label traffic_policy.
type NoLocalEndpointsCount struct {
	// Internal: internalTrafficPolicy Local (traffic_policy="internal").
	Internal int
	// External: externalTrafficPolicy Local, counted per service port
	// and family with an external destination (NodePort, externalIP or
	// LB IP of that family) whose ExternalVerdict is NoLocalEndpoints
	// (traffic_policy="external"). kube-proxy also counts a port of such a
	// service that has no external destination of its family (it never
	// computes local endpoints for it); we do not, as nothing is dropped.
	External int
}

// PerFamily holds one value per IP family.
type PerFamily[T any] struct{ IPv4, IPv6 T }

// Get returns f's value; any family but IPv6 is IPv4's.
func (p *PerFamily[T]) Get(f Family) T {
	if f == IPv6 {
		return p.IPv6
	}
	return p.IPv4
}

// at returns a pointer to f's value, as Get.
func (p *PerFamily[T]) at(f Family) *T {
	if f == IPv6 {
		return &p.IPv6
	}
	return &p.IPv4
}

// familySet is a set of IP families.
type familySet uint8

const (
	setIPv4 familySet = 1 << iota
	setIPv6
)

func familySetOf(f Family) familySet {
	if f == IPv6 {
		return setIPv6
	}
	return setIPv4
}

// Histogram is a cumulative histogram in seconds, in the shape of a
// Prometheus histogram: Buckets[i] counts the observations <= Bounds[i].
type Histogram struct {
	Bounds  []float64
	Buckets []uint64
	Count   uint64
	Sum     float64
}

// Bucket bounds, in seconds, of kube-proxy's metrics.go.
var (
	// SyncDurationBounds: ExponentialBuckets(0.001, 2, 15).
	SyncDurationBounds = exponentialBounds(0.001, 2, 15)
	// NetworkProgrammingBounds: 0, 0.25 and 0.5, then 1 to 59 by 1, 60 to
	// 115 by 5, 120 to 300 by 30 — 81 bounds. The leading 0 is kube-proxy's
	// too: component-base's MergeBuckets, which builds them, starts from a
	// one-element slice holding 0.
	NetworkProgrammingBounds = networkProgrammingBounds()
)

func exponentialBounds(start, factor float64, n int) []float64 {
	b := make([]float64, n)
	for i := range b {
		b[i] = start
		start *= factor
	}
	return b
}

func networkProgrammingBounds() []float64 {
	b := []float64{0, 0.25, 0.5}
	for v := 1; v <= 59; v++ {
		b = append(b, float64(v))
	}
	for v := 60; v <= 115; v += 5 {
		b = append(b, float64(v))
	}
	for v := 120; v <= 300; v += 30 {
		b = append(b, float64(v))
	}
	return b
}

// histogram accumulates observations; not safe for concurrent use.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; last is +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(h.bounds) && s > h.bounds[i] {
		i++
	}
	h.counts[i]++
	h.sum += s
	h.n++
}

func (h *histogram) snapshot() Histogram {
	out := Histogram{
		Bounds:  h.bounds,
		Buckets: make([]uint64, len(h.bounds)),
		Count:   h.n,
		Sum:     h.sum,
	}
	var acc uint64
	for i := range h.bounds {
		acc += h.counts[i]
		out.Buckets[i] = acc
	}
	return out
}

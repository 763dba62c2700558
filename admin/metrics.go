package admin

// Metrics: a Prometheus collector that reads the Stats snapshots of the
// datapath's parts at scrape time.
//
//  1. Sources names the parts; a nil source contributes no metric.
//  2. Describe sends the descriptors of the present sources; Collect takes
//     one snapshot per source and turns it into constant metrics, so a
//     scrape costs one Stats call per part and nothing is counted twice.
//  3. A series kube-proxy also exports has kube-proxy's full name, type,
//     labels and buckets (kubernetes pkg/proxy/metrics/metrics.go, v1.37:
//     kubeproxy_*; kubeProxySeries in kubeproxy_metrics_test.go pins
//     them), so that its dashboards and alerts work unchanged; our own
//     series are userproxy_*.

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// own names a series kube-proxy does not have: ours, prefixed userproxy_.
func own(name string) string { return "userproxy_" + name }

// GateStats is the part of the stack's counters the metrics read: the gate's
// verdicts on packets and new flows. Its fields are netstack.Stats' field for
// field, so the caller converts with admin.GateStats(stack.Stats()) (admin
// may not import netstack; a change there breaks that conversion at compile
// time rather than silently).
type GateStats struct {
	PacketsIn, PacketsOut        uint64
	InvalidIn, InvalidOut        uint64
	Rejected, RejectRateLimited  uint64
	Dropped                      uint64
	TableFull                    uint64
	Accepted                     uint64
	Oversized                    uint64
	LinkUnsupported              uint64
	LinkQueueReads               []uint64
	TCPInFlight                  int
	InFlightLimited              uint64
	HandlerPanics                uint64
	FlowPanics                   uint64
	TimerRTOFires, TimerAckFires uint64
	HandshakesAborted            uint64
	ResetsAfterEntry             uint64
	SegmentsAfterEntry           uint64
	StrayResets                  uint64
	SYNACKWaitsWritten           uint64
	SYNACKWaitsTimedOut          uint64
	AcksSuperseded, AcksExpired  uint64
	AcksFlushed, AcksDropped     uint64
}

// Sources are where the metrics come from. Every field may be nil: its
// metrics are then neither described nor collected. Each is called once
// per scrape, from the scraping goroutine, so it must be safe to call
// concurrently with the datapath (the Stats methods of conntrack.Table,
// proxy.Proxy, service.Tracker and netstack.Stack are).
type Sources struct {
	// Conntrack feeds kube-proxy's
	// kubeproxy_iptables_ct_state_invalid_dropped_packets_total and our
	// conntrack_* metrics (*conntrack.Table).
	Conntrack interface{ Stats() conntrack.Stats }
	// Reassembler feeds the defrag_* metrics: the IP fragments the gate
	// reassembles (*conntrack.Reassembler).
	Reassembler interface {
		Stats() conntrack.ReassemblyStats
	}
	// Proxy feeds flows_total, dial_duration_seconds, spliced_bytes_total,
	// affinity_hits_total, flows_active, udp_sessions (*proxy.Proxy).
	Proxy interface{ Stats() proxy.Stats }
	// Tracker feeds kube-proxy's kubeproxy_sync_proxy_rules_* and
	// kubeproxy_network_programming_duration_seconds, and our service
	// gauges (*service.Tracker).
	Tracker interface{ Stats() service.Stats }
	// Families are the IP families the proxy serves (those of its service
	// CIDRs), the values of kube-proxy's ip_family label on the Tracker's
	// series; nil is both.
	Families []service.Family
	// Gate feeds the gate_* metrics:
	// func() admin.GateStats { return admin.GateStats(stack.Stats()) }.
	Gate func() GateStats
	// ReloadErrors feeds config_reload_errors_total: the failed reads of
	// the configuration source (file.Source's Stats().Errors).
	ReloadErrors func() uint64
	// DNS feeds the dns_* metrics (*clusterdns.Responder).
	DNS interface{ Stats() clusterdns.Stats }
	// NodePorts feeds nodeport_sockets{state}: the NodePort sockets open,
	// and those that could not be opened (a port taken on the host).
	NodePorts func() NodePortStats
	// Tunnels feeds the apiserver_tunnel* and apiserver_streams* metrics:
	// the port-forward tunnels flows take to pods the host cannot reach.
	Tunnels func() TunnelStats
}

// TunnelStats count the tunnels through the API server (--dial-via
// apiserver|auto). Its fields are kube.PortForwardStats' field for field
// (admin may not import source/kube): admin.TunnelStats(pf.Stats()).
type TunnelStats struct {
	Tunnels                                 int
	Opens, OpenFailures, Broken, IdleClosed uint64
	StreamsOpen                             int
	Streams, StreamFailures, StreamErrors   uint64
}

// NodePortStats counts the NodePort front end's sockets.
type NodePortStats struct{ Open, Failed int }

// RegisterMetrics registers the collector of src on reg.
func RegisterMetrics(reg prometheus.Registerer, src Sources) error {
	return reg.Register(NewCollector(src))
}

// NewCollector returns a prometheus.Collector over src (see Sources).
// Describe lists every descriptor Collect uses (a checked collector), and
// Collect is safe for concurrent use.
func NewCollector(src Sources) prometheus.Collector {
	c := &collector{}
	if src.Tracker != nil {
		fams := src.Families
		if len(fams) == 0 {
			fams = []service.Family{service.IPv4, service.IPv6}
		}
		c.groups = append(c.groups, trackerGroup(src.Tracker.Stats, fams))
	}
	if src.Conntrack != nil {
		c.groups = append(c.groups, conntrackGroup(src.Conntrack.Stats))
	}
	if src.Reassembler != nil {
		c.groups = append(c.groups, defragGroup(src.Reassembler.Stats))
	}
	if src.Proxy != nil {
		c.groups = append(c.groups, proxyGroup(src.Proxy.Stats))
	}
	if src.Gate != nil {
		c.groups = append(c.groups, gateGroup(src.Gate))
	}
	if src.DNS != nil {
		c.groups = append(c.groups, dnsGroup(src.DNS.Stats))
	}
	if src.NodePorts != nil {
		c.groups = append(c.groups, &group[NodePortStats]{snapshot: src.NodePorts, defs: []def[NodePortStats]{
			labeled(own("nodeport_sockets"), "NodePort sockets by state: open, or failed (the port is taken on the host; see /healthz).",
				prometheus.GaugeValue, []string{"state"}, func(s *NodePortStats, emit func(float64, ...string)) {
					emit(float64(s.Open), "open")
					emit(float64(s.Failed), "failed")
				}),
		}})
	}
	if src.Tunnels != nil {
		c.groups = append(c.groups, tunnelGroup(src.Tunnels))
	}
	if src.ReloadErrors != nil {
		c.groups = append(c.groups, &group[uint64]{snapshot: src.ReloadErrors, defs: []def[uint64]{
			counter(own("config_reload_errors_total"), "Failed reads of the configuration source; the last good state is kept.",
				func(n *uint64) uint64 { return *n }),
		}})
	}
	return c
}

type collector struct{ groups []metricGroup }

var _ prometheus.Collector = (*collector)(nil)

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range c.groups {
		g.describe(ch)
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, g := range c.groups {
		g.collect(ch)
	}
}

// metricGroup is the metrics of one source.
type metricGroup interface {
	describe(ch chan<- *prometheus.Desc)
	collect(ch chan<- prometheus.Metric)
}

// group turns one snapshot of type S into metrics.
type group[S any] struct {
	snapshot func() S
	defs     []def[S]
}

func (g *group[S]) describe(ch chan<- *prometheus.Desc) {
	for _, d := range g.defs {
		ch <- d.desc
	}
}

func (g *group[S]) collect(ch chan<- prometheus.Metric) {
	s := g.snapshot()
	for _, d := range g.defs {
		d.emit(ch, d.desc, &s)
	}
}

// def is one metric family read from a snapshot of type S.
type def[S any] struct {
	desc *prometheus.Desc
	emit func(ch chan<- prometheus.Metric, d *prometheus.Desc, s *S)
}

// newDesc describes the family name: a full name (own or kube-proxy's).
func newDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

func counter[S any](name, help string, v func(*S) uint64) def[S] {
	return def[S]{newDesc(name, help), func(ch chan<- prometheus.Metric, d *prometheus.Desc, s *S) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v(s)))
	}}
}

func gauge[S any](name, help string, v func(*S) float64) def[S] {
	return def[S]{newDesc(name, help), func(ch chan<- prometheus.Metric, d *prometheus.Desc, s *S) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v(s))
	}}
}

// labeled is a metric family with labels: each calls emit once per series.
func labeled[S any](name, help string, typ prometheus.ValueType, labels []string, each func(s *S, emit func(v float64, labelValues ...string))) def[S] {
	return def[S]{newDesc(name, help, labels...), func(ch chan<- prometheus.Metric, d *prometheus.Desc, s *S) {
		each(s, func(v float64, lv ...string) {
			ch <- prometheus.MustNewConstMetric(d, typ, v, lv...)
		})
	}}
}

// constHistogram is one histogram series: cum[i] counts the observations
// <= bounds[i].
func constHistogram(d *prometheus.Desc, bounds []float64, cum []uint64, count uint64, sum float64, labelValues ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(bounds))
	for i := 0; i < len(bounds) && i < len(cum); i++ {
		buckets[bounds[i]] = cum[i]
	}
	m, err := prometheus.NewConstHistogram(d, count, sum, buckets, labelValues...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	return m
}

// labeledHistogram is a histogram family with labels, read from
// service.Histograms: each calls emit once per series.
func labeledHistogram[S any](name, help string, labels []string, each func(s *S, emit func(h service.Histogram, labelValues ...string))) def[S] {
	return def[S]{newDesc(name, help, labels...), func(ch chan<- prometheus.Metric, d *prometheus.Desc, s *S) {
		each(s, func(h service.Histogram, lv ...string) {
			ch <- constHistogram(d, h.Bounds, h.Buckets, h.Count, h.Sum, lv...)
		})
	}}
}

// trackerGroup: kube-proxy's sync metrics, under kube-proxy's names
// (pkg/proxy/metrics/metrics.go). A "sync" is building a new service table.
//
// ip_family: kube-proxy runs one proxier per family, each with its own
// sync. One build of ours programs every family at once, so the sync
// series (duration, last and queued timestamps) carry that build under
// each family served (fams): true of each family, and what kube-proxy's
// dual-stack proxiers would both report. The network programming latency
// and the ports without local endpoint are per family for real: a change
// counts for its own family, a port for its own (service.Stats).
func trackerGroup(snap func() service.Stats, fams []service.Family) metricGroup {
	eachFamily := func(emit func(float64, ...string), v float64) {
		for _, f := range fams {
			emit(v, f.String())
		}
	}
	return &group[service.Stats]{snapshot: snap, defs: []def[service.Stats]{
		labeledHistogram("kubeproxy_sync_proxy_rules_duration_seconds", "SyncProxyRules latency in seconds: the time to build a new service table, which programs every IP family at once.",
			[]string{"ip_family"}, func(s *service.Stats, emit func(service.Histogram, ...string)) {
				for _, f := range fams {
					emit(s.SyncDuration, f.String())
				}
			}),
		labeled("kubeproxy_sync_proxy_rules_last_timestamp_seconds", "The last time proxy rules were successfully synced: when the last service table went live, in seconds since the epoch; 0 before the first.",
			prometheus.GaugeValue, []string{"ip_family"}, func(s *service.Stats, emit func(float64, ...string)) {
				eachFamily(emit, unixSeconds(s.LastSyncTime))
			}),
		labeled("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", "The last time a sync of proxy rules was queued: a change marked a service for the next table; 0 before the first.",
			prometheus.GaugeValue, []string{"ip_family"}, func(s *service.Stats, emit func(float64, ...string)) {
				eachFamily(emit, unixSeconds(s.LastQueuedTime))
			}),
		counter("kubeproxy_sync_proxy_rules_endpoint_changes_total", "Cumulative proxy rules Endpoint changes: EndpointSlice events received for a service.",
			func(s *service.Stats) uint64 { return s.EndpointChanges }),
		counter("kubeproxy_sync_proxy_rules_service_changes_total", "Cumulative proxy rules Service changes: Service events received.",
			func(s *service.Stats) uint64 { return s.ServiceChanges }),
		gauge("kubeproxy_sync_proxy_rules_endpoint_changes_pending", "Pending proxy rules Endpoint changes: services whose EndpointSlices changed since the last table.",
			func(s *service.Stats) float64 { return float64(s.EndpointChangesPending) }),
		gauge("kubeproxy_sync_proxy_rules_service_changes_pending", "Pending proxy rules Service changes: services changed since the last table.",
			func(s *service.Stats) float64 { return float64(s.ServiceChangesPending) }),
		labeled("kubeproxy_sync_proxy_rules_no_local_endpoints_total", "Number of services with a Local traffic policy and no endpoints: service ports, per policy and family, in the last table.",
			prometheus.GaugeValue, []string{"traffic_policy", "ip_family"}, func(s *service.Stats, emit func(float64, ...string)) {
				for _, f := range fams {
					n := s.NoLocalEndpointsByFamily.Get(f)
					emit(float64(n.Internal), "internal", f.String())
					emit(float64(n.External), "external", f.String())
				}
			}),
		labeledHistogram("kubeproxy_network_programming_duration_seconds", "In Cluster Network Programming Latency in seconds: from a Service or EndpointSlice change to the table that reflects it going live, by the change's family.",
			[]string{"ip_family"}, func(s *service.Stats, emit func(service.Histogram, ...string)) {
				for _, f := range fams {
					emit(s.NetworkProgrammingLatencyByFamily.Get(f), f.String())
				}
			}),
		gauge(own("services"), "Services with at least one port in the last table.",
			func(s *service.Stats) float64 { return float64(s.Services) }),
		gauge(own("service_ports"), "Service ports (one per IP family) in the last table.",
			func(s *service.Stats) float64 { return float64(s.Ports) }),
		gauge(own("services_skipped"), "Services or service ports left out of the last table (headless, ExternalName, SCTP, invalid); /debug/services says why.",
			func(s *service.Stats) float64 { return float64(s.Skipped) }),
	}}
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

// conntrackGroup: the connection tracking table.
func conntrackGroup(snap func() conntrack.Stats) metricGroup {
	return &group[conntrack.Stats]{snapshot: snap, defs: []def[conntrack.Stats]{
		counter("kubeproxy_iptables_ct_state_invalid_dropped_packets_total", "Packets dropped as conntrack INVALID, where kube-proxy's iptables mode drops them to work around conntrack problems (its KUBE-FORWARD ctstate INVALID rule).",
			func(s *conntrack.Stats) uint64 { return s.InvalidTotal }),
		labeled(own("conntrack_invalid_packets_total"), "Packets dropped as conntrack INVALID, by reason.",
			prometheus.CounterValue, []string{"reason"}, func(s *conntrack.Stats, emit func(float64, ...string)) {
				for r := conntrack.ReasonNone + 1; r < conntrack.NumReasons; r++ {
					if !r.Unsupported() {
						emit(float64(s.Invalid[r]), r.String())
					}
				}
			}),
		labeled(own("conntrack_unsupported_packets_total"), "Packets dropped because conntrack tracks no flow of their kind (ICMP requests, ICMPv6 neighbour discovery, protocols other than TCP and UDP), by protocol; not INVALID.",
			prometheus.CounterValue, []string{"protocol"}, func(s *conntrack.Stats, emit func(float64, ...string)) {
				for p, n := range s.Unsupported {
					if proto := conntrack.Protocol(p); n != 0 || proto == conntrack.ICMP || proto == conntrack.ICMPv6 {
						emit(float64(n), proto.String())
					}
				}
			}),
		labeled(own("conntrack_entries"), "Entries in the conntrack table.",
			prometheus.GaugeValue, []string{"protocol"}, func(s *conntrack.Stats, emit func(float64, ...string)) {
				emit(float64(s.EntriesTCP), "tcp")
				emit(float64(s.EntriesUDP), "udp")
			}),
		gauge(own("conntrack_max"), "The bound on conntrack entries (--conntrack-max).",
			func(s *conntrack.Stats) float64 { return float64(s.Max) }),
		counter(own("conntrack_evictions_total"), "Entries that were not ASSURED dropped early to make room for a new flow.",
			func(s *conntrack.Stats) uint64 { return s.Evicted }),
	}}
}

// defragGroup: the reassembly of IP fragments ahead of conntrack.
func defragGroup(snap func() conntrack.ReassemblyStats) metricGroup {
	return &group[conntrack.ReassemblyStats]{snapshot: snap, defs: []def[conntrack.ReassemblyStats]{
		counter(own("defrag_fragments_total"), "IP fragments read from the TUN and taken for reassembly.",
			func(s *conntrack.ReassemblyStats) uint64 { return s.Fragments }),
		counter(own("defrag_reassembled_total"), "Datagrams reassembled from fragments.",
			func(s *conntrack.ReassemblyStats) uint64 { return s.Reassembled }),
		labeled(own("defrag_dropped_fragments_total"), "IP fragments dropped before reassembly completed, by reason.",
			prometheus.CounterValue, []string{"reason"}, func(s *conntrack.ReassemblyStats, emit func(float64, ...string)) {
				for d := conntrack.FragmentDropNone + 1; d < conntrack.NumFragmentDrops; d++ {
					emit(float64(s.Dropped[d]), d.String())
				}
			}),
		gauge(own("defrag_queues"), "Datagrams waiting for their missing fragments.",
			func(s *conntrack.ReassemblyStats) float64 { return float64(s.Queues) }),
		gauge(own("defrag_bytes"), "Memory charged to the fragments held, both IP families (each is bounded to 4 MiB).",
			func(s *conntrack.ReassemblyStats) float64 { return float64(s.Bytes) }),
	}}
}

// dialHistogram is the dial duration per way.
func dialHistogram(name, help string) def[proxy.Stats] {
	return def[proxy.Stats]{newDesc(name, help, "way"), func(ch chan<- prometheus.Metric, d *prometheus.Desc, s *proxy.Stats) {
		for w := range s.Dials {
			ds := &s.Dials[w]
			ch <- constHistogram(d, proxy.DialBuckets, ds.Buckets[:], ds.Count, ds.Sum.Seconds(), proxy.Way(w).String())
		}
	}}
}

// proxyGroup: new flows and the traffic spliced for them.
func proxyGroup(snap func() proxy.Stats) metricGroup {
	return &group[proxy.Stats]{snapshot: snap, defs: []def[proxy.Stats]{
		labeled(own("flows_total"), "New flows by protocol and outcome.",
			prometheus.CounterValue, []string{"protocol", "result"}, func(s *proxy.Stats, emit func(float64, ...string)) {
				for pi, proto := range []string{"tcp", "udp"} {
					for r := range s.Flows[pi] {
						emit(float64(s.Flows[pi][r]), proto, proxy.Result(r).String())
					}
				}
			}),
		dialHistogram(own("dial_duration_seconds"), "Time to dial an endpoint, by the way the dial went (direct, apiserver), failures included."),
		labeled(own("dial_failures_total"), "Endpoint dials that failed, by the way the dial went.",
			prometheus.CounterValue, []string{"way"}, func(s *proxy.Stats, emit func(float64, ...string)) {
				for w := range s.Dials {
					emit(float64(s.Dials[w].Failed), proxy.Way(w).String())
				}
			}),
		counter(own("dial_fallbacks_total"), "With --dial-via auto: first direct dials of an endpoint that went unanswered, after which the flow went through the API server (not failures).",
			func(s *proxy.Stats) uint64 { return s.Fallbacks }),
		labeled(own("flows_by_way_total"), "Proxied flows by protocol and the way they reached their endpoint: direct, apiserver.",
			prometheus.CounterValue, []string{"protocol", "way"}, func(s *proxy.Stats, emit func(float64, ...string)) {
				for pi, proto := range []string{"tcp", "udp"} {
					for w := range s.FlowsByWay[pi] {
						if proto == "udp" && proxy.Way(w) == proxy.WayAPIServer {
							continue // UDP never goes that way
						}
						emit(float64(s.FlowsByWay[pi][w]), proto, proxy.Way(w).String())
					}
				}
			}),
		labeled(own("spliced_bytes_total"), "Payload bytes copied between clients and endpoints.",
			prometheus.CounterValue, []string{"direction"}, func(s *proxy.Stats, emit func(float64, ...string)) {
				emit(float64(s.BytesToEndpoint), "to_endpoint")
				emit(float64(s.BytesToClient), "to_client")
			}),
		counter(own("affinity_hits_total"), "New flows whose endpoint ClientIP session affinity chose.",
			func(s *proxy.Stats) uint64 { return s.AffinityHits }),
		gauge(own("flows_active"), "Flows being proxied now.",
			func(s *proxy.Stats) float64 { return float64(s.LiveFlows) }),
		gauge(own("udp_sessions"), "UDP flows being relayed now.",
			func(s *proxy.Stats) float64 { return float64(s.UDPSessions) }),
	}}
}

// tunnelGroup: flows to pods through the API server's pods/portforward.
func tunnelGroup(snap func() TunnelStats) metricGroup {
	return &group[TunnelStats]{snapshot: snap, defs: []def[TunnelStats]{
		gauge(own("apiserver_tunnels"), "Port-forward tunnels open through the API server, one per pod in use.",
			func(s *TunnelStats) float64 { return float64(s.Tunnels) }),
		labeled(own("apiserver_tunnel_events_total"), "Port-forward tunnels by what happened to them: opened, open_failed, broken (under their flows), idle_closed.",
			prometheus.CounterValue, []string{"event"}, func(s *TunnelStats, emit func(float64, ...string)) {
				emit(float64(s.Opens), "opened")
				emit(float64(s.OpenFailures), "open_failed")
				emit(float64(s.Broken), "broken")
				emit(float64(s.IdleClosed), "idle_closed")
			}),
		gauge(own("apiserver_streams"), "Flows carried through the API server now.",
			func(s *TunnelStats) float64 { return float64(s.StreamsOpen) }),
		labeled(own("apiserver_streams_total"), "Flows through the API server by outcome: opened, open_failed (the streams could not be created), error (the kubelet or the tunnel ended the flow with an error).",
			prometheus.CounterValue, []string{"result"}, func(s *TunnelStats, emit func(float64, ...string)) {
				emit(float64(s.Streams), "opened")
				emit(float64(s.StreamFailures), "open_failed")
				emit(float64(s.StreamErrors), "error")
			}),
	}}
}

// gateGroup: the packet gate in front of the stack.
func gateGroup(snap func() GateStats) metricGroup {
	return &group[GateStats]{snapshot: snap, defs: []def[GateStats]{
		labeled(own("gate_packets_total"), "Packets read from the TUN (in) and written to it (out).",
			prometheus.CounterValue, []string{"direction"}, func(s *GateStats, emit func(float64, ...string)) {
				emit(float64(s.PacketsIn), "in")
				emit(float64(s.PacketsOut), "out")
			}),
		labeled(own("gate_invalid_packets_total"), "Packets the gate dropped as INVALID, by direction.",
			prometheus.CounterValue, []string{"direction"}, func(s *GateStats, emit func(float64, ...string)) {
				emit(float64(s.InvalidIn), "in")
				emit(float64(s.InvalidOut), "out")
			}),
		counter(own("gate_accepted_flows_total"), "New flows admitted into the stack.",
			func(s *GateStats) uint64 { return s.Accepted }),
		counter(own("gate_rejected_flows_total"), "New flows refused with an ICMP port unreachable (no service, no endpoints).",
			func(s *GateStats) uint64 { return s.Rejected }),
		counter(own("gate_reject_rate_limited_total"), "ICMP unreachables not sent because of the rate limit.",
			func(s *GateStats) uint64 { return s.RejectRateLimited }),
		counter(own("gate_stray_resets_total"), "RSTs sent for client TCP segments of no flow, in the window after a start that followed a proxy that crashed (docs/handover.md).",
			func(s *GateStats) uint64 { return s.StrayResets }),
		counter(own("gate_dropped_flows_total"), "New flows dropped silently (internalTrafficPolicy Local without a local endpoint).",
			func(s *GateStats) uint64 { return s.Dropped }),
		counter(own("gate_table_full_total"), "New flows refused because the conntrack table was full.",
			func(s *GateStats) uint64 { return s.TableFull }),
		counter(own("gate_in_flight_limited_total"), "TCP SYNs dropped by the limit on handshakes in flight.",
			func(s *GateStats) uint64 { return s.InFlightLimited }),
		gauge(own("gate_tcp_handshakes_in_flight"), "TCP handshakes waiting for the proxy to dial the endpoint.",
			func(s *GateStats) float64 { return float64(s.TCPInFlight) }),
		counter(own("gate_oversized_packets_total"), "Packets dropped for being larger than 64 KiB.",
			func(s *GateStats) uint64 { return s.Oversized }),
		counter(own("gate_link_unsupported_packets_total"), "Packets the TUN handed over that the link dropped unread: a virtio-net header asking for an offload it did not offer, or longer than 64 KiB.",
			func(s *GateStats) uint64 { return s.LinkUnsupported }),
		labeled(own("gate_link_queue_packets_total"), "Packets each queue of the TUN handed over (--tun-queues): the kernel puts a flow on the queue its replies leave by, so these show how the flows spread over the readers.",
			prometheus.CounterValue, []string{"queue"}, func(s *GateStats, emit func(float64, ...string)) {
				for q, n := range s.LinkQueueReads {
					emit(float64(n), strconv.Itoa(q))
				}
			}),
		counter(own("gate_handler_panics_total"), "Flow handler panics the stack recovered from.",
			func(s *GateStats) uint64 { return s.HandlerPanics }),
		counter(own("gate_translated_flow_panics_total"), "Translated TCP flows reset because their TCP code panicked (each logged with its stack).",
			func(s *GateStats) uint64 { return s.FlowPanics }),
		labeled(own("gate_translated_timer_fires_total"), "Wake-ups of translated TCP flows' timers: rto (retransmissions, window probes, SYN-ACKs), ack (held ACKs, looks at a window cut short by a full endpoint socket).",
			prometheus.CounterValue, []string{"timer"}, func(s *GateStats, emit func(float64, ...string)) {
				emit(float64(s.TimerRTOFires), "rto")
				emit(float64(s.TimerAckFires), "ack")
			}),
		counter(own("gate_handshakes_aborted_total"), "TCP handshakes aborted because the client did not complete them in time.",
			func(s *GateStats) uint64 { return s.HandshakesAborted }),
		labeled(own("gate_reset_after_entry_packets_total"), "Packets of TCP flows ended after their conntrack entry was gone (flush, expiry) let through so that the client gets its RST: RSTs out, and client segments in for the stack to answer with one.",
			prometheus.CounterValue, []string{"direction"}, func(s *GateStats, emit func(float64, ...string)) {
				emit(float64(s.SegmentsAfterEntry), "in")
				emit(float64(s.ResetsAfterEntry), "out")
			}),
		labeled(own("gate_synack_waits_total"), "Client segments held back while their flow's SYN-ACK was being written to the TUN (so that gVisor does not spin on the endpoint the writer holds), by how the wait ended: written, or timed_out at its 1 ms bound.",
			prometheus.CounterValue, []string{"end"}, func(s *GateStats, emit func(float64, ...string)) {
				emit(float64(s.SYNACKWaitsWritten), "written")
				emit(float64(s.SYNACKWaitsTimedOut), "timed_out")
			}),
		labeled(own("gate_acks_held_total"), "Pure ACKs to clients held back for the flow's next segment to carry, as the endpoint's kernel delays the ACK of a lone segment, by how the hold ended: superseded (the next segment carried it), expired (written after 1 ms), flushed (written early: a client RST that gVisor ignores, or an older acknowledgment after it), dropped (the client's RST or the stack's close).",
			prometheus.CounterValue, []string{"end"}, func(s *GateStats, emit func(float64, ...string)) {
				emit(float64(s.AcksSuperseded), "superseded")
				emit(float64(s.AcksExpired), "expired")
				emit(float64(s.AcksFlushed), "flushed")
				emit(float64(s.AcksDropped), "dropped")
			}),
	}}
}

// dnsGroup: the cluster DNS responder.
func dnsGroup(snap func() clusterdns.Stats) metricGroup {
	return &group[clusterdns.Stats]{snapshot: snap, defs: []def[clusterdns.Stats]{
		labeled(own("dns_queries_total"), "Cluster DNS queries answered, by query type and response code.",
			prometheus.CounterValue, []string{"type", "rcode"}, func(s *clusterdns.Stats, emit func(float64, ...string)) {
				for _, q := range s.Queries {
					emit(float64(q.N), q.Type, q.Rcode)
				}
			}),
		counter(own("dns_dropped_total"), "Cluster DNS messages left unanswered (responses, messages shorter than a header).",
			func(s *clusterdns.Stats) uint64 { return s.Dropped }),
		counter(own("dns_truncated_total"), "Cluster DNS replies sent over UDP with the TC bit (the client retries over TCP).",
			func(s *clusterdns.Stats) uint64 { return s.Truncated }),
		counter(own("dns_forwarded_total"), "Queries outside the cluster domain sent to --dns-upstream.",
			func(s *clusterdns.Stats) uint64 { return s.Forwarded }),
		counter(own("dns_upstream_errors_total"), "Forwarded queries the upstream server did not answer in time (answered SERVFAIL).",
			func(s *clusterdns.Stats) uint64 { return s.UpstreamErrors }),
	}}
}

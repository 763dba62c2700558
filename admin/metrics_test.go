package admin_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// GateStats must stay convertible from netstack.Stats: cmd wires
// admin.GateStats(stack.Stats()).
var _ = admin.GateStats(netstack.Stats{})

// Fakes: each returns a fixed snapshot.
type (
	fakeConntrack   struct{ s conntrack.Stats }
	fakeReassembler struct{ s conntrack.ReassemblyStats }
	fakeProxy       struct{ s proxy.Stats }
	fakeTracker     struct{ s service.Stats }
	fakeDNS         struct {
		s  clusterdns.Stats
		st clusterdns.Status
	}
)

func (f fakeDNS) Stats() clusterdns.Stats   { return f.s }
func (f fakeDNS) Status() clusterdns.Status { return f.st }

// dnsFake holds a responder's counters, and its status with one address
// served and one stepped aside.
var dnsFake = fakeDNS{
	s: clusterdns.Stats{
		Queries:   []clusterdns.QueryCount{{Type: "A", Rcode: "NOERROR", N: 5}, {Type: "SRV", Rcode: "NXDOMAIN", N: 1}},
		Dropped:   1,
		Truncated: 2,
		Forwarded: 3, UpstreamErrors: 1,
	},
	st: clusterdns.Status{Domain: "cluster.local.", Addrs: []clusterdns.AddrStatus{
		{Addr: netip.MustParseAddrPort("10.96.0.10:53")},
		{Addr: netip.MustParseAddrPort("[fd00:96::a]:53"), SteppedAsideFor: "kube-system/kube-dns"},
	}},
}

func (f fakeConntrack) Stats() conntrack.Stats             { return f.s }
func (f fakeReassembler) Stats() conntrack.ReassemblyStats { return f.s }
func (f fakeProxy) Stats() proxy.Stats                     { return f.s }
func (f fakeTracker) Stats() service.Stats                 { return f.s }

func fakeSources() admin.Sources {
	var ct conntrack.Stats
	ct.Invalid[conntrack.ReasonNoEntryNotSYN] = 2
	ct.Invalid[conntrack.ReasonBadChecksum] = 1
	ct.InvalidTotal = 3
	ct.Entries, ct.EntriesTCP, ct.EntriesUDP, ct.Max = 7, 5, 2, 131072
	ct.Evicted = 4
	ct.Unsupported[conntrack.ICMP], ct.Unsupported[47], ct.UnsupportedTotal = 6, 1, 7

	var rs conntrack.ReassemblyStats
	rs.Fragments, rs.Reassembled, rs.Delivered = 20, 4, 12
	rs.Dropped[conntrack.FragmentDropTimeout], rs.Dropped[conntrack.FragmentDropOverlap] = 3, 2
	rs.Queues, rs.HeldFragments, rs.Bytes = 2, 3, 5000

	var px proxy.Stats
	px.Flows[0][proxy.ResultProxied] = 10
	px.Flows[0][proxy.ResultDialFailed] = 1
	px.Flows[1][proxy.ResultRejectedNoEndpoints] = 2
	px.AffinityHits = 6
	px.BytesToEndpoint, px.BytesToClient = 1000, 5000
	px.Dials[proxy.WayDirect].Count, px.Dials[proxy.WayDirect].Sum = 3, 1500*time.Microsecond
	px.Dials[proxy.WayAPIServer].Count, px.Dials[proxy.WayAPIServer].Sum = 2, 40*time.Millisecond
	px.Dials[proxy.WayAPIServer].Failed = 1
	px.FlowsByWay[0][proxy.WayAPIServer], px.FlowsByWay[0][proxy.WayDirect], px.Fallbacks = 7, 3, 2
	for i, b := range proxy.DialBuckets {
		switch {
		case b >= 0.001:
			px.Dials[proxy.WayDirect].Buckets[i] = 3
		case b >= 0.0005:
			px.Dials[proxy.WayDirect].Buckets[i] = 2
		}
		if b >= 0.025 {
			px.Dials[proxy.WayAPIServer].Buckets[i] = 2
		}
	}
	px.LiveFlows, px.UDPSessions = 4, 1

	tr := service.Stats{
		Syncs:           2,
		LastSyncTime:    time.Unix(1735689600, 500e6),
		ServiceChanges:  8,
		EndpointChanges: 9,
		SyncDuration: service.Histogram{
			Bounds: []float64{0.001, 0.002}, Buckets: []uint64{1, 2}, Count: 2, Sum: 0.0025,
		},
		NetworkProgrammingLatency: service.Histogram{
			Bounds: []float64{0.25, 0.5}, Buckets: []uint64{0, 1}, Count: 1, Sum: 0.3,
		},
		NetworkProgrammingLatencyByFamily: service.PerFamily[service.Histogram]{
			IPv4: service.Histogram{Bounds: []float64{0.25, 0.5}, Buckets: []uint64{0, 1}, Count: 1, Sum: 0.3},
			IPv6: service.Histogram{Bounds: []float64{0.25, 0.5}, Buckets: []uint64{0, 0}},
		},
		NoLocalEndpoints: service.NoLocalEndpointsCount{Internal: 1, External: 2},
		NoLocalEndpointsByFamily: service.PerFamily[service.NoLocalEndpointsCount]{
			IPv4: service.NoLocalEndpointsCount{Internal: 1, External: 1},
			IPv6: service.NoLocalEndpointsCount{External: 1},
		},
		ServiceChangesPending: 1, EndpointChangesPending: 2,
		LastQueuedTime: time.Unix(1735689601, 0),
		Services:       3, Ports: 4, Skipped: 1,
	}
	return admin.Sources{
		Conntrack:   fakeConntrack{ct},
		Reassembler: fakeReassembler{rs},
		Proxy:       fakeProxy{px},
		Tracker:     fakeTracker{tr},
		Gate: func() admin.GateStats {
			return admin.GateStats{PacketsIn: 100, PacketsOut: 90, InvalidIn: 3, Rejected: 2, RejectRateLimited: 1,
				Dropped: 1, TableFull: 5, Accepted: 11, TCPInFlight: 2, InFlightLimited: 7, SYNACKWaitsWritten: 5, SYNACKWaitsTimedOut: 1,
				AcksSuperseded: 40, AcksExpired: 3, AcksFlushed: 2, AcksDropped: 1, LinkQueueReads: []uint64{60, 40}}
		},
		ReloadErrors: func() uint64 { return 2 },
		NodePorts:    func() admin.NodePortStats { return admin.NodePortStats{Open: 3, Failed: 1} },
		DNS:          dnsFake,
	}
}

// TestMetricsExposition scrapes /metrics over HTTP and finds the values the
// fakes hold.
func TestMetricsExposition(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	if err := admin.RegisterMetrics(reg, fakeSources()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(admin.New(admin.Config{Gatherer: reg}).Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, line := range []string{
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total 3",
		`userproxy_conntrack_invalid_packets_total{reason="no_entry_not_syn"} 2`,
		`userproxy_conntrack_invalid_packets_total{reason="bad_checksum"} 1`,
		`userproxy_conntrack_invalid_packets_total{reason="out_of_window"} 0`,
		`userproxy_conntrack_invalid_packets_total{reason="icmp_no_flow"} 0`,
		`userproxy_conntrack_unsupported_packets_total{protocol="icmp"} 6`,
		`userproxy_conntrack_unsupported_packets_total{protocol="icmpv6"} 0`,
		`userproxy_conntrack_unsupported_packets_total{protocol="47"} 1`,
		`userproxy_gate_link_queue_packets_total{queue="0"} 60`,
		`userproxy_gate_link_queue_packets_total{queue="1"} 40`,
		"userproxy_defrag_fragments_total 20",
		"userproxy_defrag_reassembled_total 4",
		`userproxy_defrag_dropped_fragments_total{reason="timeout"} 3`,
		`userproxy_defrag_dropped_fragments_total{reason="overlap"} 2`,
		`userproxy_defrag_dropped_fragments_total{reason="memory"} 0`,
		`userproxy_defrag_dropped_fragments_total{reason="too_big"} 0`,
		"userproxy_defrag_queues 2",
		"userproxy_defrag_bytes 5000",
		`userproxy_conntrack_entries{protocol="tcp"} 5`,
		`userproxy_conntrack_entries{protocol="udp"} 2`,
		"userproxy_conntrack_max 131072",
		"userproxy_conntrack_evictions_total 4",
		`userproxy_flows_total{protocol="tcp",result="proxied"} 10`,
		`userproxy_flows_total{protocol="tcp",result="dial_failed"} 1`,
		`userproxy_flows_total{protocol="udp",result="rejected_no_endpoints"} 2`,
		`userproxy_flows_total{protocol="udp",result="table_full"} 0`,
		`userproxy_spliced_bytes_total{direction="to_endpoint"} 1000`,
		`userproxy_spliced_bytes_total{direction="to_client"} 5000`,
		"userproxy_affinity_hits_total 6",
		"userproxy_flows_active 4",
		"userproxy_udp_sessions 1",
		`userproxy_dial_duration_seconds_bucket{way="direct",le="0.00025"} 0`,
		`userproxy_dial_duration_seconds_bucket{way="direct",le="0.0005"} 2`,
		`userproxy_dial_duration_seconds_bucket{way="direct",le="0.001"} 3`,
		`userproxy_dial_duration_seconds_bucket{way="direct",le="+Inf"} 3`,
		`userproxy_dial_duration_seconds_sum{way="direct"} 0.0015`,
		`userproxy_dial_duration_seconds_count{way="direct"} 3`,
		`userproxy_dial_duration_seconds_bucket{way="apiserver",le="0.01"} 0`,
		`userproxy_dial_duration_seconds_bucket{way="apiserver",le="0.025"} 2`,
		`userproxy_dial_duration_seconds_sum{way="apiserver"} 0.04`,
		`userproxy_dial_duration_seconds_count{way="apiserver"} 2`,
		`userproxy_dial_failures_total{way="direct"} 0`,
		`userproxy_dial_failures_total{way="apiserver"} 1`,
		`userproxy_flows_by_way_total{protocol="tcp",way="apiserver"} 7`,
		`userproxy_flows_by_way_total{protocol="tcp",way="direct"} 3`,
		`userproxy_flows_by_way_total{protocol="udp",way="direct"} 0`,
		"userproxy_dial_fallbacks_total 2",
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv4",le="0.001"} 1`,
		`kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="IPv6",le="0.002"} 2`,
		`kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="IPv4"} 0.0025`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7356896005e+09`,
		`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7356896005e+09`,
		`kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds{ip_family="IPv6"} 1.735689601e+09`,
		"kubeproxy_sync_proxy_rules_endpoint_changes_total 9",
		"kubeproxy_sync_proxy_rules_service_changes_total 8",
		"kubeproxy_sync_proxy_rules_endpoint_changes_pending 2",
		"kubeproxy_sync_proxy_rules_service_changes_pending 1",
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 1`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 0`,
		`kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 1`,
		`kubeproxy_network_programming_duration_seconds_bucket{ip_family="IPv4",le="0.5"} 1`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"} 1`,
		`kubeproxy_network_programming_duration_seconds_count{ip_family="IPv6"} 0`,
		"userproxy_services 3",
		"userproxy_service_ports 4",
		"userproxy_services_skipped 1",
		`userproxy_gate_packets_total{direction="in"} 100`,
		`userproxy_gate_invalid_packets_total{direction="in"} 3`,
		"userproxy_gate_rejected_flows_total 2",
		"userproxy_gate_reject_rate_limited_total 1",
		"userproxy_gate_dropped_flows_total 1",
		"userproxy_gate_table_full_total 5",
		"userproxy_gate_accepted_flows_total 11",
		"userproxy_gate_in_flight_limited_total 7",
		"userproxy_gate_tcp_handshakes_in_flight 2",
		`userproxy_gate_synack_waits_total{end="written"} 5`,
		`userproxy_gate_synack_waits_total{end="timed_out"} 1`,
		`userproxy_gate_acks_held_total{end="superseded"} 40`,
		`userproxy_gate_acks_held_total{end="expired"} 3`,
		`userproxy_gate_acks_held_total{end="flushed"} 2`,
		`userproxy_gate_acks_held_total{end="dropped"} 1`,
		"userproxy_config_reload_errors_total 2",
		`userproxy_nodeport_sockets{state="open"} 3`,
		`userproxy_nodeport_sockets{state="failed"} 1`,
		`userproxy_dns_queries_total{rcode="NOERROR",type="A"} 5`,
		`userproxy_dns_queries_total{rcode="NXDOMAIN",type="SRV"} 1`,
		"userproxy_dns_dropped_total 1",
		"userproxy_dns_truncated_total 2",
		"userproxy_dns_forwarded_total 3",
		"userproxy_dns_upstream_errors_total 1",
	} {
		if !strings.Contains(string(body), "\n"+line+"\n") {
			t.Errorf("/metrics lacks the line %q", line)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

// TestMetricsTypes pins the type and help of some families.
func TestMetricsTypes(t *testing.T) {
	c := admin.NewCollector(fakeSources())
	want := `
# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total Packets dropped as conntrack INVALID, where kube-proxy's iptables mode drops them to work around conntrack problems (its KUBE-FORWARD ctstate INVALID rule).
# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter
kubeproxy_iptables_ct_state_invalid_dropped_packets_total 3
# HELP kubeproxy_sync_proxy_rules_no_local_endpoints_total Number of services with a Local traffic policy and no endpoints: service ports, per policy and family, in the last table.
# TYPE kubeproxy_sync_proxy_rules_no_local_endpoints_total gauge
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="external"} 1
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"} 1
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="external"} 1
kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv6",traffic_policy="internal"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want),
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total", "kubeproxy_sync_proxy_rules_no_local_endpoints_total"); err != nil {
		t.Error(err)
	}
	// promlint: the only complaint is kube-proxy's gauge named _total.
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if p.Metric != "kubeproxy_sync_proxy_rules_no_local_endpoints_total" {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

// TestMetricsFamilies: Sources.Families picks the ip_family values.
func TestMetricsFamilies(t *testing.T) {
	src := fakeSources()
	src.Families = []service.Family{service.IPv6}
	want := `
# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds The last time proxy rules were successfully synced: when the last service table went live, in seconds since the epoch; 0 before the first.
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.7356896005e+09
`
	if err := testutil.CollectAndCompare(admin.NewCollector(src), strings.NewReader(want),
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds"); err != nil {
		t.Error(err)
	}
}

// TestMetricsNilSources: a nil source contributes nothing, and the others
// still work.
func TestMetricsNilSources(t *testing.T) {
	if n := testutil.CollectAndCount(admin.NewCollector(admin.Sources{})); n != 0 {
		t.Errorf("no sources: %d metrics", n)
	}
	src := admin.Sources{Conntrack: fakeSources().Conntrack}
	reg := prometheus.NewPedanticRegistry()
	if err := admin.RegisterMetrics(reg, src); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(admin.NewCollector(src), "userproxy_flows_total"); n != 0 {
		t.Errorf("flows_total without a proxy source: %d series", n)
	}
	want := "# HELP kubeproxy_iptables_ct_state_invalid_dropped_packets_total Packets dropped as conntrack INVALID, where kube-proxy's iptables mode drops them to work around conntrack problems (its KUBE-FORWARD ctstate INVALID rule).\n" +
		"# TYPE kubeproxy_iptables_ct_state_invalid_dropped_packets_total counter\n" +
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total 3\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeproxy_iptables_ct_state_invalid_dropped_packets_total"); err != nil {
		t.Error(err)
	}
	// Registering the same names twice is refused.
	if err := admin.RegisterMetrics(reg, src); err == nil {
		t.Error("second registration accepted")
	}
}

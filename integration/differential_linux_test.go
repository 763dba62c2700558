//go:build linux

package integration

// The kernel differential suite (issue 7), scenarios 2 to 7: each drives the
// kernel path (kube-proxy's iptables rules in a namespace) and ours (the
// binary on a TUN) with the same traffic and logs one line
// "kernel: ... | userproxy: ..." per comparison. Scenario 1 and the test of
// its test are in differential_split_linux_test.go; the topology in
// differential_topology_linux_test.go.

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
)

// firstBackends returns the first n endpoint addresses.
func firstBackends(n int) []netip.Addr {
	eps := make([]netip.Addr, n)
	for i := range eps {
		eps[i] = diffBackend(i)
	}
	return eps
}

// affinityHits is how many new connections ClientIP affinity has decided so
// far: on the kernel, the counters of the service's rcheck rules; on ours,
// userproxy_affinity_hits_total (one affinity service in use at a time).
func (tp *diffTopo) affinityHits(p *diffPath, svc string) int {
	if p == tp.kernel {
		return tp.kernelAffinityHits(svc)
	}
	return int(metric(tp.metrics(), "userproxy_affinity_hits_total"))
}

// flowsCounter is userproxy_flows_total for TCP and one result.
func flowsCounter(body string, r proxy.Result) int {
	return int(metric(body, fmt.Sprintf(`userproxy_flows_total{protocol="tcp",result="%s"}`, r)))
}

// Scenario 2: ClientIP affinity. A client's connections land on one
// endpoint, other clients may land elsewhere; the entries expire after
// timeoutSeconds and the lottery runs again; a list holds ip_list_tot
// clients and the least recently set one loses its affinity first.
func TestDifferentialAffinity(t *testing.T) {
	const timeout = 3 // timeoutSeconds of the expiring service
	tp := newDiffTopo(t, []diffService{
		{name: "aff", clusterIP: "10.96.2.1", endpoints: firstBackends(3), affinity: timeout},
		{name: "afflist", clusterIP: "10.96.2.2", endpoints: firstBackends(1), affinity: 3600},
	})

	t.Run("pin_and_expire", func(t *testing.T) {
		var res [2]pinResult
		for i, p := range tp.paths() {
			r, err := tp.pinAndExpire(p, "10.96.2.1:80", "aff", timeout)
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			res[i] = r
		}
		t.Logf("kernel: %v | userproxy: %v", res[0], res[1])
		for i, p := range tp.paths() {
			r := res[i]
			if r.pinned != r.clients || r.pinHits != r.clients*pinRepeats {
				t.Errorf("%s: not every client was pinned to its first endpoint: %v", p.name, r)
			}
			if r.distinct < 2 {
				t.Errorf("%s: %d clients all landed on one endpoint of three (chance 3^-%d): %v", p.name, r.clients, r.clients-1, r)
			}
			if r.expiredHits != 0 {
				t.Errorf("%s: %d affinity hits after the %d s timeout, want none: %v", p.name, r.expiredHits, timeout, r)
			}
			if r.changed == 0 {
				t.Errorf("%s: after expiry no client of %d moved (chance 3^-%d): the lottery did not run again: %v", p.name, r.clients, r.clients, r)
			}
			if r.repinned != r.clients || r.repinHits != r.clients {
				t.Errorf("%s: clients not pinned again to their new endpoint: %v", p.name, r)
			}
		}
	})

	t.Run("list_size", func(t *testing.T) {
		if tp.listTot+1 > diffPoolSize {
			t.Fatalf("xt_recent ip_list_tot is %d: the test has %d client addresses, needs %d", tp.listTot, diffPoolSize, tp.listTot+1)
		}
		var res [2]listResult
		for i, p := range tp.paths() {
			r, err := tp.listOverflow(p, "10.96.2.2:80", "afflist")
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			res[i] = r
		}
		t.Logf("list size %d (xt_recent ip_list_tot; userproxy --affinity-list-size), %d clients: kernel: %v | userproxy: %v",
			tp.listTot, tp.listTot+1, res[0], res[1])
		want := listResult{fillHits: 0, atFullHit: 1, evictedHit: 0, survivorHit: 1}
		for i, p := range tp.paths() {
			if res[i] != want {
				t.Errorf("%s: %v, want %v", p.name, res[i], want)
			}
		}
	})
}

// pinRepeats is how many connections each client makes after its first
// while its affinity holds.
const pinRepeats = 4

// pinResult is what pinAndExpire saw on one path.
type pinResult struct {
	clients     int
	pinned      int // clients whose repeats all landed on their first endpoint
	pinHits     int // affinity hits on first connections and repeats (want clients*pinRepeats: every repeat, no first)
	distinct    int // endpoints among the first picks
	expiredHits int // affinity hits after the timeout (want 0)
	changed     int // clients on another endpoint after the timeout
	repinned    int // clients staying on that new endpoint
	repinHits   int // affinity hits then (want clients)
}

func (r pinResult) String() string {
	return fmt.Sprintf("%d clients x %d connections: pinned %d/%d (affinity hits %d) over %d endpoints; after expiry hits %d, moved %d, re-pinned %d (hits %d)",
		r.clients, 1+pinRepeats, r.pinned, r.clients, r.pinHits, r.distinct, r.expiredHits, r.changed, r.repinned, r.repinHits)
}

// pinAndExpire: each of 30 clients connects once (the lottery) and at once
// pinRepeats times more (affinity); after the timeout each connects once more
// (the lottery again: some move), then once more (pinned to the new pick).
func (tp *diffTopo) pinAndExpire(p *diffPath, addr, svc string, timeout int) (pinResult, error) {
	const clients = 30
	r := pinResult{clients: clients}
	first := make([]netip.Addr, clients)
	again := make([]netip.Addr, clients)
	seen := map[netip.Addr]bool{}
	h0 := tp.affinityHits(p, svc)
	for i := range clients {
		ep, err := p.fetch(diffPool(i), addr)
		if err != nil {
			return r, err
		}
		first[i] = ep
		seen[ep] = true
		same := true
		for range pinRepeats {
			ep, err := p.fetch(diffPool(i), addr)
			if err != nil {
				return r, err
			}
			same = same && ep == first[i]
		}
		if same {
			r.pinned++
		}
	}
	r.distinct = len(seen)
	h2 := tp.affinityHits(p, svc)
	r.pinHits = h2 - h0
	// Every client's last --set was its last connection above.
	time.Sleep(time.Duration(timeout)*time.Second + time.Second)
	for i := range clients {
		ep, err := p.fetch(diffPool(i), addr)
		if err != nil {
			return r, err
		}
		again[i] = ep
		if ep != first[i] {
			r.changed++
		}
	}
	h3 := tp.affinityHits(p, svc)
	r.expiredHits = h3 - h2
	for i := range clients {
		ep, err := p.fetch(diffPool(i), addr)
		if err != nil {
			return r, err
		}
		if ep == again[i] {
			r.repinned++
		}
	}
	r.repinHits = tp.affinityHits(p, svc) - h3
	return r, nil
}

// listResult is what listOverflow saw on one path.
type listResult struct {
	fillHits    int // affinity hits while L clients filled the list (want 0)
	atFullHit   int // the first client, with the list exactly full (want 1)
	evictedHit  int // the second client, after one client more than the list holds (want 0)
	survivorHit int // the first client again (want 1)
}

func (r listResult) String() string {
	return fmt.Sprintf("hits: filling %d, oldest at a full list %d, next-oldest after overflow %d, refreshed oldest %d",
		r.fillHits, r.atFullHit, r.evictedHit, r.survivorHit)
}

// listOverflow, on a service with one endpoint (one list), L = ip_list_tot:
//
//  1. clients o1, o2, then L-2 others: the list is exactly full;
//  2. o1 again: an affinity hit, and o1 becomes the most recently set;
//  3. one client more: the list evicts its least recently set entry, o2;
//  4. o2 again: no affinity (the lottery decides); o1 again: a hit.
//
// L+1 client addresses in all.
func (tp *diffTopo) listOverflow(p *diffPath, addr, svc string) (listResult, error) {
	var r listResult
	l := tp.listTot
	o1, o2 := diffPool(0), diffPool(1)
	fetch := func(src netip.Addr) (int, error) {
		h := tp.affinityHits(p, svc)
		if _, err := p.fetch(src, addr); err != nil {
			return 0, err
		}
		return tp.affinityHits(p, svc) - h, nil
	}
	h := tp.affinityHits(p, svc)
	for _, src := range []netip.Addr{o1, o2} {
		if _, err := p.fetch(src, addr); err != nil {
			return r, err
		}
	}
	for i := range l - 2 {
		if _, err := p.fetch(diffPool(2+i), addr); err != nil {
			return r, err
		}
	}
	r.fillHits = tp.affinityHits(p, svc) - h
	var err error
	if r.atFullHit, err = fetch(o1); err != nil {
		return r, err
	}
	if _, err := p.fetch(diffPool(2+l-2), addr); err != nil {
		return r, err
	}
	if r.evictedHit, err = fetch(o2); err != nil {
		return r, err
	}
	if r.survivorHit, err = fetch(o1); err != nil {
		return r, err
	}
	return r, nil
}

// Scenarios 3, 6 and 7: refused and dropped connections.
func TestDifferentialRefusals(t *testing.T) {
	tp := newDiffTopo(t, []diffService{
		{name: "web", clusterIP: "10.96.3.1", endpoints: firstBackends(2)},
		{name: "none", clusterIP: "10.96.3.2"},
		{name: "local", clusterIP: "10.96.3.3", endpoints: firstBackends(1), local: true},
	})
	const dialTimeout = 2 * time.Second

	// outcomes dials addr on both paths and returns how each ended.
	outcomes := func(addr string) [2]string {
		var out [2]string
		for i, p := range tp.paths() {
			out[i] = dialOutcome(p.dial(diffClient, addr, dialTimeout))
		}
		return out
	}

	t.Run("3_no_endpoints", func(t *testing.T) {
		before := tp.metrics()
		got := outcomes("10.96.3.2:80")
		rejects := ruleCounter(tp.iptablesSave("filter"), "KUBE-SERVICES", `"default/none:p has no endpoints"`, "-j REJECT")
		ours := flowsCounter(tp.metrics(), proxy.ResultRejectedNoEndpoints) - flowsCounter(before, proxy.ResultRejectedNoEndpoints)
		t.Logf("kernel: %s (filter REJECT rule: %d packets) | userproxy: %s (flows rejected_no_endpoints +%d)", got[0], rejects, got[1], ours)
		if got[0] != "ECONNREFUSED" || got[1] != "ECONNREFUSED" {
			t.Errorf("want ECONNREFUSED on both paths")
		}
		if rejects < 1 || ours != 1 {
			t.Errorf("the refusal was not counted: REJECT rule %d, rejected_no_endpoints +%d", rejects, ours)
		}
	})

	t.Run("6_undefined_port", func(t *testing.T) {
		// The ClusterIP answers on its defined port on both paths ...
		for _, p := range tp.paths() {
			if _, err := p.fetch(diffClient, "10.96.3.1:80"); err != nil {
				t.Fatalf("%s: the defined port: %v", p.name, err)
			}
		}
		// ... and port 81 is not defined.
		before := tp.metrics()
		got := outcomes("10.96.3.1:81")
		ours := flowsCounter(tp.metrics(), proxy.ResultRejectedNoService) - flowsCounter(before, proxy.ResultRejectedNoService)
		untranslated, err := tp.kernelUntranslated(netip.MustParseAddrPort("10.96.3.1:81"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kernel: %s (no rule matches: conntrack shows the SYN sent on untranslated: %v; nothing at the ClusterIP answers) | userproxy: %s (flows rejected_no_service +%d)",
			got[0], untranslated, got[1], ours)
		if got[0] != "timeout" || !untranslated {
			t.Errorf("kernel: want the connection to fall through untranslated and time out")
		}
		if got[1] != "ECONNREFUSED" || ours != 1 {
			t.Errorf("userproxy: want ECONNREFUSED, counted as rejected_no_service (our documented REJECT)")
		}
	})

	t.Run("7_local_policy_no_local_endpoint", func(t *testing.T) {
		before := tp.metrics()
		got := outcomes("10.96.3.3:80")
		drops := ruleCounter(tp.iptablesSave("filter"), "KUBE-SERVICES", `"default/local:p has no local endpoints"`, "-j DROP")
		ours := flowsCounter(tp.metrics(), proxy.ResultDroppedLocalPolicy) - flowsCounter(before, proxy.ResultDroppedLocalPolicy)
		t.Logf("kernel: %s after %v (filter DROP rule: %d packets) | userproxy: %s after %v (flows dropped_local_policy +%d)",
			got[0], dialTimeout, drops, got[1], dialTimeout, ours)
		if got[0] != "timeout" || got[1] != "timeout" {
			t.Errorf("want a timeout (DROP) on both paths")
		}
		if drops < 1 || ours < 1 {
			t.Errorf("the drop was not counted: DROP rule %d, dropped_local_policy +%d", drops, ours)
		}
	})
}

// kernelUntranslated reports whether K's conntrack table holds a TCP entry
// to dst whose reply comes from dst itself: a connection no DNAT rule
// touched.
func (tp *diffTopo) kernelUntranslated(dst netip.AddrPort) (bool, error) {
	flows, err := tp.kernelConntrack().ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("listing K's conntrack table: %w", err)
	}
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_TCP && f.Forward.DstIP.Equal(dst.Addr().AsSlice()) && f.Forward.DstPort == dst.Port() {
			return f.Reverse.SrcIP.Equal(dst.Addr().AsSlice()) && f.Reverse.SrcPort == dst.Port(), nil
		}
	}
	return false, fmt.Errorf("no conntrack entry to %s in %s", dst, tp.kernel.nsName)
}

// Scenario 4: UDP flows stick to their endpoint; when an endpoint leaves,
// the flows on it move to a live endpoint with their next datagram and the
// others stay. The kernel gets new rules and kube-proxy's conntrack cleanup
// (delete the UDP entries to the ClusterIP:port whose reply comes from the
// removed endpoint); userproxy reloads the file and cleans up itself.
func TestDifferentialUDPEndpointRemoved(t *testing.T) {
	const (
		svcIP   = "10.96.4.1"
		flows   = 24
		repeats = 5
	)
	svc := diffService{name: "dns", clusterIP: svcIP, udp: true, endpoints: firstBackends(3)}
	tp := newDiffTopo(t, []diffService{svc})
	addr := svcIP + ":53"

	type pathFlows struct {
		conns  []net.Conn
		ep     []netip.Addr
		sticky int
		per    map[netip.Addr]int
	}
	var pf [2]*pathFlows
	for i, p := range tp.paths() {
		f := &pathFlows{per: map[netip.Addr]int{}}
		pf[i] = f
		for range flows {
			c, err := p.udpFlow(diffClient, addr)
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			t.Cleanup(func() { c.Close() })
			f.conns = append(f.conns, c)
			var first netip.Addr
			same := true
			for k := range repeats {
				ep, err := udpAsk(c)
				if err != nil {
					t.Fatalf("%s: %v", p.name, err)
				}
				if k == 0 {
					first = ep
				}
				same = same && ep == first
			}
			f.ep = append(f.ep, first)
			f.per[first]++
			if same {
				f.sticky++
			}
		}
	}
	t.Logf("stickiness (%d flows x %d datagrams): kernel: %d sticky, per endpoint %v | userproxy: %d sticky, per endpoint %v",
		flows, repeats, pf[0].sticky, pf[0].per, pf[1].sticky, pf[1].per)
	if pf[0].sticky != flows || pf[1].sticky != flows {
		t.Fatalf("UDP flows did not stick to their endpoint")
	}

	// Remove the endpoint with the most flows on both paths.
	var gone netip.Addr
	for _, ep := range svc.endpoints {
		if !gone.IsValid() || min(pf[0].per[ep], pf[1].per[ep]) > min(pf[0].per[gone], pf[1].per[gone]) {
			gone = ep
		}
	}
	if min(pf[0].per[gone], pf[1].per[gone]) == 0 {
		t.Fatalf("no endpoint holds flows on both paths: kernel %v, userproxy %v", pf[0].per, pf[1].per)
	}
	var live []netip.Addr
	for _, ep := range svc.endpoints {
		if ep != gone {
			live = append(live, ep)
		}
	}
	svc.endpoints = live
	tp.reload([]diffService{svc})
	// The kernel: kube-proxy's cleanup after the sync.
	filter := &netlink.ConntrackFilter{}
	for _, err := range []error{
		filter.AddProtocol(unix.IPPROTO_UDP),
		filter.AddIP(netlink.ConntrackOrigDstIP, net.ParseIP(svcIP)),
		filter.AddPort(netlink.ConntrackOrigDstPort, 53),
		filter.AddIP(netlink.ConntrackReplySrcIP, gone.AsSlice()),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	deleted, err := tp.kernelConntrack().ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, filter)
	if err != nil {
		t.Fatalf("deleting the kernel's conntrack entries of %s: %v", gone, err)
	}
	// Ours: wait for the new table, then for its own cleanup.
	tp.waitOurTable(func(s string) bool {
		for line := range strings.Lines(s) {
			if strings.HasPrefix(line, "default/dns:p ") {
				return strings.Contains(line, "forward to 2 endpoints")
			}
		}
		return false
	})
	waitFor(t, "userproxy to delete the conntrack entries of "+gone.String(), func() bool {
		code, body, err := tp.ours.admin.get("/debug/conntrack?protocol=udp&endpoint=" + gone.String())
		return err == nil && code == http.StatusOK && strings.TrimSpace(body) == ""
	})

	// The next datagram of each flow.
	type after struct{ moved, movedLive, stayed, stayedSame, stickyAfter int }
	var res [2]after
	for i, p := range tp.paths() {
		f, r := pf[i], &res[i]
		for j, c := range f.conns {
			ep, err := udpAsk(c)
			if err != nil {
				t.Fatalf("%s: after the removal: %v", p.name, err)
			}
			if f.ep[j] == gone {
				r.moved++
				if ep != gone && (ep == live[0] || ep == live[1]) {
					r.movedLive++
				}
			} else {
				r.stayed++
				if ep == f.ep[j] {
					r.stayedSame++
				}
			}
			same := true
			for range repeats - 1 {
				again, err := udpAsk(c)
				if err != nil {
					t.Fatalf("%s: after the removal: %v", p.name, err)
				}
				same = same && again == ep
			}
			if same {
				r.stickyAfter++
			}
		}
	}
	line := func(r after) string {
		return fmt.Sprintf("%d/%d flows on %s moved to a live endpoint, %d/%d others kept theirs, %d/%d sticky afterwards",
			r.movedLive, r.moved, gone, r.stayedSame, r.stayed, r.stickyAfter, flows)
	}
	t.Logf("endpoint %s removed: kernel (conntrack entries deleted: %d): %s | userproxy: %s", gone, deleted, line(res[0]), line(res[1]))
	if int(deleted) != pf[0].per[gone] {
		t.Errorf("kernel: deleted %d conntrack entries, want one per flow on %s (%d)", deleted, gone, pf[0].per[gone])
	}
	for i, p := range tp.paths() {
		r := res[i]
		if r.movedLive != r.moved || r.stayedSame != r.stayed || r.stickyAfter != flows {
			t.Errorf("%s: %s", p.name, line(r))
		}
	}
}

// Scenario 5: a stray ACK to the service port (no connection, not a SYN)
// gets no RST back on either path and is counted as INVALID. The kernel is
// run with nf_conntrack_tcp_loose=0, the model DESIGN.md names; with the
// kernel default (1) conntrack picks the ACK up as a connection, DNATs it
// and the endpoint's RST comes back — logged as a documented difference.
func TestDifferentialStrayACK(t *testing.T) {
	const svcIP = "10.96.5.1"
	tp := newDiffTopo(t, []diffService{{name: "web", clusterIP: svcIP, endpoints: firstBackends(2)}})
	svc := netip.MustParseAddrPort(svcIP + ":80")
	endpoint := netip.AddrPortFrom(diffBackend(0), diffTCPPort)
	const window = time.Second

	// strayACK sends an ACK from src:sport to dst from the client
	// namespace of p and counts the RSTs from dst back to sport: for
	// `window` when none is expected, until the first one otherwise.
	strayACK := func(p *diffPath, src netip.Addr, sport uint16, dst netip.AddrPort, expect bool) int {
		t.Helper()
		capture, err := p.c.captureTCP()
		if err != nil {
			t.Fatal(err)
		}
		defer capture.close()
		if err := p.c.inject(tcpSegment(src, sport, dst.Addr(), dst.Port(), flagACK, 1, 1)); err != nil {
			t.Fatalf("%s: injecting: %v", p.name, err)
		}
		until := 0
		if expect {
			until = 1
		}
		n, err := capture.resets(dst, sport, window, until)
		if err != nil {
			t.Fatalf("%s: capture: %v", p.name, err)
		}
		return n
	}
	forwardInvalid := func() int {
		return ruleCounter(tp.iptablesSave("filter"), "KUBE-FORWARD", "--ctstate INVALID", "-j DROP")
	}
	invalidSeries := fmt.Sprintf(`userproxy_conntrack_invalid_packets_total{reason="%s"}`, conntrack.ReasonNoEntryNotSYN)

	// The capture sees RSTs: a stray ACK straight to an endpoint (no
	// service involved) is answered by the endpoint's kernel.
	kCtl := strayACK(tp.kernel, diffClient, 40100, endpoint, true)
	uCtl := strayACK(tp.ours, diffOursAddr, 40100, endpoint, true)
	t.Logf("control, a stray ACK straight to endpoint %s: kernel: %d RST | userproxy: %d RST", endpoint, kCtl, uCtl)
	if kCtl < 1 || uCtl < 1 {
		t.Fatalf("the capture did not see the endpoint's RST: it cannot show the absence of one")
	}

	tp.kernelSysctl("net.netfilter.nf_conntrack_tcp_loose", "0")
	inv0, fwd0 := tp.conntrackInvalid(), forwardInvalid()
	kRST := strayACK(tp.kernel, diffClient, 40001, svc, false)
	inv1, fwd1 := tp.conntrackInvalid(), forwardInvalid()

	m0 := metric(tp.metrics(), invalidSeries)
	uRST := strayACK(tp.ours, diffClient, 40001, svc, false)
	var m1 float64
	deadline := time.Now().Add(5 * time.Second)
	for m1 = metric(tp.metrics(), invalidSeries); m1 <= m0 && time.Now().Before(deadline); m1 = metric(tp.metrics(), invalidSeries) {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("stray ACK to %s: kernel (nf_conntrack_tcp_loose=0): %d RST in %v, conntrack invalid +%d (/proc/net/stat/nf_conntrack), KUBE-FORWARD INVALID DROP +%d | userproxy: %d RST in %v, %s +%v",
		svc, kRST, window, inv1-inv0, fwd1-fwd0, uRST, window, invalidSeries, m1-m0)
	if kRST != 0 || uRST != 0 {
		t.Errorf("a RST came back: kernel %d, userproxy %d", kRST, uRST)
	}
	if inv1 <= inv0 || m1 <= m0 {
		t.Errorf("the stray ACK was not counted as INVALID: kernel +%d, userproxy +%v", inv1-inv0, m1-m0)
	}
	if fwd1 != fwd0 {
		t.Errorf("KUBE-FORWARD's INVALID rule counted a locally generated packet (+%d): it is hooked from FORWARD only", fwd1-fwd0)
	}

	// Documented difference: the kernel's default nf_conntrack_tcp_loose=1.
	tp.kernelSysctl("net.netfilter.nf_conntrack_tcp_loose", "1")
	kLoose := strayACK(tp.kernel, diffClient, 40002, svc, true)
	t.Logf("stray ACK to %s: kernel (default nf_conntrack_tcp_loose=1: picked up mid-stream, DNATed, the endpoint answers): %d RST | userproxy: %d RST (as with loose=0)",
		svc, kLoose, uRST)
	if kLoose < 1 {
		t.Errorf("kernel with nf_conntrack_tcp_loose=1: no RST from the endpoint; the documented difference no longer holds")
	}

	// Where kube-proxy's INVALID rule does count: packets the node
	// forwards. B plays a pod sending through K.
	tp.kernelSysctl("net.netfilter.nf_conntrack_tcp_loose", "0")
	tp.kernelSysctl("net.ipv4.ip_forward", "1")
	if err := tp.back.run(func() error {
		kb0, err := netlink.LinkByName("kb0")
		if err != nil {
			return err
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: kb0.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("10.96.0.0/12")), Gw: diffClient.AsSlice()})
	}); err != nil {
		t.Fatalf("route to the service CIDR through K: %v", err)
	}
	fwd2 := forwardInvalid()
	if err := tp.back.inject(tcpSegment(diffKernelGW, 40003, svc.Addr(), svc.Port(), flagACK, 1, 1)); err != nil {
		t.Fatal(err)
	}
	fwd3 := fwd2
	for deadline := time.Now().Add(2 * time.Second); fwd3 == fwd2 && time.Now().Before(deadline); fwd3 = forwardInvalid() {
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("stray ACK to %s forwarded through the node (from the backends namespace): kernel: KUBE-FORWARD INVALID DROP +%d | userproxy: no forwarding path (every packet enters through the TUN gate)",
		svc, fwd3-fwd2)
	if fwd3-fwd2 != 1 {
		t.Errorf("kernel: KUBE-FORWARD's INVALID rule counted %d forwarded stray ACKs, want 1", fwd3-fwd2)
	}
}

package rules_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
)

// The goldens below are ipvsadm 1.31's output (ipvsadm.c: list_all,
// print_title, print_service_entry, print_largenum) for the same virtual
// services, worked out from its printf formats. Each golden line ends in
// "|" so that the trailing blanks of ipvsadm's "%-10u" columns show;
// golden() takes the bars off.
func golden(s string) string {
	s = strings.TrimPrefix(s, "\n")
	return strings.ReplaceAll(s, "|\n", "\n")
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func dest(addr string, active, inactive int32) rules.Destination {
	return rules.Destination{Addr: ap(addr), Weight: 1, ActiveConn: active, InActConn: inactive}
}

func writeIPVS(t *testing.T, vs []rules.VirtualService, opts rules.IPVSOptions) string {
	t.Helper()
	var b strings.Builder
	if err := rules.WriteIPVS(&b, vs, opts); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestWriteIPVSList is `ipvsadm -Ln`: print_title's two lines, then per
// service "%-4s %s" of protocol and address, the scheduler, " (flags)"
// from print_sched_flags, " persistent %u"; per destination
// "  -> %-28s %-7s %-6d %-10u %-10u". Services are sorted as
// ipvs_cmp_services sorts them (family, protocol number, address, port),
// destinations as ipvs_cmp_dests (address as a number, then port: 10.0.0.9
// before 10.0.0.10, unlike kube-proxy's string order).
func TestWriteIPVSList(t *testing.T) {
	vs := []rules.VirtualService{{
		Protocol: service.UDP, Addr: ap("10.96.0.10:53"), Scheduler: "rr",
		Dests: []rules.Destination{dest("10.244.1.5:53", 0, 2)},
	}, {
		Protocol: service.TCP, Addr: ap("10.96.0.11:443"), Scheduler: "rr", Persistent: 10800 * time.Second,
	}, {
		Protocol: service.TCP, Addr: ap("10.96.0.10:80"), Scheduler: "rr",
		Dests: []rules.Destination{dest("10.244.1.10:8080", 0, 0), dest("10.244.1.5:8080", 3, 1), dest("10.244.1.9:8080", 12, 0)},
	}}
	want := golden(`
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port Scheduler Flags|
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn|
TCP  10.96.0.10:80 rr|
  -> 10.244.1.5:8080              Masq    1      3          1         |
  -> 10.244.1.9:8080              Masq    1      12         0         |
  -> 10.244.1.10:8080             Masq    1      0          0         |
TCP  10.96.0.11:443 rr persistent 10800|
UDP  10.96.0.10:53 rr|
  -> 10.244.1.5:53                Masq    1      0          2         |
`)
	if diff := cmp.Diff(want, writeIPVS(t, vs, rules.IPVSOptions{})); diff != "" {
		t.Errorf("-Ln (-want +got):\n%s", diff)
	}
	if vs[2].Dests[0].Addr != ap("10.244.1.10:8080") || vs[0].Protocol != service.UDP {
		t.Error("WriteIPVS reordered its input")
	}
}

// TestWriteIPVSSchedulerFlags: print_sched_flags joins the flags with
// commas inside " (...)", before " persistent"; "random" (the iptables
// lottery, no IPVS scheduler) stands in the scheduler column like any
// other name.
func TestWriteIPVSSchedulerFlags(t *testing.T) {
	vs := []rules.VirtualService{{
		Protocol: service.TCP, Addr: ap("10.96.0.1:80"), Scheduler: "mh", SchedFlags: []string{"mh-fallback", "mh-port"},
		Persistent: 60 * time.Second,
	}, {
		Protocol: service.TCP, Addr: ap("10.96.0.2:80"), Scheduler: "sh", SchedFlags: []string{"sh-port"},
	}, {
		Protocol: service.TCP, Addr: ap("10.96.0.3:80"), Scheduler: "wlc", SchedFlags: []string{"flag-3"},
	}, {
		Protocol: service.TCP, Addr: ap("10.96.0.4:80"), Scheduler: "random", Affinity: 3 * time.Hour,
		Dests: []rules.Destination{dest("10.244.0.4:80", 1, 0)},
	}}
	want := golden(`
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port Scheduler Flags|
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn|
TCP  10.96.0.1:80 mh (mh-fallback,mh-port) persistent 60|
TCP  10.96.0.2:80 sh (sh-port)|
TCP  10.96.0.3:80 wlc (flag-3)|
TCP  10.96.0.4:80 random|
  -> 10.244.0.4:80                Masq    1      1          0         |
`)
	if diff := cmp.Diff(want, writeIPVS(t, vs, rules.IPVSOptions{})); diff != "" {
		t.Errorf("-Ln (-want +got):\n%s", diff)
	}
}

// TestWriteIPVSIPv6: addrport_to_anyname brackets IPv6 addresses, and
// ipvs_cmp_services puts AF_INET before AF_INET6. An IPv6 name is not cut
// to the column and pushes the numbers right (--stats).
func TestWriteIPVSIPv6(t *testing.T) {
	long := rules.IPVSStats{Conns: 1, InPkts: 2, OutPkts: 3, InBytes: 4, OutBytes: 5}
	vs := []rules.VirtualService{{
		Protocol: service.TCP, Addr: ap("[fd00::10]:80"), Scheduler: "rr",
		Dests: []rules.Destination{dest("[fd00:10::2]:8080", 1, 0), dest("[fd00:10::1]:8080", 0, 0)},
	}, {
		Protocol: service.UDP, Addr: ap("[2001:db8:1234:5678:9abc:def0:1234:5678]:53"), Scheduler: "rr", Stats: long,
		Dests: []rules.Destination{{Addr: ap("[2001:db8:1234:5678:9abc:def0:1:2]:8080"), Weight: 1, Stats: long}},
	}, {
		Protocol: service.UDP, Addr: ap("10.96.0.10:53"), Scheduler: "rr",
	}}
	want := golden(`
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port Scheduler Flags|
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn|
UDP  10.96.0.10:53 rr|
TCP  [fd00::10]:80 rr|
  -> [fd00:10::1]:8080            Masq    1      0          0         |
  -> [fd00:10::2]:8080            Masq    1      1          0         |
UDP  [2001:db8:1234:5678:9abc:def0:1234:5678]:53 rr|
  -> [2001:db8:1234:5678:9abc:def0:1:2]:8080 Masq    1      0          0         |
`)
	if diff := cmp.Diff(want, writeIPVS(t, vs, rules.IPVSOptions{})); diff != "" {
		t.Errorf("-Ln (-want +got):\n%s", diff)
	}
	wantStats := golden(`
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes|
  -> RemoteAddress:Port|
UDP  10.96.0.10:53                       0        0        0        0        0|
TCP  [fd00::10]:80                       0        0        0        0        0|
  -> [fd00:10::1]:8080                   0        0        0        0        0|
  -> [fd00:10::2]:8080                   0        0        0        0        0|
UDP  [2001:db8:1234:5678:9abc:def0:1234:5678]:53        1        2        3        4        5|
  -> [2001:db8:1234:5678:9abc:def0:1:2]:8080        1        2        3        4        5|
`)
	if diff := cmp.Diff(wantStats, writeIPVS(t, vs, rules.IPVSOptions{Stats: true})); diff != "" {
		t.Errorf("-Ln --stats (-want +got):\n%s", diff)
	}
}

// TestWriteIPVSStats is `ipvsadm -Ln --stats`: "%-33s" of the service and
// "  -> %-28s" of each destination, then five print_largenum columns,
// which shrink a number of 10^8 or more to K, M, G or T (truncating).
func TestWriteIPVSStats(t *testing.T) {
	vs := []rules.VirtualService{{
		Protocol: service.TCP, Addr: ap("10.96.0.10:80"), Scheduler: "rr", Persistent: time.Hour,
		Stats: rules.IPVSStats{Conns: 12, InPkts: 345_678_901, OutPkts: 12_345_678_901, InBytes: 98_765_432_109_876, OutBytes: 123_456_789_012_345},
		Dests: []rules.Destination{{
			Addr: ap("10.244.1.5:8080"), Weight: 1,
			Stats: rules.IPVSStats{Conns: 99_999_999, InPkts: 100_000_000, OutPkts: 999_999_999, InBytes: 1_000_000_000, OutBytes: 99_999_999_999},
		}},
	}, {
		Protocol: service.UDP, Addr: ap("10.96.0.10:53"), Scheduler: "rr",
	}}
	want := golden(`
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes|
  -> RemoteAddress:Port|
TCP  10.96.0.10:80                      12  345678K   12345M   98765G     123T|
  -> 10.244.1.5:8080              99999999  100000K  999999K    1000M   99999M|
UDP  10.96.0.10:53                       0        0        0        0        0|
`)
	if diff := cmp.Diff(want, writeIPVS(t, vs, rules.IPVSOptions{Stats: true})); diff != "" {
		t.Errorf("-Ln --stats (-want +got):\n%s", diff)
	}
	// ipvsadm tests FMT_STATS before FMT_RATE.
	if diff := cmp.Diff(want, writeIPVS(t, vs, rules.IPVSOptions{Stats: true, Rate: true})); diff != "" {
		t.Errorf("-Ln --stats --rate (-want +got):\n%s", diff)
	}
}

// TestWriteIPVSRate is `ipvsadm -Ln --rate`: the service's five rates
// through print_largenum, but a destination's CPS, InPPS and OutPPS with
// " %8llu" (never shortened) and only its byte rates through
// print_largenum.
func TestWriteIPVSRate(t *testing.T) {
	vs := []rules.VirtualService{{
		Protocol: service.TCP, Addr: ap("10.96.0.10:80"), Scheduler: "rr",
		Stats: rules.IPVSStats{CPS: 123_456_789, InPPS: 2, OutPPS: 3, InBPS: 4000, OutBPS: 5_000_000_000},
		Dests: []rules.Destination{{
			Addr: ap("10.244.1.5:8080"), Weight: 1,
			Stats: rules.IPVSStats{Conns: 7, CPS: 123_456_789, InPPS: 2, OutPPS: 3, InBPS: 4000, OutBPS: 5_000_000_000},
		}},
	}}
	want := golden(`
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS|
  -> RemoteAddress:Port|
TCP  10.96.0.10:80                 123456K        2        3     4000    5000M|
  -> 10.244.1.5:8080              123456789        2        3     4000    5000M|
`)
	if diff := cmp.Diff(want, writeIPVS(t, vs, rules.IPVSOptions{Rate: true})); diff != "" {
		t.Errorf("-Ln --rate (-want +got):\n%s", diff)
	}
}

// TestWriteIPVSEmpty: list_all prints the version line and print_title's
// lines even without a virtual service.
func TestWriteIPVSEmpty(t *testing.T) {
	for _, tt := range []struct {
		opts rules.IPVSOptions
		want string
	}{
		{rules.IPVSOptions{}, `
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port Scheduler Flags|
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn|
`},
		{rules.IPVSOptions{Rate: true}, `
IP Virtual Server version 1.2.1 (size=4096)|
Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS|
  -> RemoteAddress:Port|
`},
	} {
		if diff := cmp.Diff(golden(tt.want), writeIPVS(t, nil, tt.opts)); diff != "" {
			t.Errorf("%+v (-want +got):\n%s", tt.opts, diff)
		}
	}
}

func TestWriteIPVSWriteError(t *testing.T) {
	broken := errors.New("broken pipe")
	vs := []rules.VirtualService{{Protocol: service.TCP, Addr: ap("10.96.0.10:80"), Scheduler: "rr"}}
	if err := rules.WriteIPVS(failWriter{broken}, vs, rules.IPVSOptions{}); !errors.Is(err, broken) {
		t.Errorf("WriteIPVS to a failing writer: %v", err)
	}
}

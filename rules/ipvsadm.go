package rules

// The ipvsadm printer: the service table as `ipvsadm -Ln` lists the virtual
// services of kube-proxy's IPVS mode, so that `userproxy ipvs` and
// /debug/ipvs can be held against a node running it.
//
//  1. the kernel's version line (list_all in ipvsadm.c);
//  2. the column titles of the mode (print_title);
//  3. the virtual services, sorted as ipvs_cmp_services sorts them, each a
//     line with its scheduler, flags and persistence, or its counters or
//     rates (print_service_entry);
//  4. under each, its destinations sorted as ipvs_cmp_dests sorts them.
//
// The layout follows ipvsadm 1.31's ipvsadm.c, numeric output (-n): the
// same widths, the same abbreviations of large numbers (print_largenum),
// IPv6 addresses in brackets, and the trailing blanks of its left-aligned
// last columns.

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/userproxy/userproxy/service"
)

// IPVSVersionLine is the first line of `ipvsadm -Ln`: the version and
// connection-table size the kernel reports (IP_VS_VERSION_CODE and
// ip_vs_conn_tab_size, read through IPVS_CMD_GET_INFO). Every kernel since
// 2.6.28 says 1.2.1, and 4096 is the table size of the default
// CONFIG_IP_VS_TAB_BITS=12; a kube-proxy node prints this line unless its
// kernel was built otherwise.
const IPVSVersionLine = "IP Virtual Server version 1.2.1 (size=4096)"

// VirtualService is one virtual service of the table WriteIPVS prints: a
// service port as kube-proxy's IPVS mode would program it. It mirrors
// proxy.VirtualService in plain values (this package does not import
// proxy).
type VirtualService struct {
	// Name is the service port's name. ipvsadm has no column for it; it is
	// not printed.
	Name service.PortName
	// Protocol is TCP, UDP or SCTP ("?" is printed for anything else).
	Protocol service.Protocol
	// Addr is the virtual address: ClusterIP and port.
	Addr netip.AddrPort
	// Scheduler is the scheduler's name: one of IPVS's (rr, wrr, lc, wlc,
	// sed, nq, sh, dh, mh), or "random", which is no IPVS scheduler but
	// kube-proxy's iptables lottery, printed in the scheduler column all
	// the same so that every service port is listed.
	Scheduler string
	// SchedFlags are the scheduler flags by the names ipvsadm prints them
	// (sh-fallback, sh-port, mh-fallback, mh-port, flag-1, flag-2, flag-3),
	// in bit order (balancer.SchedulerConfig.FlagNames).
	SchedFlags []string
	// Persistent is the persistence timeout ("persistent N", whole
	// seconds); 0 means not persistent.
	Persistent time.Duration
	// Affinity is the xt_recent affinity timeout under "random". IPVS has
	// no such thing and ipvsadm no column for it; it is not printed.
	Affinity time.Duration
	// Dests are the destinations, in any order: they are printed sorted.
	Dests []Destination
	// Stats are the virtual service's counters and rates.
	Stats IPVSStats
}

// Destination is one real server of a VirtualService.
type Destination struct {
	Addr netip.AddrPort
	// Weight, ActiveConn and InActConn are printed in their columns.
	Weight                int32
	ActiveConn, InActConn int32
	Stats                 IPVSStats
}

// IPVSStats are what --stats (the totals) and --rate (the estimator's
// per-second rates) print.
type IPVSStats struct {
	Conns, InPkts, OutPkts, InBytes, OutBytes uint64
	CPS, InPPS, OutPPS, InBPS, OutBPS         uint64
}

// IPVSOptions chooses the columns, as ipvsadm's options do. With neither
// set WriteIPVS prints -Ln: scheduler, flags, forwarding method, weights
// and connection counts.
type IPVSOptions struct {
	// Stats prints -Ln --stats: connections, packets and bytes.
	Stats bool
	// Rate prints -Ln --rate: the same per second. ipvsadm tests --stats
	// first, and so does WriteIPVS when both are set.
	Rate bool
}

// ipvsForward is the Forward column. kube-proxy's IPVS mode programs every
// destination for NAT (IP_VS_CONN_F_MASQ), which ipvsadm names "Masq".
const ipvsForward = "Masq"

// WriteIPVS writes vs as `ipvsadm -Ln` prints it (with --stats or --rate
// as opts says), byte for byte, trailing blanks included. vs is not
// modified. It returns the first error writing to w.
func WriteIPVS(w io.Writer, vs []VirtualService, opts IPVSOptions) error {
	bw := bufio.NewWriter(w)
	bw.WriteString(IPVSVersionLine + "\n")
	writeIPVSTitle(bw, opts)
	sorted := slices.Clone(vs)
	slices.SortStableFunc(sorted, compareVirtualServices)
	for i := range sorted {
		writeVirtualService(bw, &sorted[i], opts)
	}
	return bw.Flush()
}

// writeIPVSTitle prints print_title's two lines for the mode.
func writeIPVSTitle(w *bufio.Writer, opts IPVSOptions) {
	const prot = "Prot LocalAddress:Port"
	switch {
	case opts.Stats:
		fmt.Fprintf(w, "%-33s %8s %8s %8s %8s %8s\n  -> RemoteAddress:Port\n",
			prot, "Conns", "InPkts", "OutPkts", "InBytes", "OutBytes")
	case opts.Rate:
		fmt.Fprintf(w, "%-33s %8s %8s %8s %8s %8s\n  -> RemoteAddress:Port\n",
			prot, "CPS", "InPPS", "OutPPS", "InBPS", "OutBPS")
	default:
		w.WriteString(prot + " Scheduler Flags\n" +
			"  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n")
	}
}

// writeVirtualService prints one service line and its destinations
// (print_service_entry).
func writeVirtualService(w *bufio.Writer, v *VirtualService, opts IPVSOptions) {
	// "%-4s %s" of the protocol and the address; ipvsadm cuts an IPv4 one
	// at 33 characters, which no IPv4 address and port reaches.
	name := fmt.Sprintf("%-4s %s", ipvsProtocol(v.Protocol), ipvsAddr(v.Addr, 33))
	switch {
	case opts.Stats:
		fmt.Fprintf(w, "%-33s", name)
		writeLargeNums(w, v.Stats.Conns, v.Stats.InPkts, v.Stats.OutPkts, v.Stats.InBytes, v.Stats.OutBytes)
	case opts.Rate:
		fmt.Fprintf(w, "%-33s", name)
		writeLargeNums(w, v.Stats.CPS, v.Stats.InPPS, v.Stats.OutPPS, v.Stats.InBPS, v.Stats.OutBPS)
	default:
		w.WriteString(name + " " + v.Scheduler)
		if len(v.SchedFlags) > 0 {
			w.WriteString(" (" + strings.Join(v.SchedFlags, ",") + ")")
		}
		if v.Persistent > 0 {
			// The default netmask (255.255.255.255, /128) and no
			// persistence engine: neither "mask" nor "pe" follows.
			w.WriteString(" persistent " + strconv.FormatUint(uint64(v.Persistent/time.Second), 10))
		}
	}
	w.WriteByte('\n')

	dests := slices.Clone(v.Dests)
	slices.SortStableFunc(dests, func(a, b Destination) int { return compareAddrPorts(a.Addr, b.Addr) })
	for _, d := range dests {
		// ipvsadm cuts an IPv4 destination at 28 characters, again never
		// reached.
		dname := ipvsAddr(d.Addr, 28)
		switch {
		case opts.Stats:
			fmt.Fprintf(w, "  -> %-28s", dname)
			writeLargeNums(w, d.Stats.Conns, d.Stats.InPkts, d.Stats.OutPkts, d.Stats.InBytes, d.Stats.OutBytes)
		case opts.Rate:
			// The connection and packet rates of a destination are
			// printed in full ("%8llu"); only the byte rates shrink.
			fmt.Fprintf(w, "  -> %-28s %8d %8d %8d", dname, d.Stats.CPS, d.Stats.InPPS, d.Stats.OutPPS)
			writeLargeNums(w, d.Stats.InBPS, d.Stats.OutBPS)
		default:
			// "%-10u": the counts are unsigned to ipvsadm.
			fmt.Fprintf(w, "  -> %-28s %-7s %-6d %-10d %-10d", dname, ipvsForward, d.Weight,
				uint32(d.ActiveConn), uint32(d.InActConn))
		}
		w.WriteByte('\n')
	}
}

// writeLargeNums prints each number as print_largenum does without
// --exact: nine columns, and past 10^8 the number in thousands, millions,
// billions or trillions, truncated, with its K, M, G or T.
func writeLargeNums(w *bufio.Writer, nums ...uint64) {
	for _, n := range nums {
		switch {
		case n < 100_000_000:
			fmt.Fprintf(w, "%9d", n)
		case n < 1_000_000_000:
			fmt.Fprintf(w, "%8dK", n/1_000)
		case n < 100_000_000_000:
			fmt.Fprintf(w, "%8dM", n/1_000_000)
		case n < 100_000_000_000_000:
			fmt.Fprintf(w, "%8dG", n/1_000_000_000)
		default:
			fmt.Fprintf(w, "%8dT", n/1_000_000_000_000)
		}
	}
}

// ipvsProtocol is ipvsadm's protocol_name.
func ipvsProtocol(p service.Protocol) string {
	switch p {
	case service.TCP:
		return "TCP"
	case service.UDP:
		return "UDP"
	case 132: // IPPROTO_SCTP
		return "SCTP"
	}
	return "?"
}

// ipvsAddr is addrport_to_anyname with -n: "ip:port", "[ip]:port" for
// IPv6. An IPv4 one is cut at limit characters, as ipvsadm cuts it; an IPv6
// one never is.
func ipvsAddr(ap netip.AddrPort, limit int) string {
	a := ap.Addr().Unmap()
	if a.Is6() {
		return "[" + a.String() + "]:" + strconv.Itoa(int(ap.Port()))
	}
	s := a.String() + ":" + strconv.Itoa(int(ap.Port()))
	if len(s) > limit {
		s = s[:limit]
	}
	return s
}

// compareVirtualServices is ipvs_cmp_services (libipvs.c) for services
// without a firewall mark: IPv4 before IPv6, then by protocol number, then
// address, then port. ipvsadm's comparator subtracts the addresses as
// 32-bit words and so misorders two that differ by 2^31 or more (10.x
// after 192.168.x); this one compares them as numbers.
func compareVirtualServices(a, b VirtualService) int {
	if c := cmp.Compare(ipvsFamily(a.Addr), ipvsFamily(b.Addr)); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Protocol, b.Protocol); c != 0 {
		return c
	}
	return compareAddrPorts(a.Addr, b.Addr)
}

// compareAddrPorts is ipvs_cmp_dests: address, then port.
func compareAddrPorts(a, b netip.AddrPort) int {
	if c := a.Addr().Unmap().Compare(b.Addr().Unmap()); c != 0 {
		return c
	}
	return cmp.Compare(a.Port(), b.Port())
}

// ipvsFamily orders AF_INET (2) before AF_INET6 (10).
func ipvsFamily(ap netip.AddrPort) int {
	if ap.Addr().Unmap().Is4() {
		return 4
	}
	return 6
}

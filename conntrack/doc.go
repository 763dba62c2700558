// Package conntrack is an in-process connection tracking table with the
// Linux kernel's semantics: packet parsing, tuples, the TCP state machine with
// window tracking, UDP timeouts, INVALID classification, and a sharded,
// bounded table whose expiry is driven by an injected clock.
//
// Callers: the gate in netstack (every packet, both directions, concurrently),
// proxy (binding flows to endpoints, deleting entries on endpoint removal) and
// admin (listing).
//
// It also reassembles IP fragments (Reassembler), which the gate does before
// classifying, as the kernel's nf_defrag_ipv4 and nf_defrag_ipv6 do before
// conntrack.
//
// It is pure: bytes and tuples in, verdicts and entries out. It must import no
// other userproxy package and no third-party module; it never logs, starts no
// goroutine, opens no socket and reads time only through the Clock of its
// Config (Config.Clock, ReassemblyConfig.Clock).
//
// # Using it from the gate
//
//	res := table.Classify(pkt, conntrack.Original) // or Reply, for packets the stack writes
//	// or, for a packet whose checksums are not verified, from its headers alone:
//	res = table.ClassifyHead(pkt[:headers], len(pkt), conntrack.Reply)
//	switch res.Verdict {
//	case conntrack.Invalid:     // drop; counted in Stats().Invalid[res.Reason]
//	case conntrack.New:         // ask admission about res.Tuple; if accepted:
//		if err := table.Confirm(&res); err != nil { /* ErrTableFull: drop */ }
//		if res.Verdict == conntrack.Invalid { /* lost a race to a conflicting packet: drop */ }
//	case conntrack.Established, conntrack.Related: // deliver
//	}
//
// Classify never inserts. Only an Original-direction TCP SYN or UDP datagram
// without an entry is New; a rejected flow is simply never confirmed. Confirm
// inserts the entry, or joins the entry another goroutine confirmed first.
// Proxy then calls Bind with the endpoint it chose. The owner calls Sweep
// periodically (every second is plenty) to reclaim idle entries; lookups drop
// the expired entries they meet on their own. OnRemove reports every entry
// that leaves the table, outside the table's locks.
//
// The gate should give the table a CoarseClock that it ticks every few
// milliseconds: reading the system clock costs a third of a classification
// on a virtual machine, and conntrack needs no finer time than the kernel's
// jiffies.
//
// # Behaviour and sources
//
// TCP follows Linux net/netfilter/nf_conntrack_proto_tcp.c as of 6.1:
// tcp_error's checks (header length, checksum, tcp_valid_flags), the
// tcp_conntracks transition table, nf_conntrack_tcp_packet's special cases
// (reopening from TIME_WAIT/CLOSE, ignored segments and the SYN/ACK resync,
// simultaneous open, RFC 5961 challenge ACKs, RST sequence checks, killing an
// entry whose only reply is a RST), tcp_in_window with its four bounds, window
// scaling and SACK, nf_tcp_handle_invalid, and the timeout choice including
// the max-retransmit and unacknowledged caps. We behave as
// nf_conntrack_tcp_loose=0 (only a SYN starts a connection), with
// nf_conntrack_tcp_be_liberal as Config.Liberal. UDP follows
// nf_conntrack_proto_udp.c: the short timeout until a reply was seen and the
// flow is more than 2 s old, then the stream timeout and ASSURED. ICMP errors
// follow nf_conntrack_inet_error. The table's bound and early drop follow
// nf_conntrack_core.c; defaults follow kube-proxy (DESIGN.md section 3).
//
// # Deliberate differences from the kernel
//
//   - Direction comes from the caller, and only the Original direction creates
//     entries: a Reply-direction packet without an entry is INVALID
//     (no_entry_reply), where the kernel would track it as a new flow the
//     other way. A SYN in the Reply direction that would reopen a closed
//     connection therefore kills the entry and is INVALID.
//   - The Established verdict covers every accepted packet of a tracked flow,
//     including Original-direction packets before any reply, which the kernel
//     would still report as ctstate NEW: for the gate, admission happens once.
//   - Classify takes whole datagrams: fragments go through a Reassembler
//     first, which models net/ipv4/ip_fragment.c, net/ipv4/inet_fragment.c
//     and net/ipv6/netfilter/nf_conntrack_reasm.c (see defrag.go): the same
//     queue keys, byte bound and timeouts, overlap and duplicate rules.
//     Where it differs: the byte bound is hard (the kernel refuses only once
//     it is already exceeded, so it may overshoot by one fragment); there
//     are bounds on queues and on fragments per datagram, which the kernel
//     has not; an IPv4 datagram that cannot fit 65535 bytes is discarded at
//     the fragment that shows it rather than when complete; an IPv6 first
//     fragment without its upper-layer header, or a misaligned middle
//     fragment, is dropped where the kernel passes it on unreassembled (for
//     the IPv6 stack to drop); no ICMP time exceeded is sent for a timed out
//     queue (nor does the kernel's conntrack defrag for forwarded traffic);
//     ipfrag_max_dist is not modelled. A fragment that still reaches
//     Classify is INVALID (ip_fragment).
//   - IPv6 extension headers: Hop-by-Hop (first only), Destination Options and
//     Routing headers with no segments left are skipped, their options not
//     interpreted; anything else, including AH and ESP, is INVALID
//     (ipv6_extension_header). IPv4 options are skipped by IHL, also not
//     interpreted.
//   - No ICMP flow is tracked, and no protocol but TCP and UDP. The packets
//     the kernel would track (ICMP echo, timestamp, information and address
//     mask requests, ICMPv6 echo and node information queries, any other
//     protocol through the generic tracker) or leave untracked (ICMPv6
//     neighbour discovery and multicast listener messages) are dropped with
//     an Unsupported reason: no service IP answers pings, with kube-proxy
//     either. They are not INVALID: Stats counts them in Unsupported by
//     protocol, outside InvalidTotal, which keeps the meaning of kube-proxy's
//     kubeproxy_iptables_ct_state_invalid_dropped_packets_total. Messages the kernel finds
//     INVALID without an ICMP flow (replies, unknown types) are INVALID here
//     (icmp_no_flow). ICMP errors must quote a packet of a tracked flow
//     travelling the other way; the kernel matches either direction.
//   - A zero UDP checksum over IPv6 is INVALID (RFC 8200 section 8.1), and the
//     UDP checksum covers the UDP length rather than the whole IP payload.
//   - Early drop takes the oldest non-ASSURED entry of the new flow's shard,
//     else of the first other shard that has one, after purging expired
//     entries; the kernel looks only at a few hash buckets near the new flow,
//     so it can refuse while non-ASSURED entries exist elsewhere. There is no
//     equivalent of the kernel's background early drop at 95% fill.
//   - No NAT sequence adjustment (we do no NAT), and no
//     nf_conntrack_tcp_no_window_check or tcp_ignore_invalid_rst.
//   - Listing prints "mark=0 use=1" as constants, and EntryInfo carries ages
//     and time left rather than wall-clock stamps.
package conntrack

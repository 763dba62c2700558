package conntrack

import "strconv"

// Protocol is an IP protocol number. Only TCP and UDP flows are tracked;
// ICMP and ICMPv6 appear only as errors RELATED to a tracked flow.
type Protocol uint8

// Tracked protocols.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

// Protocols seen but not tracked: their messages that are not errors (echo,
// neighbour discovery, ...) are counted in Stats.Unsupported.
const (
	ICMP   Protocol = 1
	ICMPv6 Protocol = 58
)

// String returns "tcp", "udp", "icmp", "icmpv6" or the decimal protocol
// number.
func (p Protocol) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMP:
		return "icmp"
	case ICMPv6:
		return "icmpv6"
	}
	return strconv.Itoa(int(p))
}

// Direction says which way a packet travels relative to the flow. The values
// match the kernel's IP_CT_DIR_ORIGINAL and IP_CT_DIR_REPLY and index the
// per-direction arrays of EntryInfo.
type Direction uint8

const (
	// Original is the direction of the packet that created the flow: packets
	// read from the TUN device, client -> service IP.
	Original Direction = 0
	// Reply is the other direction: packets the local stack writes back to
	// the client (service IP -> client).
	Reply Direction = 1
)

// String returns "original" or "reply".
func (d Direction) String() string {
	if d == Original {
		return "original"
	}
	return "reply"
}

// Verdict is the outcome of classifying one packet.
//
// The zero value is Invalid, so a forgotten Result is never mistaken for an
// acceptable packet.
type Verdict uint8

const (
	// Invalid: drop the packet; Result.Reason says why. Nothing was changed
	// in the table, except that expired or killed entries may have been
	// removed. Every reason but the two Unsupported ones is the kernel's
	// ctstate INVALID, counted in Stats.Invalid; a packet of a protocol or
	// ICMP message that no flow is tracked for (Reason.Unsupported) is
	// dropped too but counted in Stats.Unsupported instead.
	Invalid Verdict = iota
	// New: the first packet of an acceptable flow (an Original-direction TCP
	// SYN, or an Original-direction UDP datagram) for which no entry exists.
	// Nothing was inserted: ask the admission function, then call Confirm to
	// insert the entry, or simply drop the packet to reject the flow.
	New
	// Established: the packet belongs to a tracked flow and was accounted to
	// it. Unlike the kernel's ctstate, this includes Original-direction
	// packets sent before any reply (such as a retransmitted SYN), which the
	// kernel would still call NEW: what matters to the gate is that the flow
	// was already admitted.
	Established
	// Related: an ICMP or ICMPv6 error that quotes a packet of a tracked flow.
	// The entry is not changed.
	Related
)

// String returns "new", "established", "related" or "invalid".
func (v Verdict) String() string {
	switch v {
	case New:
		return "new"
	case Established:
		return "established"
	case Related:
		return "related"
	case Invalid:
		return "invalid"
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Reason says why a packet was classified Invalid. Every reason is counted
// separately in Stats.Invalid, except the Unsupported ones, which Stats
// counts by protocol in Unsupported. The String form is meant for a
// Prometheus label.
type Reason uint8

// Invalid reasons. Keep reasonNames in step.
const (
	// ReasonNone: the packet was not invalid.
	ReasonNone Reason = iota
	// ReasonTruncated: the buffer ends before a header it announces (IP
	// header, IPv6 extension header, TCP, UDP or ICMP header).
	ReasonTruncated
	// ReasonBadIPHeader: IP version other than 4 or 6, IPv4 IHL below 5, or
	// IPv4 total length shorter than its own header.
	ReasonBadIPHeader
	// ReasonBadLength: IPv4 total length or IPv6 payload length larger than
	// the buffer, or a UDP length outside [8, IP payload length].
	ReasonBadLength
	// ReasonBadChecksum: IPv4 header, TCP, UDP, ICMP or ICMPv6 checksum wrong
	// (Original direction only), or a zero UDP checksum over IPv6.
	ReasonBadChecksum
	// ReasonBadDataOffset: TCP data offset below 5 words or beyond the segment.
	ReasonBadDataOffset
	// ReasonBadTCPFlags: a TCP flag combination outside the kernel's
	// tcp_valid_flags (PSH, ECE and CWR ignored).
	ReasonBadTCPFlags
	// ReasonIPFragment: an IPv4 fragment (MF set or non-zero offset) or any
	// IPv6 packet with a Fragment header. Classify does not reassemble: the
	// gate hands fragments to a Reassembler first and classifies the
	// datagram, so this counts the fragments that reach Classify anyway (a
	// Reassembler declines those whose headers it finds malformed, and a
	// datagram reassembled from IPv6 fragments may hold another Fragment
	// header).
	ReasonIPFragment
	// ReasonIPv6ExtensionHeader: an IPv6 extension header that is not
	// skipped (AH, ESP, Mobility, HIP, Shim6, experimental), a Hop-by-Hop
	// header that is not first, a Routing header with segments left, or a
	// chain longer than maxExtHeaders.
	ReasonIPv6ExtensionHeader
	// ReasonUnsupportedProtocol: a transport protocol other than TCP, UDP,
	// ICMP and ICMPv6 (including IPv6 No Next Header). Not INVALID: counted
	// in Stats.Unsupported under the protocol number.
	ReasonUnsupportedProtocol
	// ReasonUnsupportedICMP: an ICMP or ICMPv6 message that is not an error
	// and that the kernel would track or leave untracked rather than call
	// INVALID: a request that starts an ICMP flow (echo, timestamp,
	// information and address mask requests; ICMPv6 echo and node
	// information queries: valid_new in nf_conntrack_proto_icmp.c and
	// nf_conntrack_proto_icmpv6.c), or ICMPv6 neighbour discovery and
	// multicast listener messages (noct_valid_new). We track no ICMP flow;
	// see the package documentation. Not INVALID: counted in
	// Stats.Unsupported under ICMP or ICMPv6.
	ReasonUnsupportedICMP
	// ReasonICMPNoFlow: an ICMP or ICMPv6 message that is not an error and
	// that the kernel's conntrack finds INVALID too: an ICMP type above 18
	// (icmp_error), or one that cannot start a flow (a reply, or a type
	// outside valid_new) when no flow of its own exists, which here is
	// always.
	ReasonICMPNoFlow
	// ReasonICMPBadInner: an ICMP error whose quoted packet cannot be parsed
	// into a TCP or UDP tuple.
	ReasonICMPBadInner
	// ReasonICMPUnrelated: an ICMP error quoting a packet of no tracked flow,
	// or whose outer destination is not the quoted packet's source.
	ReasonICMPUnrelated
	// ReasonNoEntryNotSYN: an Original-direction TCP packet without an entry
	// that is not a plain SYN (we behave as nf_conntrack_tcp_loose=0).
	ReasonNoEntryNotSYN
	// ReasonNoEntryReply: a Reply-direction packet without an entry. Only
	// Original-direction packets create flows.
	ReasonNoEntryReply
	// ReasonStateMachine: the TCP state table marks the packet invalid in the
	// entry's state (for example a SYN/ACK from the client).
	ReasonStateMachine
	// ReasonOutOfWindow: the segment failed tcp_in_window (sequence above
	// the receiver's window, or an ACK for data never sent), or is a RST
	// whose sequence number is before what the peer already acknowledged.
	ReasonOutOfWindow

	// NumReasons is the number of Reason values, ReasonNone included; it
	// sizes Stats.Invalid.
	NumReasons
)

var reasonNames = [NumReasons]string{
	ReasonNone:                "none",
	ReasonTruncated:           "truncated",
	ReasonBadIPHeader:         "bad_ip_header",
	ReasonBadLength:           "bad_length",
	ReasonBadChecksum:         "bad_checksum",
	ReasonBadDataOffset:       "bad_data_offset",
	ReasonBadTCPFlags:         "bad_tcp_flags",
	ReasonIPFragment:          "ip_fragment",
	ReasonIPv6ExtensionHeader: "ipv6_extension_header",
	ReasonUnsupportedProtocol: "unsupported_protocol",
	ReasonUnsupportedICMP:     "unsupported_icmp",
	ReasonICMPNoFlow:          "icmp_no_flow",
	ReasonICMPBadInner:        "icmp_bad_inner",
	ReasonICMPUnrelated:       "icmp_unrelated",
	ReasonNoEntryNotSYN:       "no_entry_not_syn",
	ReasonNoEntryReply:        "no_entry_reply",
	ReasonStateMachine:        "state_machine",
	ReasonOutOfWindow:         "out_of_window",
}

// Unsupported reports whether r is one of the reasons that are not the
// kernel's INVALID state: the packet belongs to a protocol, or is an ICMP
// message, that conntrack tracks no flow for. In the kernel such packets get
// a generic or ICMP entry and pass conntrack; kube-proxy's INVALID drop rule
// and its counter never see them. They are dropped all the same (no service
// answers them), but counted apart, so that InvalidTotal keeps kube-proxy's
// meaning.
func (r Reason) Unsupported() bool {
	return r == ReasonUnsupportedProtocol || r == ReasonUnsupportedICMP
}

// String returns the reason's snake_case label.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "reason_" + strconv.Itoa(int(r))
}

// RemoveReason says why an entry left the table; OnRemove receives it.
type RemoveReason uint8

const (
	// RemoveExpired: the entry's timeout passed (found by Sweep, by a lookup,
	// or while making room).
	RemoveExpired RemoveReason = iota
	// RemoveEvicted: early drop of a non-ASSURED entry to make room for a new
	// flow when the table was full.
	RemoveEvicted
	// RemoveDeleted: removed by Delete.
	RemoveDeleted
	// RemoveKilled: removed by the TCP state machine: a RST before any reply
	// was seen, or a SYN reopening a connection a RST closed (CLOSE).
	RemoveKilled
	// RemoveReopened: a SYN found the entry in TIME_WAIT, both sides having
	// closed in order, and it was removed so that the SYN starts over (the
	// kernel's nf_ct_kill before NF_REPEAT in nf_conntrack_proto_tcp.c); or
	// Reopen replaced the entry of a tracked flow whose host socket the
	// kernel had let go. The SYN may then start a new flow, or not, if it is
	// not admitted.
	RemoveReopened
)

// String returns "expired", "evicted", "deleted", "killed" or "reopened".
func (r RemoveReason) String() string {
	switch r {
	case RemoveExpired:
		return "expired"
	case RemoveEvicted:
		return "evicted"
	case RemoveDeleted:
		return "deleted"
	case RemoveKilled:
		return "killed"
	case RemoveReopened:
		return "reopened"
	}
	return "remove(" + strconv.Itoa(int(r)) + ")"
}

// Status holds an entry's status bits, a subset of the kernel's IPS_* bits.
type Status uint8

const (
	// StatusSeenReply (IPS_SEEN_REPLY): a Reply-direction packet was accepted.
	StatusSeenReply Status = 1 << iota
	// StatusAssured (IPS_ASSURED): the flow proved itself (TCP: the handshake
	// completed; UDP: replied and older than 2 s). ASSURED entries are never
	// early-dropped.
	StatusAssured
)

// String lists the set bits, such as "SEEN_REPLY|ASSURED", or "0".
func (s Status) String() string {
	switch s {
	case 0:
		return "0"
	case StatusSeenReply:
		return "SEEN_REPLY"
	case StatusAssured:
		return "ASSURED"
	case StatusSeenReply | StatusAssured:
		return "SEEN_REPLY|ASSURED"
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// TCPState is a TCP conntrack state, with the kernel's numbering and names
// (tcp_conntrack_names in nf_conntrack_proto_tcp.c).
type TCPState uint8

// TCP states.
const (
	TCPNone TCPState = iota
	TCPSynSent
	TCPSynRecv
	TCPEstablished
	TCPFinWait
	TCPCloseWait
	TCPLastAck
	TCPTimeWait
	TCPClose
	TCPSynSent2

	numTCPStates
)

var tcpStateNames = [numTCPStates]string{
	"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT",
	"CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2",
}

// String returns the kernel's name for the state, such as "ESTABLISHED".
func (s TCPState) String() string {
	if s < numTCPStates {
		return tcpStateNames[s]
	}
	return "STATE_" + strconv.Itoa(int(s))
}

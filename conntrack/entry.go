package conntrack

import (
	"net/netip"
	"strconv"
	"time"
)

// entry is one tracked flow. It is reachable only through its shard and is
// read and written only under the shard's lock. Keep it under 256 bytes
// (DESIGN.md section 7); TestEntrySize holds the line.
type entry struct {
	key      Tuple     // original-direction tuple, the index key
	id       uint64    // unique per table, for OnRemove consumers
	bind     *Binding  // set by Bind; nil before
	created  int64     // Clock readings, nanoseconds
	lastSeen int64     // last packet that refreshed the entry
	expires  int64     // the entry is dead once the clock reaches it
	packets  [2]uint64 // per Direction
	bytes    [2]uint64 // per Direction, IP datagram lengths
	prev     *entry    // the shard's list of non-ASSURED entries
	next     *entry
	heapIdx  int32 // position in the shard's heap, -1 when not in it
	status   Status
	tcp      tcpConn // TCP only
}

// EntryInfo is a snapshot of an entry, taken under its shard's lock. It
// shares nothing with the table.
type EntryInfo struct {
	// ID is unique among the entries a Table ever held.
	ID uint64
	// Original is the tuple of the Original direction (client -> service).
	Original Tuple
	// State is the TCP state; TCPNone for UDP.
	State TCPState
	// Status holds SEEN_REPLY and ASSURED.
	Status Status
	// Endpoint and ServicePort were recorded by Bind; Endpoint is the zero
	// AddrPort before that.
	Endpoint    netip.AddrPort
	ServicePort string
	// Owner is Binding.Owner: whatever the flow's owner recorded with Bind
	// (nil before Bind). The table never looks at it.
	Owner any
	// Packets and Bytes are counted per Direction; bytes are whole IP
	// datagrams, as the kernel's nf_conntrack_acct counts them. Packets the
	// state machine ignores or finds invalid are not counted.
	Packets [2]uint64
	Bytes   [2]uint64
	// Age is the time since the entry was created and Idle the time since
	// the last accounted packet, both at the moment of the snapshot.
	Age  time.Duration
	Idle time.Duration
	// Timeout is the time left before the entry expires.
	Timeout time.Duration
}

// snapshot copies e as seen at now.
func snapshot(e *entry, now int64) EntryInfo {
	i := EntryInfo{
		ID:       e.id,
		Original: e.key,
		Status:   e.status,
		Packets:  e.packets,
		Bytes:    e.bytes,
		Age:      time.Duration(now - e.created),
		Idle:     time.Duration(now - e.lastSeen),
		Timeout:  max(time.Duration(e.expires-now), 0),
	}
	if b := e.bind; b != nil {
		i.Endpoint, i.ServicePort, i.Owner = b.Endpoint, b.ServicePort, b.Owner
	}
	if e.key.proto == TCP {
		i.State = e.tcp.state
	}
	return i
}

// Reply returns the tuple of the Reply direction as the kernel would list it
// after DNAT: from the bound endpoint to the client. Before Bind, or when the
// endpoint's family differs from the flow's, it is the reverse of Original.
func (i EntryInfo) Reply() Tuple {
	if i.Endpoint.IsValid() {
		if t := MakeTuple(i.Original.proto, i.Endpoint, i.Original.Src()); t.IsValid() {
			return t
		}
	}
	return i.Original.Reverse()
}

// String formats the entry as one line of `conntrack -L`; see AppendText.
func (i EntryInfo) String() string {
	b, _ := i.AppendText(make([]byte, 0, 256))
	return string(b)
}

// AppendText appends the entry as one line of `conntrack -L` output, without
// a newline, in the layout of libnetfilter_conntrack's
// __snprintf_conntrack_default:
//
//	tcp      6 86397 ESTABLISHED src=10.0.0.1 dst=10.96.0.10 sport=5555 dport=80 packets=3 bytes=180 src=10.244.0.5 dst=10.0.0.1 sport=8080 dport=5555 packets=2 bytes=120 [ASSURED] mark=0 use=1
//	udp      17 27 src=10.0.0.1 dst=10.96.0.10 sport=5353 dport=53 packets=1 bytes=60 [UNREPLIED] src=10.96.0.10 dst=10.0.0.1 sport=53 dport=5353 packets=0 bytes=0 mark=0 use=1
//
// The timeout is whole seconds left, rounded down. UDP lines have no state.
// [UNREPLIED] follows the original counters when no reply was seen;
// [ASSURED] follows the reply counters. The error is always nil; the
// signature is encoding.TextAppender's.
func (i EntryInfo) AppendText(b []byte) ([]byte, error) {
	name := i.Original.proto.String()
	b = append(b, name...)
	for n := len(name); n < 8; n++ {
		b = append(b, ' ')
	}
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(i.Original.proto), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(i.Timeout/time.Second), 10)
	b = append(b, ' ')
	if i.Original.proto == TCP {
		b = append(b, i.State.String()...)
		b = append(b, ' ')
	}
	b = i.Original.appendConntrack(b)
	b = appendCounters(b, i.Packets[Original], i.Bytes[Original])
	if i.Status&StatusSeenReply == 0 {
		b = append(b, "[UNREPLIED] "...)
	}
	reply := i.Reply()
	b = reply.appendConntrack(b)
	b = appendCounters(b, i.Packets[Reply], i.Bytes[Reply])
	if i.Status&StatusAssured != 0 {
		b = append(b, "[ASSURED] "...)
	}
	b = append(b, "mark=0 use=1"...)
	return b, nil
}

func appendCounters(b []byte, packets, bytes uint64) []byte {
	b = append(b, "packets="...)
	b = strconv.AppendUint(b, packets, 10)
	b = append(b, " bytes="...)
	b = strconv.AppendUint(b, bytes, 10)
	return append(b, ' ')
}

// Filter selects entries for List and Delete. Every set field must match; the
// zero Filter matches every entry. Addresses match exactly: an IPv4 address
// matches only IPv4 flows.
type Filter struct {
	// Protocol, when non-zero.
	Protocol Protocol
	// Src and Dst match the Original tuple's addresses (conntrack's
	// --orig-src and --orig-dst), when valid.
	Src, Dst netip.Addr
	// SrcPort and DstPort match the Original tuple's ports, when non-zero.
	SrcPort, DstPort uint16
	// Endpoint matches the address recorded by Bind (after DNAT the
	// kernel's --reply-src), when valid; EndpointPort its port, when
	// non-zero. Unbound entries match neither.
	Endpoint     netip.Addr
	EndpointPort uint16
	// ServicePort matches the name recorded by Bind, when non-empty.
	ServicePort string
}

// match reports whether e passes f.
func (f *Filter) match(e *entry) bool {
	k := &e.key
	switch {
	case f.Protocol != 0 && k.proto != f.Protocol,
		f.SrcPort != 0 && k.srcPort != f.SrcPort,
		f.DstPort != 0 && k.dstPort != f.DstPort,
		f.Src.IsValid() && k.SrcAddr() != f.Src,
		f.Dst.IsValid() && k.DstAddr() != f.Dst,
		(f.Endpoint.IsValid() || f.EndpointPort != 0 || f.ServicePort != "") && e.bind == nil:
		return false
	}
	if b := e.bind; b != nil {
		switch {
		case f.Endpoint.IsValid() && b.Endpoint.Addr() != f.Endpoint,
			f.EndpointPort != 0 && (!b.Endpoint.IsValid() || b.Endpoint.Port() != f.EndpointPort),
			f.ServicePort != "" && b.ServicePort != f.ServicePort:
			return false
		}
	}
	return true
}

// Binding is what a flow's owner records on its entry with Bind: where the
// flow was sent and who owns it. The table keeps the pointer, so the owner
// allocates it once per flow (typically inside its own flow record) and must
// not change it after Bind.
type Binding struct {
	// Endpoint is the address the flow was sent to; an IPv4-mapped IPv6
	// address of an IPv4 flow is normalized to IPv4 by Bind.
	Endpoint netip.AddrPort
	// ServicePort names the service port, for listing and filtering.
	ServicePort string
	// Owner is the owner's handle for the flow, handed back in the
	// EntryInfo of OnRemove when the entry leaves the table, so that the
	// owner finds the flow without looking it up by tuple (its tuple may
	// already belong to a newer flow).
	Owner any
	// Counter, when set, is told when the flow's TCP state enters or
	// leaves ESTABLISHED and when its entry leaves the table, so that the
	// owner can keep IPVS's per-endpoint connection counts without ever
	// scanning the table (see Counter).
	Counter Counter
}

// Counter follows one bound flow for its owner, the way IPVS moves a
// connection between its destination's activeconns and inactconns
// (ip_vs_proto_tcp.c, set_tcp_state; ip_vs_conn.c, ip_vs_unbind_dest). Its
// methods run under the entry's shard lock, on the goroutine of the packet
// or the removal: they must be O(1), must not block and must not call the
// Table.
//
// The owner counts the flow (as inactive) before Bind. From a successful
// Bind on, the table makes the calls: Established(true) at Bind when the
// entry is ESTABLISHED already, then Established(true/false) on every move
// into or out of ESTABLISHED, then exactly one Removed with whether the
// entry was ESTABLISHED, when the entry leaves the table (or when a later
// Bind replaces this one). UDP flows are never established.
type Counter interface {
	Established(bool)
	Removed(established bool)
}

// established reports whether e counts as an active connection.
func (e *entry) established() bool {
	return e.key.proto == TCP && e.tcp.state == TCPEstablished
}

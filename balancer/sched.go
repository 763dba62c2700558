package balancer

import (
	"net/netip"
	"sync/atomic"
)

// IPVS's schedulers, the way the kernel runs them (linux
// net/netfilter/ipvs/ip_vs_core.c, ip_vs_schedule; ip_vs_ctl.c; ip_vs_conn.c):
//
//  1. A virtual service holds a list of destinations (svc->destinations),
//     each with a weight and its connection counters. Here that list is the
//     []Endpoint of one service port, in the order given (kube-proxy order:
//     sorted by "ip:port").
//  2. When the list or a weight changes, the kernel calls the scheduler's
//     add_dest/del_dest/upd_dest hooks, which rebuild its state (the sh, dh
//     and mh tables; rr's and wrr's cursors). Here Update does that, once for
//     the whole change; Pick does it itself when handed a list it has not
//     seen.
//  3. For the first packet of a new connection the kernel calls the
//     scheduler's schedule hook, which returns a destination or NULL ("no
//     destination available"). Here Pick returns an index into the list, or
//     -1.
//  4. The connection is bound to the destination, which counts it: every
//     destination's conn_flags carry IP_VS_CONN_F_INACTIVE (ip_vs_ctl.c,
//     __ip_vs_update_dest), so ip_vs_bind_dest (ip_vs_conn.c) counts a new
//     connection as inactive; the TCP state machine moves it to active on
//     ESTABLISHED and back when it leaves ESTABLISHED (ip_vs_proto_tcp.c,
//     set_tcp_state); a UDP connection stays inactive. Conns holds those two
//     counts; the proxy moves them at O(1) per flow event, and the
//     least-connection schedulers read them through the Endpoint.
//
// What the kernel has and userproxy does not: upper and lower connection
// thresholds (IP_VS_DEST_F_OVERLOAD) and destinations that are unavailable
// for lack of a route (IP_VS_DEST_F_AVAILABLE). Every endpoint here is
// available and never overloaded, so the kernel's checks of those flags are
// always false and are left out.

// Endpoint is one destination of a service port as the schedulers see it:
// the part of the kernel's struct ip_vs_dest that scheduling reads.
//
// A list of Endpoints passed to Pick or Update must not be modified after it
// is passed: schedulers remember the list they built their state for by its
// backing array (as the service table's slices are immutable, that is free).
type Endpoint struct {
	// Addr is the endpoint's address and port (dest->addr, dest->port).
	Addr netip.AddrPort
	// Weight is dest->weight. kube-proxy gives every endpoint weight 1
	// (EndpointSlices carry none); 0 quiesces the endpoint: it keeps its
	// connections but gets no new ones. Negative weights, which the kernel
	// refuses, count as 0. Set it: the zero value is a quiesced endpoint.
	Weight int32
	// Conns are the endpoint's connection counters; nil counts as none.
	// They belong to the endpoint, not to one list: when the service
	// table is rebuilt, the new list's Endpoint must point at the same
	// Conns for as long as the endpoint has flows.
	Conns *Conns
}

// Flow is what the schedulers read from the first packet of a new
// connection.
type Flow struct {
	// Client is the packet's source address and port (saddr, sport): sh and
	// mh hash it.
	Client netip.AddrPort
	// Service is the packet's destination address and port as the client
	// sent it (daddr, dport: the ClusterIP, external IP or node address):
	// dh hashes its address.
	Service netip.AddrPort
}

// Scheduler chooses the endpoint of one service port for a new connection,
// with the semantics of one of the kernel's ip_vs_<name>.c schedulers.
//
// A Scheduler keeps state across picks (rr's cursor, the hash tables), so
// each service port has its own. It is safe for concurrent use.
type Scheduler interface {
	// Name is the scheduler's name as ipvsadm prints it: "rr", "mh", ...
	Name() string
	// Update tells the scheduler that eps is now the service port's
	// endpoint list, as the kernel's add_dest/del_dest/upd_dest hooks do
	// (once for the whole change). Calling it when the service table is
	// swapped keeps the table building off the connection path; Pick calls
	// it itself for a list it has not seen. It returns the kernel's
	// refusals (mh: more endpoints than table slots); the list is then
	// left with no usable table and Pick returns -1.
	Update(eps []Endpoint) error
	// Pick returns the index in eps of the endpoint for the new connection
	// f, or -1 where the kernel's scheduler returns NULL (no endpoints, or
	// none with a weight above zero, or a hash that lands on an unusable
	// one). It reads the endpoints' Conns but does not count the
	// connection: the caller does, once the connection is bound.
	Pick(eps []Endpoint, f Flow) int
}

// sameList reports whether a and b are the same list: same backing array,
// same length. Lists are immutable, so that is cheap and sufficient.
func sameList(a, b []Endpoint) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}

// weightOf returns e's weight, negative weights counting as zero.
func weightOf(e *Endpoint) int64 {
	if e.Weight < 0 {
		return 0
	}
	return int64(e.Weight)
}

// Conns counts one endpoint's connections the way IPVS counts them on
// struct ip_vs_dest: activeconns and inactconns. Both counts live in one
// 64-bit word (active in the high half, inactive in the low half), so every
// transition is a single atomic add and a reader never sees a connection
// counted twice or not at all. The zero value counts nothing. It is safe
// for concurrent use.
//
// Which flows are active is the caller's business; userproxy's rule is
// IPVS's: an ESTABLISHED TCP flow is active, every other tracked flow
// (handshakes, closing TCP states, every UDP flow) is inactive. A flow that
// is Opened must be Closed exactly once, with the state it was counted in.
type Conns struct {
	v atomic.Uint64
}

// One flow in each half of Conns.v, and the two's-complement negations
// that take one away.
const (
	activeOne   uint64 = 1 << 32
	inactiveOne uint64 = 1
	minusActive        = ^activeOne + 1
	minusInact         = ^inactiveOne + 1
)

// Open counts a new flow bound to the endpoint, as inactive (ip_vs_bind_dest
// with IP_VS_CONN_F_INACTIVE set).
func (c *Conns) Open() { c.v.Add(inactiveOne) }

// Activate moves a flow from inactive to active: a TCP flow entered
// ESTABLISHED.
func (c *Conns) Activate() { c.v.Add(activeOne - inactiveOne) }

// Deactivate moves a flow from active to inactive: a TCP flow left
// ESTABLISHED (FIN, RST).
func (c *Conns) Deactivate() { c.v.Add(inactiveOne + minusActive) }

// Close uncounts a flow that ends; active tells which count it was in
// (ip_vs_unbind_dest).
func (c *Conns) Close(active bool) {
	if active {
		c.v.Add(minusActive)
	} else {
		c.v.Add(minusInact)
	}
}

// Load returns the active and inactive counts, read together.
func (c *Conns) Load() (active, inactive int32) {
	if c == nil {
		return 0, 0
	}
	v := c.v.Load()
	return int32(v >> 32), int32(uint32(v))
}

// Overhead returns IPVS's load estimate of the endpoint, activeconns*256 +
// inactconns (include/net/ip_vs.h, ip_vs_dest_conn_overhead: "the overhead
// of processing active connections is 256 times higher than that of
// inactive connections"). It is computed in 64 bits; the kernel's int
// would overflow past 2^23 active connections.
func (c *Conns) Overhead() int64 {
	a, i := c.Load()
	return int64(a)<<8 + int64(i)
}

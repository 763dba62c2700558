package main

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"sync"

	"go.uber.org/zap"
)

// External addresses (externalIPs and LoadBalancer ingress IPs) are routed
// into the TUN one by one, as /32 and /128, while a Service has them:
//
//  1. After each table, Sync gets every external address of the table.
//  2. Addresses inside a --service-cidr are routed already; the others get
//     a host route into the TUN, unless one exists (someone else's: it is
//     left alone, now and on exit).
//  3. Routes run added for addresses no Service has any more are removed;
//     on exit, Close removes all that run added.
//  4. An address that cannot be routed (no privilege: a device made by
//     `userproxy setup`, run unprivileged) is logged once and listed by
//     Unrouted, for /healthz's detail; it is retried on the next Sync.
//  5. The cluster's service CIDRs (its ServiceCIDR objects, given to
//     SetServiceCIDRs) are routed the same way, as prefixes, while the
//     cluster has them: those inside a --service-cidr need nothing, the
//     others get a route into the TUN unless one exists. Addresses inside
//     them need no host route. The API server validates no size: a CIDR
//     wider than the allocator's own IPv6 floor, /64, or than an IPv4 /8
//     would take the host's other traffic (a /0 its API server's too), so
//     it is not routed, but logged and noted as the refused ones are.

// routeOps adds and removes one host route into the TUN device. add
// reports errRouteExists for a route that is there already.
type routeOps interface {
	add(dst netip.Prefix) error
	del(dst netip.Prefix) error
}

var errRouteExists = errors.New("route exists")

type extRoutes struct {
	ops    routeOps
	dev    string
	cidrs  []netip.Prefix // routed already (--service-cidr)
	logger *zap.Logger

	mu       sync.Mutex
	want     []netip.Addr           // the last Sync's
	cluster  []netip.Prefix         // the cluster's service CIDRs routed (step 5)
	mineCIDR map[netip.Prefix]bool  // of those, routes run added
	cidrErr  map[netip.Prefix]error // cluster CIDRs that could not be routed
	closed   bool                   // Close ran: Sync does nothing
	mine     map[netip.Addr]bool    // routes run added
	foreign  map[netip.Addr]bool    // routes that existed: never removed
	unrouted map[netip.Addr]error   // could not be routed, with why
}

func newExtRoutes(ops routeOps, dev string, serviceCIDRs []netip.Prefix, logger *zap.Logger) *extRoutes {
	return &extRoutes{ops: ops, dev: dev, cidrs: serviceCIDRs, logger: logger,
		mine: map[netip.Addr]bool{}, foreign: map[netip.Addr]bool{}, unrouted: map[netip.Addr]error{},
		mineCIDR: map[netip.Prefix]bool{}, cidrErr: map[netip.Prefix]error{}}
}

// hostPrefix returns the /32 or /128 of a.
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Sync makes the routes match want (steps 2 and 3).
func (r *extRoutes) Sync(want []netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.want = slices.Clone(want)
	r.sync()
}

// sync is Sync for the last addresses wanted, r.mu held.
func (r *extRoutes) sync() {
	want := r.want
	wanted := make(map[netip.Addr]bool, len(want))
	for _, a := range want {
		a = a.Unmap()
		if r.routed(a) {
			continue
		}
		wanted[a] = true
		if r.mine[a] || r.foreign[a] {
			continue
		}
		switch err := r.ops.add(hostPrefix(a)); {
		case err == nil:
			r.mine[a] = true
			delete(r.unrouted, a)
			r.logger.Info("route added for an external address", zap.Stringer("address", a))
		case errors.Is(err, errRouteExists):
			r.foreign[a] = true
			delete(r.unrouted, a)
		default:
			if _, known := r.unrouted[a]; !known {
				r.logger.Warn("cannot route an external address into the TUN; traffic to it does not reach the proxy",
					zap.Stringer("address", a), zap.Error(err))
			}
			r.unrouted[a] = err
		}
	}
	for a := range r.mine {
		if !wanted[a] {
			r.remove(a)
		}
	}
	for a := range r.foreign {
		if !wanted[a] {
			delete(r.foreign, a)
		}
	}
	for a := range r.unrouted {
		if !wanted[a] {
			delete(r.unrouted, a)
		}
	}
}

// routed reports whether a --service-cidr or a cluster CIDR covers a.
func (r *extRoutes) routed(a netip.Addr) bool {
	in := func(p netip.Prefix) bool { return p.Contains(a) }
	return slices.ContainsFunc(r.cidrs, in) || slices.ContainsFunc(r.cluster, in)
}

// SetServiceCIDRs routes the cluster's service CIDRs (step 5) and returns
// every CIDR now routed into the TUN: the --service-cidr ones, then the
// cluster's. The last Sync's external addresses are synced again against
// them.
func (r *extRoutes) SetServiceCIDRs(cluster []netip.Prefix) []netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return r.cidrs
	}
	r.cluster = r.cluster[:0]
	wanted := map[netip.Prefix]bool{}
	for _, p := range cluster {
		if slices.ContainsFunc(r.cidrs, func(q netip.Prefix) bool { return q.Bits() <= p.Bits() && q.Contains(p.Addr()) }) {
			continue // inside a --service-cidr: routed already
		}
		wanted[p] = true
		if tooWide(p) {
			if _, known := r.cidrErr[p]; !known {
				r.logger.Warn("not routing a service CIDR of the cluster: it would take the host's other traffic; give a narrower one to --service-cidr if it is meant",
					zap.Stringer("cidr", p))
			}
			r.cidrErr[p] = errTooWide
			continue
		}
		r.cluster = append(r.cluster, p)
		if r.mineCIDR[p] {
			continue
		}
		switch err := r.ops.add(p); {
		case err == nil:
			r.mineCIDR[p] = true
			delete(r.cidrErr, p)
			r.logger.Info("route added for a service CIDR of the cluster", zap.Stringer("cidr", p))
		case errors.Is(err, errRouteExists):
			delete(r.cidrErr, p) // someone's route: the conflict check says where it leads
		default:
			if _, known := r.cidrErr[p]; !known {
				r.logger.Warn("cannot route a service CIDR of the cluster into the TUN; its ClusterIPs do not reach the proxy",
					zap.Stringer("cidr", p), zap.Error(err))
			}
			r.cidrErr[p] = err
		}
	}
	for p := range r.mineCIDR {
		if !wanted[p] {
			r.removeCIDR(p)
			r.logger.Info("route removed: the cluster has no such service CIDR any more", zap.Stringer("cidr", p))
		}
	}
	for p := range r.cidrErr {
		if !wanted[p] {
			delete(r.cidrErr, p)
		}
	}
	r.sync()
	return append(slices.Clone(r.cidrs), r.cluster...)
}

func (r *extRoutes) remove(a netip.Addr) {
	if err := r.ops.del(hostPrefix(a)); err != nil {
		r.logger.Warn("removing the route of an external address", zap.Stringer("address", a), zap.Error(err))
	}
	delete(r.mine, a)
}

// Unrouted returns the external addresses that could not be routed, sorted.
func (r *extRoutes) Unrouted() []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]netip.Addr, 0, len(r.unrouted))
	for a := range r.unrouted {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// notes lists the unrouted addresses and cluster CIDRs for /healthz.
func (r *extRoutes) notes() []string {
	var out []string
	r.mu.Lock()
	for _, p := range slices.SortedFunc(maps.Keys(r.cidrErr), netip.Prefix.Compare) {
		if r.cidrErr[p] == errTooWide {
			out = append(out, "the cluster's service CIDR "+p.String()+" is not routed into the TUN: "+errTooWide.Error())
			continue
		}
		out = append(out, "the cluster's service CIDR "+p.String()+" is not routed into the TUN (needs root or CAP_NET_ADMIN; add it with `sudo ip route add "+p.String()+" dev "+r.dev+"`)")
	}
	r.mu.Unlock()
	for _, a := range r.Unrouted() {
		out = append(out, "external address "+a.String()+" is not routed into the TUN (needs root or CAP_NET_ADMIN; add a route to it, e.g. with `sudo ip route add "+hostPrefix(a).String()+" dev "+r.dev+"`)")
	}
	return out
}

// Close removes every route run added (step 3).
func (r *extRoutes) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for a := range r.mine {
		r.remove(a)
	}
	for p := range r.mineCIDR {
		r.removeCIDR(p)
	}
}

// handOver leaves the routes run added to the next process (a handover):
// nothing is removed, and Sync does nothing from here on.
func (r *extRoutes) handOver() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	clear(r.mine)
	clear(r.mineCIDR)
}

// errTooWide is why a cluster CIDR tooWide says is wide is not routed.
var errTooWide = errors.New("wider than an IPv4 /8 or an IPv6 /64, it would take the host's other traffic")

// tooWide reports whether p is wider than a service CIDR should be (step 5).
func tooWide(p netip.Prefix) bool {
	if p.Addr().Is4() {
		return p.Bits() < 8
	}
	return p.Bits() < 64
}

// removeCIDR removes the route run added for the cluster's CIDR p.
func (r *extRoutes) removeCIDR(p netip.Prefix) {
	if err := r.ops.del(p); err != nil {
		r.logger.Warn("removing the route of a service CIDR", zap.Stringer("cidr", p), zap.Error(err))
	}
	delete(r.mineCIDR, p)
}

package main

import (
	"errors"
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
	closed   bool                 // Close ran: Sync does nothing
	mine     map[netip.Addr]bool  // routes run added
	foreign  map[netip.Addr]bool  // routes that existed: never removed
	unrouted map[netip.Addr]error // could not be routed, with why
}

func newExtRoutes(ops routeOps, dev string, serviceCIDRs []netip.Prefix, logger *zap.Logger) *extRoutes {
	return &extRoutes{ops: ops, dev: dev, cidrs: serviceCIDRs, logger: logger,
		mine: map[netip.Addr]bool{}, foreign: map[netip.Addr]bool{}, unrouted: map[netip.Addr]error{}}
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
	wanted := make(map[netip.Addr]bool, len(want))
	for _, a := range want {
		a = a.Unmap()
		if slices.ContainsFunc(r.cidrs, func(p netip.Prefix) bool { return p.Contains(a) }) {
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

// notes lists the unrouted addresses for /healthz.
func (r *extRoutes) notes() []string {
	var out []string
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
}

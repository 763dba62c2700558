package main

import (
	"context"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// localSources answers proxy.Config.LocalSource: whether a flow's source is
// this host (kube-proxy's `-m addrtype --src-type LOCAL`) or one of its
// pods (its local-traffic detector in ClusterCIDR mode: --cluster-cidr).
// The host's addresses are re-read every localAddrsInterval.
type localSources struct {
	clusterCIDRs []netip.Prefix
	addrs        atomic.Pointer[map[netip.Addr]struct{}]
	logger       *zap.Logger
}

const localAddrsInterval = 5 * time.Second

func newLocalSources(clusterCIDRs []netip.Prefix, logger *zap.Logger) *localSources {
	l := &localSources{clusterCIDRs: clusterCIDRs, logger: logger}
	l.refresh()
	return l
}

// refresh re-reads the host's interface addresses; on an error the last
// set stays.
func (l *localSources) refresh() {
	addrs, err := interfaceAddrs()
	if err != nil {
		l.logger.Warn("reading this host's addresses", zap.Error(err))
		return
	}
	m := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		m[a] = struct{}{}
	}
	l.addrs.Store(&m)
}

// run refreshes the addresses until ctx is done.
func (l *localSources) run(ctx context.Context) { // local address refresher
	every(ctx, localAddrsInterval, l.refresh)
}

// local reports whether a is one of the host's addresses or in a cluster
// CIDR.
func (l *localSources) local(a netip.Addr) bool {
	if m := l.addrs.Load(); m != nil {
		if _, ok := (*m)[a]; ok {
			return true
		}
	}
	return slices.ContainsFunc(l.clusterCIDRs, func(p netip.Prefix) bool { return p.Contains(a) })
}

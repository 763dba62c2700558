package proxy

import (
	"net/netip"
	"time"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/service"
)

// VirtualService is one service port as IPVS would hold it: a virtual
// service (protocol, address, port) with its scheduler, persistence and
// destinations, and the counts the schedulers read. It is the snapshot that
// `userproxy ipvs` and /debug/ipvs print in `ipvsadm -Ln`'s layout.
type VirtualService struct {
	// Name is the service port's name, for display beside the table.
	Name service.PortName
	// Protocol is TCP or UDP.
	Protocol service.Protocol
	// Addr is ClusterIP:port, the address IPVS would list.
	Addr netip.AddrPort
	// Scheduler is the service port's scheduler ("random" for the
	// iptables lottery) and its flags.
	Scheduler balancer.SchedulerConfig
	// Persistent is IPVS persistence's timeout: the ClientIP affinity
	// timeout under an IPVS scheduler, 0 without affinity. Under "random"
	// affinity is xt_recent's, shown in Affinity instead.
	Persistent time.Duration
	// Affinity is the xt_recent affinity timeout under "random", else 0.
	Affinity time.Duration
	// Dests are the destinations in the order the scheduler sees them
	// (kube-proxy's: sorted by "ip:port").
	Dests []Destination
	// Stats sums the destinations' counters.
	Stats IPVSStats
}

// Destination is one endpoint of a VirtualService.
type Destination struct {
	Addr netip.AddrPort
	// Weight is 1: EndpointSlices carry no weights.
	Weight int32
	// ActiveConn and InActConn are IPVS's counts: ESTABLISHED TCP flows,
	// and every other tracked flow (UDP flows are all inactive).
	ActiveConn, InActConn int32
	Stats                 IPVSStats
}

// IPVSStats are the counters and rates `ipvsadm -Ln --stats` and `--rate`
// print: totals since the destination was first used, and the rates of
// IPVS's estimator (ip_vs_est.c), per second.
type IPVSStats struct {
	Conns, InPkts, OutPkts, InBytes, OutBytes uint64
	CPS, InPPS, OutPPS, InBPS, OutBPS         uint64
}

// IPVS returns the service table as IPVS virtual services, sorted by
// protocol, address and port, as ipvsadm sorts them.
func (p *Proxy) IPVS() []VirtualService {
	return nil // filled in by the scheduler wiring
}

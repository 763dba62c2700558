package conntrack

import (
	"errors"
	"fmt"
	"hash/maphash"
	"runtime"
	"time"
)

// Timeouts are the per-state lifetimes of an entry, refreshed by every
// accepted packet. A zero field takes its default from DefaultTimeouts.
type Timeouts struct {
	TCPSynSent     time.Duration // nf_conntrack_tcp_timeout_syn_sent
	TCPSynRecv     time.Duration // nf_conntrack_tcp_timeout_syn_recv
	TCPEstablished time.Duration // nf_conntrack_tcp_timeout_established
	TCPFinWait     time.Duration // nf_conntrack_tcp_timeout_fin_wait
	TCPCloseWait   time.Duration // nf_conntrack_tcp_timeout_close_wait
	TCPLastAck     time.Duration // nf_conntrack_tcp_timeout_last_ack
	TCPTimeWait    time.Duration // nf_conntrack_tcp_timeout_time_wait
	TCPClose       time.Duration // nf_conntrack_tcp_timeout_close
	TCPSynSent2    time.Duration // the kernel's SYN_SENT2 timeout (no sysctl)
	// TCPMaxRetrans caps the timeout once a segment was retransmitted three
	// times without an acceptable ACK (nf_conntrack_tcp_timeout_max_retrans),
	// and while the last ACK advertised a zero window.
	TCPMaxRetrans time.Duration
	// TCPUnacknowledged caps the timeout while either side has data in
	// flight (nf_conntrack_tcp_timeout_unacknowledged).
	TCPUnacknowledged time.Duration
	UDP               time.Duration // nf_conntrack_udp_timeout: no reply yet, or younger than 2 s
	UDPStream         time.Duration // nf_conntrack_udp_timeout_stream: replied and older than 2 s
}

// DefaultTimeouts returns the timeouts of DESIGN.md section 3: the kernel's
// defaults with kube-proxy's ESTABLISHED (1 day) and CLOSE_WAIT (1 hour).
func DefaultTimeouts() Timeouts {
	return Timeouts{
		TCPSynSent:        120 * time.Second,
		TCPSynRecv:        60 * time.Second,
		TCPEstablished:    24 * time.Hour,
		TCPFinWait:        120 * time.Second,
		TCPCloseWait:      time.Hour,
		TCPLastAck:        30 * time.Second,
		TCPTimeWait:       120 * time.Second,
		TCPClose:          10 * time.Second,
		TCPSynSent2:       120 * time.Second,
		TCPMaxRetrans:     300 * time.Second,
		TCPUnacknowledged: 300 * time.Second,
		UDP:               30 * time.Second,
		UDPStream:         120 * time.Second,
	}
}

// kube-proxy's --conntrack-max-per-core and --conntrack-min defaults, and the
// cap getConntrackMax applies (pkg/proxy/conntrack/sysctls.go).
const (
	maxPerCore = 32768
	maxFloor   = 131072
	maxCap     = 1048576
)

// DefaultMax applies kube-proxy's rule: 32768 entries per core, at least
// 131072, at most 1048576.
func DefaultMax(numCPU int) int {
	n := maxPerCore * max(numCPU, 0)
	switch {
	case n > maxCap:
		return maxCap
	case n > maxFloor:
		return n
	}
	return maxFloor
}

// defaultShards is the shard count when Config.Shards is zero: enough that
// the few goroutines feeding the gate rarely meet on one lock.
const defaultShards = 64

// Config configures a Table. The zero Config is usable: every zero field
// takes the default documented on it.
type Config struct {
	// Max bounds the number of entries (nf_conntrack_max). When the table is
	// full, Confirm early-drops a non-ASSURED entry or refuses the new flow.
	// Zero means DefaultMax(1) (131072); DefaultConfig uses the core count.
	Max int
	// Shards is the number of independently locked shards, a power of two.
	// Zero means 64.
	Shards int
	// Timeouts; zero fields take DefaultTimeouts.
	Timeouts Timeouts
	// Liberal is nf_conntrack_tcp_be_liberal: segments outside the TCP window
	// are accepted (without updating window tracking) instead of INVALID.
	// RSTs whose sequence number lies before what the peer acknowledged stay
	// INVALID, as in the kernel.
	Liberal bool
	// SkipChecksums turns off checksum verification of Original-direction
	// packets (nf_conntrack_checksum=0). Set it only when the device has
	// already verified them. Reply-direction checksums are never verified:
	// the local stack wrote them, as the kernel assumes on its output path.
	SkipChecksums bool
	// HashSeed keys the tuple hash that places flows in shards and index
	// slots. Set it from a random source (DefaultConfig does) so that
	// clients cannot precompute colliding tuples; zero is a fixed seed,
	// which keeps tests deterministic.
	HashSeed uint64
	// Clock; nil means NewSystemClock(). The gate should use a CoarseClock
	// it ticks every few milliseconds: reading the system clock is a large
	// part of the per-packet cost on virtual machines.
	Clock Clock
	// OnRemove, when set, is called once for every entry that leaves the
	// table, with a final snapshot and the reason. It is called synchronously
	// on the goroutine whose call caused the removal (Classify, Confirm,
	// Sweep or Delete), after every lock of the table was released, so it may
	// call back into the Table. It may run after a new entry for the same
	// tuple was inserted; EntryInfo.ID tells the two apart. Keep it short: it
	// can run on the packet path.
	OnRemove func(EntryInfo, RemoveReason)
}

// DefaultConfig returns a Config with Max from DefaultMax(runtime.NumCPU()),
// a random HashSeed, and every other field at its default. It is the only
// place this package asks the runtime anything.
func DefaultConfig() Config {
	return Config{
		Max:      DefaultMax(runtime.NumCPU()),
		Shards:   defaultShards,
		Timeouts: DefaultTimeouts(),
		HashSeed: maphash.Bytes(maphash.MakeSeed(), nil),
	}
}

// errConfig wraps every configuration error NewTable returns.
var errConfig = errors.New("conntrack: invalid config")

// withDefaults returns c with zero fields defaulted, or an error for values
// that are set but unusable.
func (c Config) withDefaults() (Config, error) {
	if c.Max < 0 {
		return c, fmt.Errorf("%w: Max %d is negative", errConfig, c.Max)
	}
	if c.Max == 0 {
		c.Max = DefaultMax(1)
	}
	if c.Shards < 0 || c.Shards&(c.Shards-1) != 0 {
		return c, fmt.Errorf("%w: Shards %d is not a power of two", errConfig, c.Shards)
	}
	if c.Shards == 0 {
		c.Shards = defaultShards
	}
	if c.Shards > 1<<16 {
		return c, fmt.Errorf("%w: Shards %d is more than 65536", errConfig, c.Shards)
	}
	d := DefaultTimeouts()
	fields := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"TCPSynSent", &c.Timeouts.TCPSynSent, d.TCPSynSent},
		{"TCPSynRecv", &c.Timeouts.TCPSynRecv, d.TCPSynRecv},
		{"TCPEstablished", &c.Timeouts.TCPEstablished, d.TCPEstablished},
		{"TCPFinWait", &c.Timeouts.TCPFinWait, d.TCPFinWait},
		{"TCPCloseWait", &c.Timeouts.TCPCloseWait, d.TCPCloseWait},
		{"TCPLastAck", &c.Timeouts.TCPLastAck, d.TCPLastAck},
		{"TCPTimeWait", &c.Timeouts.TCPTimeWait, d.TCPTimeWait},
		{"TCPClose", &c.Timeouts.TCPClose, d.TCPClose},
		{"TCPSynSent2", &c.Timeouts.TCPSynSent2, d.TCPSynSent2},
		{"TCPMaxRetrans", &c.Timeouts.TCPMaxRetrans, d.TCPMaxRetrans},
		{"TCPUnacknowledged", &c.Timeouts.TCPUnacknowledged, d.TCPUnacknowledged},
		{"UDP", &c.Timeouts.UDP, d.UDP},
		{"UDPStream", &c.Timeouts.UDPStream, d.UDPStream},
	}
	for _, f := range fields {
		if *f.v < 0 {
			return c, fmt.Errorf("%w: timeout %s %v is negative", errConfig, f.name, *f.v)
		}
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if c.Clock == nil {
		c.Clock = NewSystemClock()
	}
	return c, nil
}

package service

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"time"
)

// Table is an immutable snapshot of every service port: what a new flow to
// (protocol, IP, port) becomes. Build one with a Tracker; read it from any
// number of goroutines without locks. A nil *Table is empty.
//
// Layout: the lookup index is split into shards by ClusterIP, and a new
// table shares with its predecessor every shard no change touched, so that
// applying one change costs one shard copy rather than a full rebuild.
type Table struct {
	// index maps (IP, port, protocol) to its Port, and (IP, 0, 0) to
	// ipMarker for every ClusterIP of a proxied service; likewise, under
	// their own key kinds, externalIPs and LB IPs, and NodePorts (keyed by
	// family, port and protocol).
	index [numShards]map[lookupKey]*Port
	// byService maps a service to its Ports, for Ports and Services.
	byService [numShards]map[ServiceName][]*Port

	// sorted holds every Port in Ports order, in chunks (see finishSorted).
	sorted [][]*Port
	// extAddrs is ExternalAddrs: sorted, distinct, replaced (not modified)
	// when it changes.
	extAddrs []netip.Addr

	// The DNS view (dns.go): services by name, ClusterIP -> service for
	// PTR records, and the namespaces that have a service.
	dns        [numShards]map[ServiceName]*DNSService
	ptr        [numShards]map[lookupKey]ServiceName // keys: makeKey(ip, 0, 0)
	namespaces map[string]struct{}
	nDNS       int

	nPorts, nServices int
	skipped           []Skipped
	generation        uint64
	built             time.Time
}

const (
	shardBits = 8
	numShards = 1 << shardBits
)

// lookupKey is a plain 22-byte value, so map hashing needs no pointer
// handling: the address in 16-byte form, its family, port and protocol,
// and what kind of destination it is.
type lookupKey struct {
	addr  [16]byte
	port  uint16
	proto Protocol
	is4   bool
	kind  keyKind
}

// keyKind tells the destinations apart in the one index: a ClusterIP, an
// externalIP or LB IP, a NodePort.
type keyKind uint8

const (
	kindCluster keyKind = iota
	kindExternal
	kindNodePort
)

func makeKey(ip netip.Addr, port uint16, proto Protocol) lookupKey {
	return lookupKey{addr: ip.As16(), port: port, proto: proto, is4: ip.Is4()}
}

func makeExternalKey(ip netip.Addr, port uint16, proto Protocol) lookupKey {
	k := makeKey(ip, port, proto)
	k.kind = kindExternal
	return k
}

// makeNodePortKey keys a NodePort of one family. The port number is also
// written into the address bytes, so that ipShard spreads NodePorts over
// the shards and a change copies one small shard.
func makeNodePortKey(fam Family, port uint16, proto Protocol) lookupKey {
	k := lookupKey{port: port, proto: proto, is4: fam == IPv4, kind: kindNodePort}
	k.addr[14], k.addr[15] = byte(port>>8), byte(port)
	return k
}

// ipMarker is the value of the (ClusterIP, 0, 0) entries: "this IP is a
// ClusterIP", so a miss on the port answers UnknownPort, not NotService.
var ipMarker = &Port{}

// ipShard picks the index shard of an address (in 16-byte form).
func ipShard(b *[16]byte) int {
	h := binary.LittleEndian.Uint64(b[8:]) ^ binary.LittleEndian.Uint64(b[:8])*0xff51afd7ed558ccd
	h ^= h >> 29
	h *= 0x9e3779b97f4a7c15
	return int(h >> (64 - shardBits))
}

// nameShard picks the byService shard of a service: FNV-1a of
// "namespace/name" (deterministic; nothing observable depends on it).
func nameShard(n ServiceName) int {
	h := uint64(14695981039346656037)
	add := func(s string) {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	add(n.Namespace)
	add("/")
	add(n.Name)
	h ^= h >> 32
	return int(h & (numShards - 1))
}

// Lookup answers what to do with a new flow of protocol proto to ip:port,
// where ip is a ClusterIP (LookupExternal and LookupNodePort answer the
// external destinations).
// With Forward the *Port has the endpoints to pick from; with NoEndpoints or
// NoLocalEndpoints it is the port that has none; with NotService and
// UnknownPort it is nil. Lookup is O(1), lock-free and allocation-free.
// The address must be as it appears on the wire: an IPv4-mapped IPv6 address
// is not the IPv4 address, and a zone never matches.
func (t *Table) Lookup(proto Protocol, ip netip.Addr, port uint16) (*Port, Verdict) {
	if t == nil || ip.Zone() != "" {
		return nil, NotService
	}
	p, v := t.find(makeKey(ip, port, proto))
	if p != nil {
		return p, p.Verdict
	}
	return nil, v
}

// find returns the Port at an address key, or nil and UnknownPort when the
// address is marked (known, but not with that port and protocol), or nil
// and NotService. The caller takes the Port's verdict.
func (t *Table) find(k lookupKey) (*Port, Verdict) {
	m := t.index[ipShard(&k.addr)]
	if m == nil {
		return nil, NotService
	}
	if k.port != 0 && k.proto != 0 {
		if p := m[k]; p != nil {
			return p, Forward
		}
	}
	k.port, k.proto = 0, 0
	if m[k] != nil {
		return nil, UnknownPort
	}
	return nil, NotService
}

// Ports returns every Port, sorted by name, protocol and family. The slice is
// the caller's; the Ports are shared and must not be modified. A Port that
// lost a conflict (two services claiming one ClusterIP:port/protocol, which
// the API server prevents) is listed although Lookup never returns it.
func (t *Table) Ports() []*Port {
	if t == nil {
		return nil
	}
	out := make([]*Port, 0, t.nPorts)
	for _, c := range t.sorted {
		out = append(out, c...)
	}
	return out
}

// Service returns the Ports of one service (nil if it has none), ordered by
// family then spec port order. The slice must not be modified.
func (t *Table) Service(name ServiceName) []*Port {
	if t == nil {
		return nil
	}
	return t.byService[nameShard(name)][name]
}

// Len returns the number of Ports.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return t.nPorts
}

// Services returns the number of services with at least one Port.
func (t *Table) Services() int {
	if t == nil {
		return 0
	}
	return t.nServices
}

// Skipped returns the services and service ports left out of the table, and
// why (headless, ExternalName, SCTP, invalid), sorted by service. The slice
// must not be modified.
func (t *Table) Skipped() []Skipped {
	if t == nil {
		return nil
	}
	return t.skipped
}

// Generation numbers the tables a Tracker published, from 1.
func (t *Table) Generation() uint64 {
	if t == nil {
		return 0
	}
	return t.generation
}

// Built returns when the Tracker started building this table.
func (t *Table) Built() time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.built
}

// tableBuilder derives a new Table from the previous one, copying a shard
// the first time it is written and sharing the rest.
type tableBuilder struct {
	t *Table
	// grow is how many entries a copied shard is expected to gain.
	grow        int
	ownIndex    [numShards]bool
	ownServices [numShards]bool
	// The DNS view's shards this build copied already.
	ownDNS, ownPTR [numShards]bool
	ownNamespaces  bool
	// touched records whether anything was written.
	touched bool
	// removed and added are the Ports leaving and entering the table.
	removed, added []*Port
	// extRemoved and extAdded are the addresses leaving and entering
	// ExternalAddrs.
	extRemoved, extAdded []netip.Addr
}

// newTableBuilder starts a table from prev (nil for the first) that about
// changes services will alter.
func newTableBuilder(prev *Table, changes int) *tableBuilder {
	t := &Table{}
	if prev != nil {
		t.index = prev.index
		t.byService = prev.byService
		t.sorted = prev.sorted
		t.extAddrs = prev.extAddrs
		t.nPorts, t.nServices = prev.nPorts, prev.nServices
		t.skipped = prev.skipped
		t.generation = prev.generation
		t.dns, t.ptr, t.namespaces, t.nDNS = prev.dns, prev.ptr, prev.namespaces, prev.nDNS
	}
	return &tableBuilder{t: t, grow: 2*changes/numShards + 4}
}

func (b *tableBuilder) indexShard(addr *[16]byte) map[lookupKey]*Port {
	i := ipShard(addr)
	if !b.ownIndex[i] {
		b.ownIndex[i] = true
		old := b.t.index[i]
		m := make(map[lookupKey]*Port, len(old)+2*b.grow)
		for k, v := range old {
			m[k] = v
		}
		b.t.index[i] = m
	}
	return b.t.index[i]
}

func (b *tableBuilder) get(k lookupKey) *Port { return b.t.index[ipShard(&k.addr)][k] }

func (b *tableBuilder) setIndex(k lookupKey, p *Port) {
	b.touched = true
	m := b.indexShard(&k.addr)
	if p == nil {
		delete(m, k)
	} else {
		m[k] = p
	}
}

func (b *tableBuilder) setService(n ServiceName, ports []*Port) {
	b.touched = true
	i := nameShard(n)
	if !b.ownServices[i] {
		b.ownServices[i] = true
		old := b.t.byService[i]
		m := make(map[ServiceName][]*Port, len(old)+b.grow)
		for k, v := range old {
			m[k] = v
		}
		b.t.byService[i] = m
	}
	m := b.t.byService[i]
	if old, ok := m[n]; ok {
		b.t.nPorts -= len(old)
		b.t.nServices--
	}
	if len(ports) == 0 {
		delete(m, n)
		return
	}
	m[n] = ports
	b.t.nPorts += len(ports)
	b.t.nServices++
}

// finishSorted computes the new table's Ports order. The order is kept in
// chunks of at most 2*chunkSize Ports, so a change copies one chunk and the
// list of chunks, not every Port. Much change: a full sort.
func (b *tableBuilder) finishSorted() {
	if len(b.removed)+len(b.added) > b.t.nPorts/4+chunkSize {
		all := make([]*Port, 0, b.t.nPorts)
		for _, m := range b.t.byService {
			for _, ps := range m {
				all = append(all, ps...)
			}
		}
		slices.SortFunc(all, comparePorts)
		var chunks [][]*Port
		for len(all) > 0 {
			n := min(chunkSize, len(all))
			chunks = append(chunks, all[:n:n])
			all = all[n:]
		}
		b.t.sorted = chunks
		return
	}
	chunks := slices.Clone(b.t.sorted)
	for _, p := range b.removed {
		chunks = removeSorted(chunks, p)
	}
	for _, p := range b.added {
		chunks = insertSorted(chunks, p)
	}
	b.t.sorted = chunks
}

const chunkSize = 128

// finishExternalAddrs computes the new table's ExternalAddrs, copying the
// list only when an address came or went.
func (b *tableBuilder) finishExternalAddrs() {
	if len(b.extRemoved) == 0 && len(b.extAdded) == 0 {
		return
	}
	addrs := slices.Clone(b.t.extAddrs)
	for _, a := range b.extRemoved {
		if i, ok := slices.BinarySearchFunc(addrs, a, netip.Addr.Compare); ok {
			addrs = slices.Delete(addrs, i, i+1)
		}
	}
	for _, a := range b.extAdded {
		if i, ok := slices.BinarySearchFunc(addrs, a, netip.Addr.Compare); !ok {
			addrs = slices.Insert(addrs, i, a)
		}
	}
	if len(addrs) == 0 {
		addrs = nil
	}
	b.t.extAddrs = addrs
	b.touched = true
}

// findChunk returns the chunk that holds p or would: the first whose last
// Port does not sort before p, or the last chunk.
func findChunk(chunks [][]*Port, p *Port) int {
	i, _ := slices.BinarySearchFunc(chunks, p, func(c []*Port, p *Port) int { return comparePorts(c[len(c)-1], p) })
	return min(i, len(chunks)-1)
}

// removeSorted returns chunks without p, copying the chunk it is cut from.
// Ports are unique in Ports order (name, protocol, family).
func removeSorted(chunks [][]*Port, p *Port) [][]*Port {
	if len(chunks) == 0 {
		return chunks
	}
	ci := findChunk(chunks, p)
	c := chunks[ci]
	i, ok := slices.BinarySearchFunc(c, p, comparePorts)
	if !ok || c[i] != p {
		return chunks
	}
	if len(c) == 1 {
		return slices.Delete(chunks, ci, ci+1)
	}
	nc := make([]*Port, 0, len(c)-1)
	nc = append(append(nc, c[:i]...), c[i+1:]...)
	chunks[ci] = nc
	return chunks
}

// insertSorted returns chunks with p in its place, copying (and, when it
// grows past 2*chunkSize, splitting) the chunk it goes into.
func insertSorted(chunks [][]*Port, p *Port) [][]*Port {
	if len(chunks) == 0 {
		return [][]*Port{{p}}
	}
	ci := findChunk(chunks, p)
	c := chunks[ci]
	i, _ := slices.BinarySearchFunc(c, p, comparePorts)
	nc := make([]*Port, 0, len(c)+1)
	nc = append(append(append(nc, c[:i]...), p), c[i:]...)
	if len(nc) <= 2*chunkSize {
		chunks[ci] = nc
		return chunks
	}
	half := len(nc) / 2
	chunks[ci] = nc[:half:half]
	return slices.Insert(chunks, ci+1, nc[half:])
}

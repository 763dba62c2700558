//go:build linux

package integration

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
)

// Hostile traffic through a real TUN while a well-behaved client keeps
// connecting: random payloads, truncated headers, bad checksums, IP
// fragments, SYN floods from one and from many addresses, and a UDP flood to
// many ports. Every flood is bounded in count and time. The good client's
// connections must all succeed, and every hostile packet must show up in
// the counter its kind belongs to (see fate): a malformed packet under its
// INVALID reason, a valid SYN as an accepted flow that netstack then either
// hands to the proxy or limits, a datagram to a port without a service as
// a rejected flow.
//
// The counts are exact because no packet is lost on the way: the TUN's
// queue is made longer than all the test sends (the kernel drops what
// overflows it, and did drop about a third of the floods when they were
// merely paced), and the sender keeps its backlog short so that the good
// client's packets do not wait behind thousands of junk ones.
func TestHostileTraffic(t *testing.T) {
	requireRoot(t)
	seed := testSeed(t, 9)
	h, cl := tunEnv{}.start(t, seed)
	var backendConns atomic.Int64 // connections the proxy dialled
	be := startTCPBackend(t, "127.0.0.1", func(c net.Conn) {
		backendConns.Add(1)
		nameServer("ok")(c)
	})
	h.addService("web", "10.96.0.10", v1.ProtocolTCP, 80, false, be.addr)
	nsc := cl.(*nsClient)
	if err := nsc.run(func() error {
		tun, err := netlink.LinkByName("upx0")
		if err != nil {
			return err
		}
		return netlink.LinkSetTxQLen(tun, hostileTxQueue)
	}); err != nil {
		t.Fatalf("lengthening the TUN's queue: %v", err)
	}

	var fd int
	if err := nsc.run(func() (err error) {
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	svc := netip.MustParseAddr("10.96.0.10")
	client := tunClient4.Addr()
	send := func(pkt []byte) bool {
		var dst syscall.SockaddrInet4
		copy(dst.Addr[:], pkt[16:20])
		return syscall.Sendto(fd, pkt, 0, &dst) == nil
	}

	r := rand.New(rand.NewPCG(seed, seed))
	floods := []struct {
		name  string
		count int
		make  func(i int) ([]byte, fate)
	}{
		{"random payloads", 3000, func(int) ([]byte, fate) { return randomPayload(r, client, svc) }},
		{"truncated TCP headers", 2000, func(i int) ([]byte, fate) {
			// 4 to 19 bytes: gVisor's fdbased endpoint drops an IPv4 packet
			// with fewer than 4 bytes after its header (the ports its
			// processors hash on; tcpipConnectionID in
			// pkg/tcpip/link/fdbased/processors.go) before the gate sees
			// it, so those are not counted on a TUN.
			b := tcpSegment(client, uint16(30000+i%1000), svc, 80, flagACK, 1, 1)
			return withPayload(b[:20], 6, b[20:24+r.IntN(16)]), invalid(conntrack.ReasonTruncated)
		}},
		{"bad TCP checksums", 2000, func(i int) ([]byte, fate) {
			b := tcpSegment(client, uint16(31000+i%1000), svc, 80, flagSYN, r.Uint32(), 0)
			b[36] ^= 0xff
			return b, invalid(conntrack.ReasonBadChecksum)
		}},
		{"IP fragments", 2000, func(i int) ([]byte, fate) {
			b := tcpSegment(client, uint16(32000+i%1000), svc, 80, flagSYN, r.Uint32(), 0)
			binary.BigEndian.PutUint16(b[6:], 0x2000) // more fragments
			return b, fate{kind: ipFragment}
		}},
		{"SYN flood from one address", 3000, func(i int) ([]byte, fate) {
			return tcpSegment(netip.MustParseAddr("192.0.2.200"), uint16(1024+i), svc, 80, flagSYN, r.Uint32(), 0), fate{kind: validSYN}
		}},
		{"SYN flood from many addresses", 3000, func(i int) ([]byte, fate) {
			src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			return tcpSegment(src, uint16(1024+i%50000), svc, 80, flagSYN, r.Uint32(), 0), fate{kind: validSYN}
		}},
		{"UDP flood to many ports", 3000, func(i int) ([]byte, fate) {
			return udpDatagram(client, uint16(40000+i%1000), svc, uint16(1+i%5000), []byte("x")), fate{kind: noService}
		}},
	}

	st0, ct0, df0 := h.st.Stats(), h.ct.Stats(), h.px.Reassembler().Stats()
	tun0 := linkStats(t, nsc, "upx0")
	retrans0 := tcpRetransSegs(t, nsc)

	// The floods are interleaved, so that every kind is sent even if the
	// time bound cuts the run short on a slow machine. want is what the
	// packets sent must have been counted as.
	sent := make([]int, len(floods))
	var want struct {
		invalid                         [conntrack.NumReasons]uint64
		fragments, syns, udp, untracked uint64
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the hostile sender
		defer wg.Done()
		deadline := time.Now().Add(20 * time.Second)
		var total uint64
		for i := 0; ; i++ {
			// The gate's count includes the good client's packets, so the
			// backlog may be longer than this by those; the queue holds
			// them too.
			for total > h.st.Stats().PacketsIn-st0.PacketsIn+hostileBacklog && time.Now().Before(deadline) {
				time.Sleep(100 * time.Microsecond)
			}
			more := false
			for k, f := range floods {
				if i >= f.count {
					continue
				}
				more = true
				if time.Now().After(deadline) {
					return
				}
				pkt, fa := f.make(i)
				if !send(pkt) {
					continue
				}
				sent[k]++
				total++
				switch fa.kind {
				case invalidPacket:
					want.invalid[fa.reason]++
				case ipFragment:
					want.fragments++
				case validSYN:
					want.syns++
				case noService:
					want.udp++
				case untracked:
					want.untracked++
				}
			}
			if !more {
				return
			}
		}
	}()

	// The well-behaved client, at the same time.
	good, bad := 0, 0
	var firstErr error
	for i := 0; i < goodConns; i++ {
		conn, err := cl.dial("tcp", "10.96.0.10:80")
		if err == nil {
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			var got []byte
			got, err = io.ReadAll(conn)
			conn.Close()
			if err == nil && string(got) != "ok" {
				err = io.ErrUnexpectedEOF
			}
		}
		if err != nil {
			bad++
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		good++
	}
	wg.Wait()
	t.Logf("good client: %d ok, %d failed (first error %v)", good, bad, firstErr)
	t.Logf("peak RSS of the test process: %s", peakRSS())
	for k, f := range floods {
		t.Logf("%s: %d of %d sent", f.name, sent[k], f.count)
	}
	if bad != 0 {
		t.Fatalf("%d of the good client's connections failed during the floods", bad)
	}

	// The counters, as expected ranges. A valid SYN is accepted by the
	// gate and reaches netstack's in-flight bounds, which either hand it
	// to the proxy (which dials the endpoint, or fails to and counts it) or
	// limit it. The good client's SYNs are limited too when they come while
	// the floods fill the bounds, but each of those was retransmitted, so
	// the kernel's count of retransmissions bounds them.
	retrans := tcpRetransSegs(t, nsc) - retrans0
	type row struct {
		counter string
		got     uint64
		lo, hi  uint64
	}
	rows := func() []row {
		st, ct := h.st.Stats(), h.ct.Stats()
		var rs []row
		var malformed uint64
		for _, reason := range malformedReasons {
			w := want.invalid[reason]
			malformed += w
			rs = append(rs, row{"conntrack INVALID " + reason.String(), ct.Invalid[reason] - ct0.Invalid[reason], w, w})
		}
		handed := uint64(backendConns.Load()-goodConns) + h.px.Stats().Flows[0][proxy.ResultDialFailed]
		df := h.px.Reassembler().Stats()
		return append(rs,
			// The good client's packets are never INVALID inbound, but a
			// retransmission may be: at least the floods' count.
			row{"gate INVALID in", st.InvalidIn - st0.InvalidIn, malformed, math.MaxUint64},
			// Fragments go to the reassembler (held, then dropped as
			// duplicates or at the timeout), never to conntrack.
			row{"defrag fragments taken", df.Fragments - df0.Fragments, want.fragments, want.fragments},
			row{"conntrack untracked protocols (not INVALID)", ct.UnsupportedTotal - ct0.UnsupportedTotal, want.untracked, want.untracked},
			// A SYN the translator's in-flight bound drops takes its entry
			// with it: the good client's retransmission is a new flow again.
			row{"gate accepted new flows", st.Accepted - st0.Accepted, want.syns + goodConns, want.syns + goodConns + retrans},
			row{"gate rejected new flows", st.Rejected - st0.Rejected, want.udp, want.udp},
			row{"netstack in-flight limited, plus SYNs handed to the proxy by the floods",
				st.InFlightLimited - st0.InFlightLimited + handed, want.syns, want.syns + retrans},
		)
	}
	// Packets still queued or on their way through the stack are counted
	// soon: wait until every counter reaches its expected range.
	rs := rows()
	for settle := time.Now().Add(15 * time.Second); time.Now().Before(settle); rs = rows() {
		done := true
		for _, x := range rs {
			done = done && x.got >= x.lo
		}
		if done {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, ct := h.st.Stats(), h.ct.Stats()
	t.Logf("gate: in %d, invalid %d, accepted %d, rejected %d (ICMP rate-limited %d), in-flight limited %d, handshakes aborted %d",
		st.PacketsIn-st0.PacketsIn, st.InvalidIn-st0.InvalidIn, st.Accepted-st0.Accepted, st.Rejected-st0.Rejected,
		st.RejectRateLimited-st0.RejectRateLimited, st.InFlightLimited-st0.InFlightLimited, st.HandshakesAborted-st0.HandshakesAborted)
	for reason := range conntrack.NumReasons {
		if n := ct.Invalid[reason] - ct0.Invalid[reason]; n != 0 && !slices.Contains(malformedReasons, reason) {
			t.Logf("conntrack INVALID %s (not checked): %d", reason, n)
		}
	}
	t.Logf("endpoint connections %d, client retransmissions %d", backendConns.Load(), retrans)
	if d := linkStats(t, nsc, "upx0").TxDropped - tun0.TxDropped; d != 0 {
		t.Fatalf("the TUN's queue dropped %d packets: the counts below assume that every packet reached the gate", d)
	}
	for _, x := range rs {
		switch {
		case x.got >= x.lo && x.got <= x.hi:
			t.Logf("%s: %d", x.counter, x.got)
		case x.lo == x.hi:
			t.Errorf("%s: %d, want %d", x.counter, x.got, x.lo)
		case x.hi == math.MaxUint64:
			t.Errorf("%s: %d, want at least %d", x.counter, x.got, x.lo)
		default:
			t.Errorf("%s: %d, want %d to %d", x.counter, x.got, x.lo, x.hi)
		}
	}
}

const (
	// goodConns is the number of the good client's connections.
	goodConns = 300
	// hostileTxQueue is the TUN queue length of TestHostileTraffic: more
	// than all the packets it sends.
	hostileTxQueue = 1 << 15
	// hostileBacklog bounds the hostile packets sent but not yet read by
	// the gate (less the good client's packets it read meanwhile).
	hostileBacklog = 256
)

// malformedReasons are the INVALID reasons of malformed packets: none of
// them is the good client's, so their counts are exactly the floods'.
// Fragments go to the reassembler, untracked protocols to their own count.
var malformedReasons = []conntrack.Reason{
	conntrack.ReasonTruncated, conntrack.ReasonBadIPHeader, conntrack.ReasonBadLength, conntrack.ReasonBadChecksum,
	conntrack.ReasonBadDataOffset, conntrack.ReasonBadTCPFlags,
}

// fate is what the datapath must do with a hostile packet, and so which
// counter it must show up in.
type fate struct {
	kind   fateKind
	reason conntrack.Reason // of an invalidPacket
}

type fateKind uint8

const (
	// invalidPacket: dropped as INVALID for reason.
	invalidPacket fateKind = iota
	// ipFragment: an IPv4 fragment, taken by the reassembler (it never
	// completes).
	ipFragment
	// untracked: a protocol conntrack does not track, dropped but not
	// INVALID (counted in Stats.Unsupported).
	untracked
	// validSYN: a new flow for the service, accepted; then handed to the
	// proxy or limited by netstack's in-flight bounds.
	validSYN
	// noService: a new flow to a port without a service, rejected.
	noService
)

func invalid(r conntrack.Reason) fate { return fate{kind: invalidPacket, reason: r} }

// randomPayload builds an IPv4 packet from src to dst whose transport
// header and payload (20 to 219 bytes) are random, under TCP, UDP, ICMP or
// any other protocol number, a quarter each; the kernel fills in the IP
// header's length and checksum. A transport checksum that is right by
// chance is made wrong, so that every packet is malformed. The fate is the
// reason the checks find first, in the kernel's order: tcp_error looks at
// the data offset before the checksum (nf_conntrack_proto_tcp.c), udp_error
// at the UDP length (nf_conntrack_proto_udp.c), icmp_error at the checksum
// once 8 bytes are there (nf_conntrack_proto_icmp.c). Other protocols the
// kernel would track generically; conntrack drops them as untracked, outside
// the INVALID counts.
func randomPayload(r *rand.Rand, src, dst netip.Addr) ([]byte, fate) {
	p := make([]byte, 20+r.IntN(200))
	for j := range p {
		p[j] = byte(r.Uint32())
	}
	var proto byte
	switch r.IntN(4) {
	case 0:
		proto = 6
	case 1:
		proto = 17
	case 2:
		proto = 1
	default:
		for proto = 6; proto == 1 || proto == 6 || proto == 17; {
			proto = byte(r.Uint32())
		}
	}
	f := fate{kind: untracked}
	switch proto {
	case 6:
		if doff := int(p[12]>>4) * 4; doff < 20 || doff > len(p) {
			f = invalid(conntrack.ReasonBadDataOffset)
			break
		}
		spoil(p[16:18], func() bool { return onesSum(p, pseudoSum4(src, dst, proto, len(p))) == 0xffff })
		f = invalid(conntrack.ReasonBadChecksum)
	case 17:
		ulen := int(binary.BigEndian.Uint16(p[4:]))
		if ulen < 8 || ulen > len(p) {
			f = invalid(conntrack.ReasonBadLength)
			break
		}
		// Zero means no checksum. The sum covers the UDP length (RFC 768);
		// the kernel's nf_checksum sums the whole IP payload: wrong for both.
		spoil(p[6:8], func() bool {
			return binary.BigEndian.Uint16(p[6:]) == 0 ||
				onesSum(p[:ulen], pseudoSum4(src, dst, proto, ulen)) == 0xffff ||
				onesSum(p, pseudoSum4(src, dst, proto, len(p))) == 0xffff
		})
		f = invalid(conntrack.ReasonBadChecksum)
	case 1:
		spoil(p[2:4], func() bool { return onesSum(p, 0) == 0xffff })
		f = invalid(conntrack.ReasonBadChecksum)
	}
	hdr := tcpSegment(src, 0, dst, 0, 0, 0, 0)[:20]
	return withPayload(hdr, proto, p), f
}

// spoil flips bits of the checksum field c, one after another, while right
// reports it right.
func spoil(c []byte, right func() bool) {
	for bit := 0; right(); bit++ {
		c[bit/8%2] ^= 0x80 >> (bit % 8)
	}
}

// pseudoSum4 is the sum of the IPv4 pseudo-header of a transport segment
// of n bytes (RFC 768, RFC 793).
func pseudoSum4(src, dst netip.Addr, proto byte, n int) uint32 {
	s, d := src.As4(), dst.As4()
	return uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:])) +
		uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:])) + uint32(proto) + uint32(n)
}

// linkStats reads a device's counters in the client namespace.
func linkStats(t testing.TB, c *nsClient, name string) netlink.LinkStatistics {
	t.Helper()
	var s netlink.LinkStatistics
	if err := c.run(func() error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		if l.Attrs().Statistics == nil {
			return fmt.Errorf("%s: no statistics", name)
		}
		s = *l.Attrs().Statistics
		return nil
	}); err != nil {
		t.Fatalf("reading the counters of %s: %v", name, err)
	}
	return s
}

// tcpRetransSegs reads the client namespace's count of retransmitted TCP
// segments (RetransSegs in /proc/net/snmp, RFC 1213's tcpRetransSegs).
func tcpRetransSegs(t testing.TB, c *nsClient) uint64 {
	t.Helper()
	var n uint64
	err := c.run(func() error {
		// thread-self: the worker thread is in the namespace; the process's
		// main thread is not.
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var names []string
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || f[0] != "Tcp:" {
				continue
			}
			if names == nil {
				names = f
				continue
			}
			for i, name := range names {
				if name == "RetransSegs" && i < len(f) {
					n, err = strconv.ParseUint(f[i], 10, 64)
					return err
				}
			}
		}
		return errors.New("no Tcp RetransSegs in /proc/net/snmp")
	})
	if err != nil {
		t.Fatalf("reading the client's TCP retransmissions: %v", err)
	}
	return n
}

// withPayload returns an IPv4 packet with header hdr (20 bytes), protocol
// proto and payload p; the kernel fills in the total length and checksum.
func withPayload(hdr []byte, proto byte, p []byte) []byte {
	b := append(append([]byte(nil), hdr...), p...)
	b[9] = proto
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	return b
}

// udpDatagram builds an IPv4 UDP datagram with a correct checksum.
func udpDatagram(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, payload []byte) []byte {
	b := make([]byte, 28+len(payload))
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8] = 64
	b[9] = 17
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], ^onesSum(b[:20], 0))
	u := b[20:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	pseudo := uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:])) +
		uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:])) + 17 + uint32(len(u))
	binary.BigEndian.PutUint16(u[6:], ^onesSum(u, pseudo))
	return b
}

// peakRSS reads VmHWM of this process.
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err.Error()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

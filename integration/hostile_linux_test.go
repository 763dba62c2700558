//go:build linux

package integration

import (
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Hostile traffic through a real TUN while a well-behaved client keeps
// connecting: random payloads, truncated headers, bad checksums, IP
// fragments, SYN floods from one and from many addresses, and a UDP flood to
// many ports. Every flood is bounded in count and time. The good client's
// connections must all succeed and the counters must account for the junk.
func TestHostileTraffic(t *testing.T) {
	requireRoot(t)
	seed := testSeed(t, 9)
	h, cl := tunEnv{}.start(t, seed)
	be := startTCPBackend(t, "127.0.0.1", nameServer("ok"))
	h.addService("web", "10.96.0.10", v1.ProtocolTCP, 80, false, be.addr)
	nsc := cl.(*nsClient)

	var fd int
	if err := nsc.run(func() (err error) {
		fd, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_RAW, syscall.IPPROTO_RAW)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	svc := netip.MustParseAddr("10.96.0.10")
	send := func(pkt []byte) {
		var dst syscall.SockaddrInet4
		copy(dst.Addr[:], pkt[16:20])
		_ = syscall.Sendto(fd, pkt, 0, &dst)
	}

	r := rand.New(rand.NewPCG(seed, seed))
	floods := []struct {
		name  string
		count int
		make  func(i int) []byte
	}{
		{"random payloads", 3000, func(i int) []byte {
			b := tcpSegment(tunClient4.Addr(), uint16(20000+i%1000), svc, 80, 0, r.Uint32(), r.Uint32())
			p := make([]byte, 20+r.IntN(200))
			for j := range p {
				p[j] = byte(r.Uint32())
			}
			return withPayload(b[:20], byte(1+r.IntN(255)), p)
		}},
		{"truncated TCP headers", 2000, func(i int) []byte {
			b := tcpSegment(tunClient4.Addr(), uint16(30000+i%1000), svc, 80, flagACK, 1, 1)
			return withPayload(b[:20], 6, b[20:20+r.IntN(19)])
		}},
		{"bad TCP checksums", 2000, func(i int) []byte {
			b := tcpSegment(tunClient4.Addr(), uint16(31000+i%1000), svc, 80, 0x02, r.Uint32(), 0)
			b[36] ^= 0xff
			return b
		}},
		{"IP fragments", 2000, func(i int) []byte {
			b := tcpSegment(tunClient4.Addr(), uint16(32000+i%1000), svc, 80, 0x02, r.Uint32(), 0)
			binary.BigEndian.PutUint16(b[6:], 0x2000) // more fragments
			return b
		}},
		{"SYN flood from one address", 3000, func(i int) []byte {
			return tcpSegment(netip.MustParseAddr("192.0.2.200"), uint16(1024+i), svc, 80, 0x02, r.Uint32(), 0)
		}},
		{"SYN flood from many addresses", 3000, func(i int) []byte {
			src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
			return tcpSegment(src, uint16(1024+i%50000), svc, 80, 0x02, r.Uint32(), 0)
		}},
		{"UDP flood to many ports", 3000, func(i int) []byte {
			return udpDatagram(tunClient4.Addr(), uint16(40000+i%1000), svc, uint16(1+i%5000), []byte("x"))
		}},
	}

	// The floods are interleaved, so that every kind is sent even if the
	// time bound cuts the run short on a slow machine.
	sent := make([]int, len(floods))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the hostile sender
		defer wg.Done()
		deadline := time.Now().Add(20 * time.Second)
		for i := 0; ; i++ {
			more := false
			for k, f := range floods {
				if i >= f.count {
					continue
				}
				more = true
				if time.Now().After(deadline) {
					return
				}
				send(f.make(i))
				sent[k]++
			}
			if !more {
				return
			}
			if i%4 == 3 {
				// Paced (about 28,000 packets/s) so that most of it reaches
				// the proxy rather than overflowing the TUN's queue.
				time.Sleep(time.Millisecond)
			}
		}
	}()

	// The well-behaved client, at the same time.
	good, bad := 0, 0
	var firstErr error
	for i := 0; i < 300; i++ {
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
	st, ct := h.st.Stats(), h.ct.Stats()
	t.Logf("good client: %d ok, %d failed (first error %v)", good, bad, firstErr)
	t.Logf("gate: in %d, invalid %d, accepted %d, rejected %d, in-flight limited %d; conntrack invalid by reason %v",
		st.PacketsIn, st.InvalidIn, st.Accepted, st.Rejected, st.InFlightLimited, ct.Invalid)
	t.Logf("peak RSS of the test process: %s", peakRSS())
	if bad != 0 {
		t.Fatalf("%d of the good client's connections failed during the floods", bad)
	}
	junk, total := 0, 0
	for k, f := range floods {
		t.Logf("%s: %d sent", f.name, sent[k])
		total += sent[k]
		if k < 4 { // the four kinds of malformed packets
			junk += sent[k]
		}
	}
	// What the TUN's queue dropped never reached the gate; of what did, at
	// least half the malformed share must be counted INVALID.
	seen := float64(st.PacketsIn) / float64(total)
	t.Logf("the gate saw %.0f%% of the %d packets sent (the rest overflowed the TUN queue)", 100*min(seen, 1), total)
	if float64(st.InvalidIn) < float64(junk)*min(seen, 1)/2 {
		t.Errorf("only %d packets counted INVALID of about %.0f malformed ones that reached the gate", st.InvalidIn, float64(junk)*min(seen, 1))
	}
	if udp := sent[len(sent)-1]; udp > 0 && st.Rejected == 0 {
		t.Errorf("the UDP flood to ports without a service (%d datagrams) was not rejected", udp)
	}
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

package integration

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/userproxy/userproxy/netstack"
)

// env is where a scenario's client lives: start builds a fresh rig and
// returns a client that reaches it.
type env interface {
	start(t testing.TB, seed uint64) (*rig, client)
}

// client is the scenario's view of its client host.
type client interface {
	dial(network, addr string) (net.Conn, error)
	// listenPacket opens an unconnected UDP socket ("udp4" or "udp6").
	listenPacket(network string) (net.PacketConn, error)
	// inject sends a raw IPv4 packet from the client side.
	inject(pkt []byte) error
	// addr4 is the client's IPv4 address.
	addr4() netip.Addr
}

// inProcess is the env of the in-memory link: clients dial through the
// stack's in-process client; raw packets enter through the memory link.
type inProcess struct{}

func (inProcess) start(t testing.TB, seed uint64) (*rig, client) {
	link := netstack.NewMemoryLink(0, 1024)
	r := newRig(t, &link.Link, seed)
	return r, &inProcessClient{r: r, link: link}
}

type inProcessClient struct {
	r    *rig
	link *netstack.MemoryLink
}

func (c *inProcessClient) dial(network, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.r.st.DialContext(ctx, network, addr)
}

func (c *inProcessClient) listenPacket(network string) (net.PacketConn, error) {
	return c.r.st.ListenPacket(network)
}

func (c *inProcessClient) inject(pkt []byte) error { c.link.Inject(pkt); return nil }

func (c *inProcessClient) addr4() netip.Addr { return netip.MustParseAddr("192.0.2.1") }

func TestInProcess(t *testing.T) { runScenarios(t, inProcess{}) }

// TCP flags, for tcpSegment.
const (
	flagSYN = 0x02
	flagACK = 0x10
)

// tcpSegment builds an IPv4 TCP segment without payload, with correct
// checksums.
func tcpSegment(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags byte, seq, ack uint32) []byte {
	b := make([]byte, 40)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], 40)
	b[8] = 64
	b[9] = 6
	s, d := src.As4(), dst.As4()
	copy(b[12:16], s[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], ^onesSum(b[:20], 0))
	tcp := b[20:]
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], dport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 5 << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 65535)
	pseudo := uint32(binary.BigEndian.Uint16(s[0:])) + uint32(binary.BigEndian.Uint16(s[2:])) +
		uint32(binary.BigEndian.Uint16(d[0:])) + uint32(binary.BigEndian.Uint16(d[2:])) + 6 + uint32(len(tcp))
	binary.BigEndian.PutUint16(tcp[16:], ^onesSum(tcp, pseudo))
	return b
}

// onesSum is the Internet checksum's ones'-complement sum of b plus acc.
func onesSum(b []byte, acc uint32) uint16 {
	for len(b) >= 2 {
		acc += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		acc += uint32(b[0]) << 8
	}
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

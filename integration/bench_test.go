package integration

import (
	"io"
	"net"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The datapath benchmarks: the same client work over three paths, side by
// side in one run:
//   - direct: the client dials the endpoint on loopback itself (the kernel's
//     own cost, no proxy at all);
//   - inprocess: the stack's in-process client through the gate and proxy;
//   - tun: a client in a namespace, through a real TUN device (root).
// See BENCHMARKS.md for figures and the kernel iptables path.

type benchPath struct {
	name string
	// dialer returns how the client reaches addr: the service address for
	// the proxied paths, the endpoint for direct.
	setup func(b *testing.B, endpoint net.Addr) (dial func() (net.Conn, error))
}

var benchPaths = []benchPath{
	{"direct", func(b *testing.B, ep net.Addr) func() (net.Conn, error) {
		return func() (net.Conn, error) { return net.Dial("tcp", ep.String()) }
	}},
	{"inprocess", func(b *testing.B, ep net.Addr) func() (net.Conn, error) {
		return proxiedDial(b, inProcess{}, ep)
	}},
	{"tun", func(b *testing.B, ep net.Addr) func() (net.Conn, error) {
		return proxiedDial(b, tunEnv{}, ep)
	}},
}

func proxiedDial(b *testing.B, e env, ep net.Addr) func() (net.Conn, error) {
	h, cl := e.start(b, 1)
	h.addService("bench", "10.96.0.100", v1.ProtocolTCP, 80, false, ep.(*net.TCPAddr).AddrPort())
	return func() (net.Conn, error) { return cl.dial("tcp", "10.96.0.100:80") }
}

// BenchmarkTCPBulk: one connection, the client sends 64 KiB per operation;
// the endpoint discards. MB/s is the throughput.
func BenchmarkTCPBulk(b *testing.B) {
	for _, p := range benchPaths {
		b.Run(p.name, func(b *testing.B) {
			be := startTCPBackend(b, "127.0.0.1", func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
			dial := p.setup(b, be.ln.Addr())
			c, err := dial()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			buf := make([]byte, 64<<10)
			b.SetBytes(int64(len(buf)))
			b.ResetTimer()
			for range b.N {
				if _, err := c.Write(buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
		})
	}
}

// BenchmarkTCPConnect: per operation a new connection that sends 64 bytes,
// reads the 64-byte echo and closes; 64 clients at once. 1e9/(ns/op) is the
// connections per second.
func BenchmarkTCPConnect(b *testing.B) {
	for _, p := range benchPaths {
		b.Run(p.name, func(b *testing.B) {
			be := startTCPBackend(b, "127.0.0.1", func(c net.Conn) {
				buf := make([]byte, 64)
				if _, err := io.ReadFull(c, buf); err == nil {
					_, _ = c.Write(buf)
				}
			})
			dial := p.setup(b, be.ln.Addr())
			b.SetParallelism(32) // with GOMAXPROCS 2: 64 clients
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 64)
				for pb.Next() {
					c, err := dial()
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := c.Write(buf); err != nil {
						b.Error(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Error(err)
					}
					c.Close()
				}
			})
		})
	}
}

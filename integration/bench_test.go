package integration

import (
	"io"
	"net"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// The datapath benchmarks: the same client work over four paths, side by
// side in one run:
//   - direct: the client dials the endpoint on loopback itself (no service
//     address, no NAT: the floor);
//   - kernel: a client in a namespace dials the service address and the
//     kernel's iptables DNAT (kube-proxy's rule for one endpoint) sends it to
//     the endpoint on loopback (root; kernelPath in bench_kernel_linux_test.go);
//   - inprocess: the stack's in-process client through the gate and proxy;
//   - tun: a client in a namespace, through a real TUN device (root).
// See BENCHMARKS.md for the figures.

type benchPath struct {
	name string
	// setup starts an endpoint serving each connection with serve and
	// returns how a client connects to it through the path.
	setup func(b *testing.B, serve func(net.Conn)) (dial func() (net.Conn, error))
}

var benchPaths = []benchPath{
	{"direct", func(b *testing.B, serve func(net.Conn)) func() (net.Conn, error) {
		ep := startTCPBackend(b, "127.0.0.1", serve).addr.String()
		return func() (net.Conn, error) { return net.Dial("tcp", ep) }
	}},
	{"kernel", kernelPath},
	{"inprocess", func(b *testing.B, serve func(net.Conn)) func() (net.Conn, error) {
		return proxiedDial(b, inProcess{}, serve)
	}},
	{"tun", func(b *testing.B, serve func(net.Conn)) func() (net.Conn, error) {
		return proxiedDial(b, tunEnv{}, serve)
	}},
}

func proxiedDial(b *testing.B, e env, serve func(net.Conn)) func() (net.Conn, error) {
	h, cl := e.start(b, 1)
	be := startTCPBackend(b, "127.0.0.1", serve)
	h.addService("bench", "10.96.0.100", v1.ProtocolTCP, 80, false, be.addr)
	return func() (net.Conn, error) { return cl.dial("tcp", "10.96.0.100:80") }
}

// BenchmarkTCPBulk: one connection, the client sends 64 KiB per operation;
// the endpoint discards. MB/s is the throughput.
func BenchmarkTCPBulk(b *testing.B) {
	for _, p := range benchPaths {
		b.Run(p.name, func(b *testing.B) {
			dial := p.setup(b, func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
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
			dial := p.setup(b, func(c net.Conn) {
				buf := make([]byte, 64)
				if _, err := io.ReadFull(c, buf); err == nil {
					_, _ = c.Write(buf)
				}
			})
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

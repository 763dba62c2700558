package kubeapi_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// BenchmarkPortForward: the cost of reaching a pod through the API server
// (--dial-via apiserver: source/kube's PortForwarder, the real
// kube-apiserver, the fake kubelet, then the backend) next to dialling the
// backend directly, on loopback: connect (set up a flow and read the
// backend's first byte, the tunnel already open) and one stream's
// throughput each way. The TUN and the proxy are the same on both ways and
// left out. Figures in BENCHMARKS.md.
func BenchmarkPortForward(b *testing.B) {
	c, cs := startCluster(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	be := startBenchBackend(b)
	podsBehindKubelet(b, cs, "bench-node", "default", 8080, map[string]string{"bench": be}, netip.MustParseAddr("198.51.100.40"), kubeapi.KubeletConfig{})
	pf, err := kube.NewPortForwarder(kube.PortForwardConfig{REST: c.RESTConfig(c.AdminToken())})
	if err != nil {
		b.Fatal(err)
	}
	defer pf.Close()
	ways := []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"direct", func() (net.Conn, error) { return net.Dial("tcp", be) }},
		{"apiserver", func() (net.Conn, error) {
			return pf.DialPod(ctx, service.PodRef{Namespace: "default", Name: "bench"}, 8080)
		}},
	}
	warm, err := ways[1].dial() // the tunnel stays open (Idle 30 s)
	if err != nil {
		b.Fatal(err)
	}
	defer warm.Close()
	for _, w := range ways {
		b.Run("connect/"+w.name, func(b *testing.B) {
			for b.Loop() {
				conn, err := w.dial()
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.WriteString(conn, "hello\n"); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(conn, make([]byte, 3)); err != nil {
					b.Fatal(err)
				}
				conn.Close()
			}
		})
		for _, dir := range []string{"up", "down"} {
			b.Run("stream-"+dir+"/"+w.name, func(b *testing.B) {
				const size = 64 << 20
				b.SetBytes(size)
				buf := make([]byte, 256<<10)
				for b.Loop() {
					conn, err := w.dial()
					if err != nil {
						b.Fatal(err)
					}
					if _, err := io.WriteString(conn, dir+" "+strconv.Itoa(size)+"\n"); err != nil {
						b.Fatal(err)
					}
					if dir == "up" {
						for sent := 0; sent < size; sent += len(buf) {
							if _, err := conn.Write(buf); err != nil {
								b.Fatal(err)
							}
						}
						if _, err := io.ReadFull(conn, make([]byte, 3)); err != nil { // "ok\n"
							b.Fatal(err)
						}
					} else if n, err := io.CopyBuffer(io.Discard, io.LimitReader(conn, size), buf); err != nil || n != size {
						b.Fatalf("read %d of %d: %v", n, size, err)
					}
					conn.Close()
				}
			})
		}
	}
}

// startBenchBackend serves the benchmark's requests on loopback: "hello"
// is answered "hi\n"; "up N" reads N bytes and answers "ok\n"; "down N"
// sends N bytes.
func startBenchBackend(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { // bench backend acceptor
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // bench backend connection
				defer c.Close()
				r := bufio.NewReader(c)
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				f := strings.Fields(line)
				switch {
				case len(f) == 1:
					_, _ = io.WriteString(c, "hi\n")
				case len(f) == 2 && f[0] == "up":
					n, _ := strconv.ParseInt(f[1], 10, 64)
					if _, err := io.CopyN(io.Discard, r, n); err == nil {
						_, _ = io.WriteString(c, "ok\n")
					}
				case len(f) == 2 && f[0] == "down":
					n, _ := strconv.ParseInt(f[1], 10, 64)
					_, _ = io.CopyN(c, zeros{}, n)
				}
			}()
		}
	}()
	b.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

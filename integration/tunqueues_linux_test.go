//go:build linux

package integration

import (
	"fmt"
	"io"
	"net"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/userproxy/userproxy/netstack"
)

// A multi-queue TUN spreads flows over its readers and keeps each flow on
// one: the kernel reads a flow into the queue its last packet was written on
// (tun_flow_update and tun_automq_select_queue in drivers/net/tun.c), and
// the link writes each flow on the queue of its symmetric hash. Before the
// link chose the queue by flow, the translator wrote every flow on queue 0,
// so every flow after its SYN was read by queue 0's reader alone.
//
// On a real TUN with two queues, through the translated path and gVisor's:
// one flow's 400 exchanges are read on one queue (all but its handshake);
// 64 flows' exchanges are read on both, each with at least a quarter.
func TestTUNQueues(t *testing.T) {
	requireRoot(t)
	for _, translated := range []bool{true, false} {
		name := "gvisor"
		if translated {
			name = "translated"
		}
		t.Run(name, func(t *testing.T) {
			if translated && !translateTCP {
				t.Skip("USERPROXY_TCP_TRANSLATE=0")
			}
			ns, nsName := newNetNS(t)
			var link *netstack.Link
			if err := inNS(ns, func() (err error) {
				link, err = setUpTUN(netstack.TUNOptions{Name: "upx0", MTU: tunMTU, Queues: 2})
				return err
			}); err != nil {
				t.Fatalf("setting up the TUN in namespace %s: %v", nsName, err)
			}
			saved := translateTCP
			translateTCP = translated
			h := func() *rig {
				defer func() { translateTCP = saved }()
				return newRig(t, link, testSeed(t, 48))
			}()
			c := &nsClient{ns: ns, work: make(chan func())}
			startWorkers(t, c)
			be := startTCPBackend(t, "127.0.0.1", func(c net.Conn) { _, _ = io.Copy(c, c) })
			h.addService("queues", "10.96.0.48", v1.ProtocolTCP, 80, false, be.addr)

			reads := func() []uint64 { return h.st.Stats().LinkQueueReads }
			exchange := func(conn net.Conn, n int) error {
				buf := make([]byte, 64)
				for i := range n {
					if _, err := conn.Write(buf); err != nil {
						return fmt.Errorf("exchange %d: %w", i, err)
					}
					if _, err := io.ReadFull(conn, buf); err != nil {
						return fmt.Errorf("exchange %d: %w", i, err)
					}
				}
				return nil
			}

			// One flow: every exchange on one queue.
			conn, err := c.dial("tcp", "10.96.0.48:80")
			if err != nil {
				t.Fatal(err)
			}
			before := reads()
			if err := exchange(conn, 400); err != nil {
				t.Fatal(err)
			}
			conn.Close()
			after := reads()
			if len(after) != 2 {
				t.Fatalf("%d queue counters, want 2", len(after))
			}
			d0, d1 := after[0]-before[0], after[1]-before[1]
			if least := min(d0, d1); least > 4 || d0+d1 < 400 {
				t.Errorf("one flow's 400 exchanges read %d packets on queue 0 and %d on queue 1: want all on one", d0, d1)
			}

			// 64 flows: both queues read a share.
			conns := make([]net.Conn, 64)
			for i := range conns {
				if conns[i], err = c.dial("tcp", "10.96.0.48:80"); err != nil {
					t.Fatal(err)
				}
				defer conns[i].Close()
			}
			before = reads()
			var wg sync.WaitGroup
			errs := make(chan error, len(conns))
			for _, conn := range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- exchange(conn, 50)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			after = reads()
			d0, d1 = after[0]-before[0], after[1]-before[1]
			t.Logf("64 flows x 50 exchanges: %d packets read on queue 0, %d on queue 1", d0, d1)
			if total := d0 + d1; d0 < total/4 || d1 < total/4 {
				t.Errorf("64 flows read %d packets on queue 0 and %d on queue 1: want each at least a quarter", d0, d1)
			}
		})
	}
}

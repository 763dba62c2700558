//go:build linux

package integration

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

// A translated flow that cannot move costs backed-off timers, not a poll:
//
//   - download, the client stopped reading: its window is shut and the
//     endpoint's bytes wait; only window probes wake the flow, each twice as
//     late as the last (RFC 9293 3.8.6.1, Linux's tcp_probe_timer);
//   - upload, the endpoint stopped reading: the socket fills; the flow
//     waits for the socket to drain (POLLOUT) and the client probes;
//   - upload, the endpoint reads slowly: the window stays too short to send
//     into between its reads; the looks at it back off to a second and
//     come a step sooner after one that found room (they were a 1 ms poll).
//
// Each flow's timer wake-ups are counted over 10 s once it has stalled,
// less the held ACKs that expired (one per lone client segment: traffic,
// not polling); the bounds (20 for a stall, 3 per endpoint read for the slow
// reader) are far below the old figures (50 window probes; a 1 ms poll's
// 10,000).
func TestTranslatedStallWakeups(t *testing.T) {
	if !translateTCP {
		t.Skip("gVisor's TCP carries the flows (USERPROXY_TCP_TRANSLATE=0): no translated timers to count")
	}
	h, cl := tunEnv{}.start(t, testSeed(t, 31))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// The download's endpoint writes until its writes block for 30 s.
	down := startTCPBackend(t, "127.0.0.1", func(c net.Conn) {
		buf := make([]byte, 64<<10)
		for {
			_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	})
	// The uploads' endpoints read 1 MiB, then stop reading, or read 4 KiB
	// every 250 ms, until the test ends or the client closes.
	reader := func(pause time.Duration) func(c net.Conn) {
		return func(c net.Conn) {
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.CopyN(io.Discard, c, 1<<20); err != nil {
				return
			}
			buf := make([]byte, 4<<10)
			for {
				select {
				case <-stop:
					return
				case <-time.After(pause):
				}
				if pause > time.Minute {
					continue
				}
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}
	}
	stalled := startTCPBackend(t, "127.0.0.1", reader(time.Hour))
	slow := startTCPBackend(t, "127.0.0.1", reader(250*time.Millisecond))
	t.Cleanup(func() { close(stop); wg.Wait() }) // before the backends' own cleanups, which wait for their handlers
	h.addService("down", "10.96.0.41", v1.ProtocolTCP, 80, false, down.addr)
	h.addService("stalled", "10.96.0.42", v1.ProtocolTCP, 80, false, stalled.addr)
	h.addService("slow", "10.96.0.43", v1.ProtocolTCP, 80, false, slow.addr)
	upload := func(c net.Conn) {
		wg.Add(1)
		go func() { // writes until its writes block for 30 s or the test ends
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for {
				_ = c.SetWriteDeadline(time.Now().Add(30 * time.Second))
				if _, err := c.Write(buf); err != nil {
					return
				}
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}

	for _, tc := range []struct {
		name  string
		svc   string
		run   func(c net.Conn)
		bound uint64
	}{
		{"download, client not reading", "10.96.0.41", func(c net.Conn) {
			_, _ = io.CopyN(io.Discard, c, 1<<20) // then it stops reading
		}, 20},
		{"upload, endpoint not reading", "10.96.0.42", upload, 20},
		// 40 reads in 10 s, each a window update's worth: at most 3 looks a read.
		{"upload, endpoint reading slowly", "10.96.0.43", upload, 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := cl.dial("tcp", tc.svc+":80")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			tc.run(c)
			time.Sleep(3 * time.Second) // the flow stalls
			s0 := h.st.Stats()
			time.Sleep(10 * time.Second)
			s1 := h.st.Stats()
			rto, ack, held := s1.TimerRTOFires-s0.TimerRTOFires, s1.TimerAckFires-s0.TimerAckFires, s1.AcksExpired-s0.AcksExpired
			t.Logf("%s: %d retransmission/probe and %d ACK timer wake-ups in 10 s, %d of them held ACKs expiring", tc.name, rto, ack, held)
			if rto+ack-held > tc.bound {
				t.Errorf("%d timer wake-ups in 10 s, held ACKs aside; want at most %d", rto+ack-held, tc.bound)
			}
		})
	}
}

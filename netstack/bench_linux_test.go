package netstack

import (
	"os"
	"testing"

	"github.com/userproxy/userproxy/conntrack"
)

// BenchmarkUDPReply is the gate's write of one 64-byte UDP reply of an
// established flow to a TUN endpoint whose descriptor is /dev/null, so that
// what is timed is the proxy's side of the write (the headers built, the
// reply classified, the writev made): "PacketBuffer" hands the endpoint a
// PacketBuffer, as every link gets; "bytes" writes the datagram from a
// pooled buffer (bytesWriter, the Linux TUN).
func BenchmarkUDPReply(b *testing.B) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer null.Close()
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if r := ct.Classify(udpDatagram(client, service, []byte("q")), conntrack.Original); r.Verdict != conntrack.New || ct.Confirm(&r) != nil {
		b.Fatalf("the flow's first datagram: %v", r.Verdict)
	}
	payload := make([]byte, 64)
	for _, bytes := range []bool{false, true} {
		name := "PacketBuffer"
		if bytes {
			name = "bytes"
		}
		b.Run(name, func(b *testing.B) {
			e := newTUNEndpoint([]tunQueue{{fd: int(null.Fd())}}, 1500, true)
			g := &gate{child: e, ct: ct, counters: &gateCounters{}, resets: &resetting{ct: ct}}
			g.Endpoint.Init(e, g)
			if bytes {
				g.bytesOut = e
			}
			r := &UDPRequest{client: client, svc: service, out: g}
			b.ReportAllocs()
			for b.Loop() {
				if done, err := r.replyDirect(payload); !done || err != nil {
					b.Fatalf("replyDirect: %v %v", done, err)
				}
			}
			if g.counters.invalidOut.Load() != 0 {
				b.Fatal("replies classified INVALID")
			}
		})
	}
}

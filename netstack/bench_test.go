package netstack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// BenchmarkGateInbound runs packets through the gate's inbound path up to
// its verdict, without gVisor: "invalid" is a stray ACK and "unsupported" a
// ping, both dropped by the gate with no allocation (the fast path every
// packet that is not a fragment takes up to delivery); "reassembled" is a
// 2000-byte UDP datagram in two fragments, reassembled and then dropped by
// admission, per op.
func BenchmarkGateInbound(b *testing.B) {
	drop := func(conntrack.Tuple) Decision { return Drop }
	udp := udpDatagram(client, service, make([]byte, 2000))
	for _, bc := range []struct {
		name string
		pkts [][]byte
	}{
		{"invalid/tcp4", [][]byte{tcpPacket(client, service, header.TCPFlagAck, 1000, 2000)}},
		{"unsupported/icmp4", [][]byte{icmpEcho(client.Addr(), service.Addr())}},
		{"reassembled/udp4", fragmentDatagram(udp, 1480)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			st, _, _ := newTestStack(b, drop)
			g := st.gates[linkNIC]
			pbs := make([]*stack.PacketBuffer, len(bc.pkts))
			for i, p := range bc.pkts {
				pbs[i] = newPacket(p, header.IPv4ProtocolNumber)
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, pb := range pbs {
					g.DeliverNetworkPacket(header.IPv4ProtocolNumber, pb)
				}
			}
			for _, pb := range pbs {
				pb.DecRef()
			}
		})
	}
}

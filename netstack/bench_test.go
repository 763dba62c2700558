package netstack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
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

// BenchmarkGateOutboundClassify is the gate's classification of one of
// gVisor's 64,000-byte (GSO) segments of an established flow on its way out:
// "whole" copies the packet and classifies it (the gate before appendHead),
// "head" copies its headers and classifies them with the packet's size.
func BenchmarkGateOutboundClassify(b *testing.B) {
	ct, err := conntrack.NewTable(conntrack.Config{})
	if err != nil {
		b.Fatal(err)
	}
	syn := tcpPacket(client, service, header.TCPFlagSyn, 1000, 0)
	if r := ct.Classify(syn, conntrack.Original); r.Verdict != conntrack.New || ct.Confirm(&r) != nil {
		b.Fatalf("SYN: %v", r.Verdict)
	}
	if r := ct.Classify(tcpPacket(service, client, header.TCPFlagSyn|header.TCPFlagAck, 5000, 1001), conntrack.Reply); r.Verdict != conntrack.Established {
		b.Fatalf("SYN-ACK: %v", r.Verdict)
	}
	pkt := gvisorSegment(service, client, 5001, 1001, nil, make([]byte, 64000))
	defer pkt.DecRef()
	buf := make([]byte, 0, maxPacket)
	for _, bc := range []struct {
		name     string
		classify func() conntrack.Result
	}{
		{"whole", func() conntrack.Result { return ct.Classify(appendPacket(buf, pkt), conntrack.Reply) }},
		{"head", func() conntrack.Result { return ct.ClassifyHead(appendHead(buf, pkt), pkt.Size(), conntrack.Reply) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(pkt.Size()))
			for b.Loop() {
				if r := bc.classify(); r.Verdict != conntrack.Established {
					b.Fatalf("%v %v", r.Verdict, r.Reason)
				}
			}
		})
	}
}

// BenchmarkInboundSegment makes the PacketBuffer of a 64,000-byte TCP
// segment read from the link and then does to its network header what
// gVisor's IPv4 HandlePacket does (a view held while the header is sliced
// again): "one chunk" is newPacket, whose 64 KiB chunk PullUp then copies;
// "split" is newInboundPacket, whose headers' chunk it copies instead.
func BenchmarkInboundSegment(b *testing.B) {
	seg := tcpData(client, service, 1001, 5001, make([]byte, 64000))
	for _, bc := range []struct {
		name string
		make func([]byte, tcpip.NetworkProtocolNumber) *stack.PacketBuffer
	}{{"one chunk", newPacket}, {"split", newInboundPacket}} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(seg)))
			b.ReportAllocs()
			for b.Loop() {
				pkt := bc.make(seg, header.IPv4ProtocolNumber)
				if _, ok := pkt.NetworkHeader().Consume(header.IPv4MinimumSize); !ok {
					b.Fatal("Consume")
				}
				held := pkt.NetworkHeader().View()
				_ = pkt.NetworkHeader().Slice()
				held.Release()
				pkt.DecRef()
			}
		})
	}
}

package netstack

// Fragments on the way in: the gate's reassembly step (step 1 in gate.go).
//
//  1. The gate copies every packet from the link into a pooled buffer and
//     tests it with conntrack.IsFragment, which costs a few loads and no
//     allocation; only fragments come here.
//  2. The fragment goes to the Stack's conntrack.Reassembler, shared by its
//     gates. Held or dropped (counted there, by reason): the gate is done
//     with it, and gVisor never sees a fragment.
//  3. A completed datagram is written into a second pooled buffer and
//     wrapped in a fresh PacketBuffer; the gate classifies it and, when it
//     is admitted, delivers it to gVisor as one packet, whatever the link's
//     MTU: gVisor's network endpoints check an inbound packet's lengths
//     against its own headers, never against the MTU (ipv4 and ipv6
//     HandlePacket; the MTU is read only to write and to forward).
//
// On the way out, gVisor fragments what it writes beyond the link's MTU
// itself (writePacketPostRouting in network/ipv4 and network/ipv6, one
// WritePacket per fragment), so the gate's outbound classification sees
// those fragments one by one.

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/conntrack"
)

// reassemble hands the fragment b, a copy of pkt (of network protocol
// proto), to the reassembler. It
// returns the packet for the gate to go on with: pkt and b themselves when
// the reassembler does not take b (malformed headers, which classification
// refuses with their own reason), or the completed datagram, as a new
// PacketBuffer and its bytes; release frees them after delivery. It returns
// a nil packet when the fragment was held or dropped.
func (g *gate) reassemble(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer, b []byte) (*stack.PacketBuffer, []byte, func()) {
	ob := packetPool.Get().(*[]byte)
	whole, v, _ := g.defrag.Add(b, (*ob)[:0])
	switch v {
	case conntrack.NotFragment:
		packetPool.Put(ob)
		return pkt, b, func() {}
	case conntrack.FragmentComplete:
		np := newPacket(whole, proto)
		return np, whole, func() {
			np.DecRef()
			packetPool.Put(ob)
		}
	}
	packetPool.Put(ob)
	return nil, nil, nil
}

package conntrack

// UDP connection tracking, after Linux net/netfilter/nf_conntrack_proto_udp.c
// (nf_conntrack_udp_packet). There is no state, only a choice of timeout.
//
// 1. A flow that has seen a reply and is more than udpStreamAge old is a
//    stream: the stream timeout, and ASSURED (off the early-drop list).
// 2. Anything else gets the short timeout.
// 3. Account the datagram and restart the timeout (refresh, table.go).

// udpStreamAge is how old a replied UDP flow must be to count as a stream
// (the kernel's stream_ts, 2 s after the first packet).
const udpStreamAge = int64(2e9)

// udpPacket is nf_conntrack_udp_packet: a flow that has seen a reply and is
// more than 2 s old is a stream, gets the stream timeout and becomes ASSURED;
// anything else gets the short timeout.
func (t *Table) udpPacket(sh *shard, e *entry, dir Direction, s *segment, now int64) {
	timeout := t.udpTO
	if e.status&StatusSeenReply != 0 && now > e.created+udpStreamAge {
		timeout = t.streamTO
		if e.status&StatusAssured == 0 {
			t.setAssured(sh, e)
		}
	}
	t.refresh(sh, e, dir, s, now, timeout)
}

// Package translate is userproxy's TCP toward the client for translated
// flows: a TCP whose sequence space follows the endpoint socket's queues
// (passt's design, its tcp.c), so that a flow holds no byte buffers of its
// own. The client's in-order bytes are written to the endpoint socket and
// acknowledged as far as the socket took them; the endpoint's bytes are
// sent from the socket's receive queue (MSG_PEEK from SO_PEEK_OFF) and
// dropped from it (MSG_TRUNC) once the client acknowledges them.
//
// Who calls it: netstack's gate hands each admitted SYN and each later
// segment of a translated flow to a Flow (New, Input), and the flow's
// owner (netstack's TranslatedFlow, run by proxy) arms the timers the
// flow asks for (State) and reports the socket's readiness (Readable,
// Writable). The endpoint socket is the EndpointSocket interface; proxy
// implements it over a host socket, the tests over memory.
//
// What it promises, every pod on a node being its peer:
//   - No input ends the process or corrupts a byte: every option value and
//     length is bounded (the send MSS at least 48 bytes, as Linux's
//     tcp_min_snd_mss after CVE-2019-11479), the socket gets a prefix of the
//     client's stream, the client gets only the endpoint's bytes at their
//     sequence numbers, and what a flow keeps is bounded per flow and per
//     stack (sack.go). FuzzFlow checks these.
//   - The RFCs, section by section beside the code: RFC 9293 3.10.7.4
//     (segment arrival), 3.8.6 (windows, silly window avoidance, zero-window
//     probes); RFC 6298 (RTT estimation and the RTO, with Linux's 200 ms
//     floor and 120 s cap); RFC 9438 (CUBIC congestion control, Linux's
//     default), RFC 5681 and RFC 6582 (slow start from an initial window
//     of 10, RFC 6928; NewReno's recovery without SACK); RFC
//     2018 and RFC 6675 (SACK both ways); RFC 8985 (RACK-TLP: with SACK, a
//     loss is found by send times, a lost retransmission too, and a tail
//     loss by a probe); RFC 6937 (proportional rate reduction in a
//     recovery); RFC 2883 and RFC 3522 (D-SACK and Eifel undo of a
//     spurious reduction, as Linux's undo_retrans and retrans_stamp); RFC 7323
//     (window scaling, timestamps, PAWS); RFC 5961 (RST, SYN and ACK
//     checks, challenge ACKs); RFC 1122 4.2.3.5 and Linux's tcp_retries2
//     (a flow given up after 924.6 s of unanswered retransmissions).
//
// What it leaves out, and why:
//   - No queue of segments: the bytes live in the socket, which can be read
//     from any offset. With SACK a flow keeps a record per segment in flight
//     (its range and send time, sentlog.go) and sends again only what RACK
//     takes for lost; without SACK, and after a timeout, retransmission is
//     a rewind to the acknowledged point that skips what the client SACKed.
//   - RACK's reordering window is at least as long as the reordering seen
//     was late (reoDelay), where RFC 8985 caps it at the round trip: on a
//     path whose reordering outlasts its round trip that cap sends every
//     reordered segment twice.
//   - No HyStart (RFC 9406, on in Linux): slow start ends at the first
//     loss.
//   - CUBIC whatever the host's default congestion control: no BBR, which
//     a node may run (net.ipv4.tcp_congestion_control) and which keeps its
//     pace under random loss and reordering where CUBIC cuts its window.
//   - SACK blocks ride on pure ACKs, not on data segments: data segments
//     keep one header length, which host GSO needs.
//   - No ECN, no TCP Fast Open, no urgent data (the endpoint socket takes it
//     inline, RFC 6093 5), no window-update ACK clocking beyond RFC 9293's.
//   - A FIN past a gap is not kept: the client sends it again.
//   - Challenge ACKs are not rate-limited (Linux's tcp_challenge_ack_limit):
//     each answers one segment of the client's own, so they amplify
//     nothing, and the flow's tuple is the client's own.
//   - ICMP "fragmentation needed" and "packet too big" are not applied to a
//     translated flow's MSS: the client's announced MSS bounds its
//     segments, and the path between the TUN and a pod is one host's.
//   - No keep-alives toward the client: conntrack's timeouts end an idle
//     flow, as the kernel's do on kube-proxy's path.
//
// It imports nothing of userproxy's and no gVisor: it writes its own
// IPv4/IPv6 and TCP headers (seg.go).
package translate

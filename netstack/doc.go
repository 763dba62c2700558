// Package netstack owns the packet side of userproxy: the TUN device (or an
// in-memory link in tests), gVisor's network stack, the conntrack gate that
// sees every packet in both directions before gVisor does (reassembling
// inbound fragments first: defrag.go), the TCP and UDP forwarders, the UDP
// bypass (bypass.go: a bound UDP flow's client datagrams
// go from the gate straight to the handler), the handoff of translated TCP
// flows to package translate (translate.go: SYNs, segments, their timers),
// and DialContext for in-process clients.
//
// Callers: proxy (sets the flow handler and the admission function), cmd
// (builds the stack).
//
// It is the only userproxy package that imports gVisor, and gVisor types
// never leave it. Of userproxy it imports only conntrack and translate; it
// decides nothing about services (it asks the admission function).
package netstack

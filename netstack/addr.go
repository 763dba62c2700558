package netstack

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// toAddr converts a gVisor address to a netip.Addr.
func toAddr(a tcpip.Address) netip.Addr {
	switch a.Len() {
	case 4:
		return netip.AddrFrom4(a.As4())
	case 16:
		return netip.AddrFrom16(a.As16())
	}
	return netip.Addr{}
}

// fromAddr converts a netip.Addr to a gVisor address and its network
// protocol; IPv4-mapped IPv6 addresses become IPv4.
func fromAddr(a netip.Addr) (tcpip.Address, tcpip.NetworkProtocolNumber) {
	a = a.Unmap()
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4()), header.IPv4ProtocolNumber
	}
	return tcpip.AddrFrom16(a.As16()), header.IPv6ProtocolNumber
}

func fullAddr(ap netip.AddrPort) (tcpip.FullAddress, tcpip.NetworkProtocolNumber) {
	a, proto := fromAddr(ap.Addr())
	return tcpip.FullAddress{Addr: a, Port: ap.Port()}, proto
}

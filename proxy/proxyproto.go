package proxy

// The PROXY protocol header: what an endpoint of a Service annotated
// userproxy.io/proxy-protocol reads first on each connection, so that it
// learns the client's address and port and the address the client dialled
// (the ClusterIP or NodePort address and port) although the proxy dials it
// from the host. The format is HAProxy's, doc/proxy-protocol.txt:
//
//   - v1, section 2.1 "Human-readable header format": one US-ASCII line,
//     "PROXY TCP4|TCP6 <src addr> <dst addr> <src port> <dst port>\r\n".
//     v1 names only TCP4, TCP6 and UNKNOWN, and the spec asks a sender that
//     opens the connection not to send UNKNOWN, so v1 on a UDP port is
//     refused (ProxyProtocol.Check at configuration time, AppendProxyHeader
//     on the datapath) rather than sent as a line the endpoint cannot use.
//   - v2, section 2.2 "Binary header format": the 12-byte signature, the
//     version and command (2, PROXY), the family and transport (TCP or UDP
//     over IPv4 or IPv6), the length of the address block, then the source
//     and destination addresses and ports in network byte order. No TLVs.
//
// Both addresses are unmapped first (::ffff:10.0.0.1 is 10.0.0.1), so a v4
// flow seen through an IPv6 socket still says TCP4 or IPv4. Two addresses of
// different families after that cannot come from one flow here; the header
// is refused (ErrProxyHeader) rather than guessed at. An IPv6 zone is not
// part of either format and is dropped.
//
// The datapath sends the header first on each TCP endpoint connection
// (sendProxyHeader, for TUN and NodePort flows) and, under v2, in front of
// every datagram of a UDP flow (udp.go, nodeport.go).

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"

	"github.com/userproxy/userproxy/service"
)

// AnnotationProxyProtocol is the Service annotation that asks for a PROXY
// protocol header on each endpoint connection (service.Port.ProxyProtocol
// carries its value); its values are those ParseProxyProtocol accepts.
const AnnotationProxyProtocol = service.AnnotationProxyProtocol

// ProxyProtocol is the PROXY protocol version a Service asks for. The zero
// value sends no header.
type ProxyProtocol uint8

// The PROXY protocol versions.
const (
	ProxyProtocolNone ProxyProtocol = iota
	ProxyProtocolV1
	ProxyProtocolV2
)

// ErrProxyProtocol is returned by ParseProxyProtocol for a value that is
// not a version, and by Check for a version the protocol cannot carry.
var ErrProxyProtocol = errors.New("bad proxy protocol")

// ErrProxyHeader is returned by AppendProxyHeader for a flow it cannot
// describe: an invalid address, addresses of two families, a protocol other
// than TCP and UDP, or UDP under v1.
var ErrProxyHeader = errors.New("cannot encode proxy protocol header")

// ParseProxyProtocol parses the annotation's value: "" (none), "v1" or
// "v2". The error wraps ErrProxyProtocol and names the value; the caller
// adds which Service it came from.
func ParseProxyProtocol(s string) (ProxyProtocol, error) {
	switch s {
	case "":
		return ProxyProtocolNone, nil
	case "v1":
		return ProxyProtocolV1, nil
	case "v2":
		return ProxyProtocolV2, nil
	}
	return ProxyProtocolNone, fmt.Errorf("%s %q: %w (accepted: \"v1\", \"v2\", or empty for none)",
		AnnotationProxyProtocol, s, ErrProxyProtocol)
}

// String returns "none", "v1", "v2", or "ProxyProtocol(N)".
func (v ProxyProtocol) String() string {
	switch v {
	case ProxyProtocolNone:
		return "none"
	case ProxyProtocolV1:
		return "v1"
	case ProxyProtocolV2:
		return "v2"
	}
	return "ProxyProtocol(" + strconv.Itoa(int(v)) + ")"
}

// Check reports whether version v can describe flows of proto, for use when
// a Service's ports are configured: every version carries TCP, only v2
// carries UDP (v1 has no UDP line). The error wraps ErrProxyProtocol.
func (v ProxyProtocol) Check(proto service.Protocol) error {
	switch {
	case v > ProxyProtocolV2:
		return fmt.Errorf("%v: %w: unknown version", v, ErrProxyProtocol)
	case v == ProxyProtocolNone || proto == service.TCP:
		return nil
	case v == ProxyProtocolV2 && proto == service.UDP:
		return nil
	case proto == service.UDP:
		return fmt.Errorf("%s %v on a UDP port: %w: v1 describes only TCP; use v2", AnnotationProxyProtocol, v, ErrProxyProtocol)
	}
	return fmt.Errorf("%s %v on a %v port: %w", AnnotationProxyProtocol, v, proto, ErrProxyProtocol)
}

// proxyHeaderMax is the longest header AppendProxyHeader writes: the v1
// TCP6 line with two 39-character addresses and two 5-digit ports (section
// 2.1 counts 104 bytes). The longest v2 header, IPv6, is 16 + 36 bytes.
const proxyHeaderMax = 104

// proxyV2Signature opens every v2 header (section 2.2).
var proxyV2Signature = [12]byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

// AppendProxyHeader appends to b the version v header for a flow of proto
// from src (the client) to dst (the address and port the client used) and
// returns the extended slice. It allocates nothing when b has room for the
// header (104 bytes always suffice). ProxyProtocolNone appends nothing. A
// flow the header cannot describe (see ErrProxyHeader) returns b unchanged
// and an error wrapping ErrProxyHeader.
func AppendProxyHeader(b []byte, v ProxyProtocol, proto service.Protocol, src, dst netip.AddrPort) ([]byte, error) {
	if v == ProxyProtocolNone {
		return b, nil
	}
	sa, da := src.Addr().Unmap().WithZone(""), dst.Addr().Unmap().WithZone("")
	switch {
	case !sa.IsValid() || !da.IsValid():
		return b, fmt.Errorf("%w: invalid address in %v -> %v", ErrProxyHeader, src, dst)
	case sa.Is4() != da.Is4():
		return b, fmt.Errorf("%w: %v -> %v mixes IPv4 and IPv6", ErrProxyHeader, src, dst)
	case proto != service.TCP && proto != service.UDP:
		return b, fmt.Errorf("%w: protocol %v", ErrProxyHeader, proto)
	}
	switch v {
	case ProxyProtocolV1:
		if proto != service.TCP {
			return b, fmt.Errorf("%w: v1 has no line for %v", ErrProxyHeader, proto)
		}
		return appendProxyV1(b, sa, da, src.Port(), dst.Port()), nil
	case ProxyProtocolV2:
		return appendProxyV2(b, proto, sa, da, src.Port(), dst.Port()), nil
	}
	return b, fmt.Errorf("%w: %v", ErrProxyHeader, v)
}

// appendProxyV1 appends the section 2.1 line for TCP. netip writes IPv4 as
// four decimal numbers without leading zeros and IPv6 in RFC 5952's form
// (lower-case hex, one "::" for the longest run of zero groups), which is
// the canonical form the spec asks for; the addresses are already unmapped,
// so an IPv6 address here is never printed with a dotted tail.
func appendProxyV1(b []byte, sa, da netip.Addr, sp, dp uint16) []byte {
	if sa.Is4() {
		b = append(b, "PROXY TCP4 "...)
	} else {
		b = append(b, "PROXY TCP6 "...)
	}
	b = sa.AppendTo(b)
	b = append(b, ' ')
	b = da.AppendTo(b)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(sp), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(dp), 10)
	return append(b, '\r', '\n')
}

// appendProxyV2 appends the section 2.2 header: signature, 0x21 (version 2,
// PROXY), the family (0x1 IPv4, 0x2 IPv6) and transport (0x1 STREAM, 0x2
// DGRAM) nibbles, the address block's length, then source address,
// destination address, source port, destination port.
func appendProxyV2(b []byte, proto service.Protocol, sa, da netip.Addr, sp, dp uint16) []byte {
	fam, n := byte(0x10), 12 // 2*4 address bytes + 2*2 port bytes
	if !sa.Is4() {
		fam, n = 0x20, 36 // 2*16 + 2*2
	}
	if proto == service.UDP {
		fam |= 0x2
	} else {
		fam |= 0x1
	}
	b = append(b, proxyV2Signature[:]...)
	b = append(b, 0x21, fam, byte(n>>8), byte(n))
	if sa.Is4() {
		s, d := sa.As4(), da.As4()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	} else {
		s, d := sa.As16(), da.As16()
		b = append(b, s[:]...)
		b = append(b, d[:]...)
	}
	return append(b, byte(sp>>8), byte(sp), byte(dp>>8), byte(dp))
}

// writeProxyHeader writes the version v header for the flow to conn, the
// endpoint connection, in one Write, before any of the client's bytes: the
// spec asks that the header leave at once, and every header fits in one
// segment. It sets no deadline of its own; the caller's deadline on conn
// bounds it, and a timeout comes back wrapped, so errors.Is(err,
// os.ErrDeadlineExceeded) and net.Error's Timeout still see it. Errors name
// the version and the endpoint; a flow AppendProxyHeader refuses writes
// nothing. ProxyProtocolNone writes nothing. It is for stream connections:
// on UDP a header written alone would be a datagram of its own, so the UDP
// relay must put AppendProxyHeader's bytes in front of a datagram's payload
// instead. The buffer escapes through the interface call: one small
// allocation per endpoint connection, none per byte spliced.
func writeProxyHeader(conn net.Conn, v ProxyProtocol, proto service.Protocol, src, dst netip.AddrPort) error {
	if v == ProxyProtocolNone {
		return nil
	}
	var buf [proxyHeaderMax]byte
	hdr, err := AppendProxyHeader(buf[:0], v, proto, src, dst)
	if err != nil {
		return fmt.Errorf("proxy protocol %v header to %v: %w", v, conn.RemoteAddr(), err)
	}
	n, err := conn.Write(hdr)
	if err == nil && n != len(hdr) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("proxy protocol %v header to %v: wrote %d of %d bytes: %w", v, conn.RemoteAddr(), n, len(hdr), err)
	}
	return nil
}

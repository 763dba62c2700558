package netstack

import (
	"context"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"

	"github.com/userproxy/userproxy/conntrack"
)

// udpBypassHandler echoes the first datagram through its socket, then
// registers a bypass that hands later datagrams to got (and echoes them),
// and after stopAfter of them unregisters and reads the next from the
// socket again.
type udpBypassHandler struct {
	got       chan string
	fromConn  chan string
	stopped   chan struct{} // closed once the bypass is unregistered
	stopAfter int
}

func (udpBypassHandler) HandleTCP(r *TCPRequest) { r.Refuse() }

func (h udpBypassHandler) HandleUDP(r *UDPRequest) {
	defer r.Conn.Close()
	buf := make([]byte, 100)
	n, err := r.Conn.Read(buf)
	if err != nil {
		return
	}
	h.fromConn <- string(buf[:n])
	_, _ = r.Conn.Write(buf[:n])
	seen := make(chan struct{}, h.stopAfter)
	stop := r.Forward(func(p []byte) {
		h.got <- string(p) // copied: the buffer is reused
		_, _ = r.Conn.Write(p)
		seen <- struct{}{}
	})
	for range h.stopAfter {
		<-seen
	}
	stop()
	stop() // twice is harmless
	close(h.stopped)
	_ = r.Conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err = r.Conn.Read(buf); err == nil {
		h.fromConn <- string(buf[:n])
		_, _ = r.Conn.Write(buf[:n])
	}
}

func TestUDPBypass(t *testing.T) {
	st, _, _ := newTestStack(t, accept)
	h := udpBypassHandler{got: make(chan string, 10), fromConn: make(chan string, 10), stopped: make(chan struct{}), stopAfter: 2}
	st.SetFlowHandler(h)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := st.DialContext(ctx, "udp", "10.96.0.53:53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 100)
	for i, want := range []struct{ msg, via string }{{"one", "conn"}, {"two", "bypass"}, {"three", "bypass"}, {"four", "conn"}} {
		if want.msg == "four" {
			select { // the handler unregisters after the second bypassed datagram
			case <-h.stopped:
			case <-time.After(5 * time.Second):
				t.Fatal("the handler did not unregister its bypass")
			}
		}
		if _, err := c.Write([]byte(want.msg)); err != nil {
			t.Fatal(err)
		}
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != want.msg {
			t.Fatalf("datagram %d: echo %q, %v; want %q", i, buf[:n], err, want.msg)
		}
		var got string
		ch := h.fromConn
		if want.via == "bypass" {
			ch = h.got
		}
		select {
		case got = <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("datagram %q did not arrive via %s", want.msg, want.via)
		}
		if got != want.msg {
			t.Fatalf("via %s: %q, want %q", want.via, got, want.msg)
		}
	}
	if st.bypass.n.Load() != 0 {
		t.Errorf("%d flows still registered after stop", st.bypass.n.Load())
	}
}

func TestUDPPayload(t *testing.T) {
	v4 := func(ihl int, payload string, ulenDelta int) []byte {
		b := make([]byte, ihl+8+len(payload))
		b[0], b[9] = byte(0x40|ihl/4), 17
		binary.BigEndian.PutUint16(b[ihl+4:], uint16(8+len(payload)+ulenDelta))
		copy(b[ihl+8:], payload)
		return b
	}
	v6 := func(next byte, payload string) []byte {
		b := make([]byte, 48+len(payload))
		b[0], b[6] = 0x60, next
		binary.BigEndian.PutUint16(b[44:], uint16(8+len(payload)))
		copy(b[48:], payload)
		return b
	}
	padded := append(v4(20, "pad", 0), 0, 0, 0) // link padding after the datagram
	for _, tc := range []struct {
		name string
		b    []byte
		want string
		ok   bool
	}{
		{"ipv4", v4(20, "hello", 0), "hello", true},
		{"ipv4 with options", v4(24, "opts", 0), "opts", true},
		{"ipv4 padded", padded, "pad", true},
		{"ipv4 empty payload", v4(20, "", 0), "", true},
		{"ipv6", v6(17, "six"), "six", true},
		{"ipv6 extension header", v6(0, "hop"), "", false},
		{"udp length past the packet", v4(20, "x", 5), "", false},
		{"udp length under 8", v4(20, "x", -2), "", false},
		{"tcp", func() []byte { b := v4(20, "t", 0); b[9] = 6; return b }(), "", false},
		{"truncated", v4(20, "abc", 0)[:25], "", false},
	} {
		got, ok := udpPayload(tc.b)
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("%s: %q, %v; want %q, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// TestUDPBypassTakeNoAllocs: take runs for every established UDP datagram.
func TestUDPBypassTakeNoAllocs(t *testing.T) {
	var u udpBypass
	client, svc := netip.MustParseAddrPort("192.0.2.7:40000"), netip.MustParseAddrPort("10.96.0.53:53")
	r := &UDPRequest{client: client, svc: svc, bypass: &u}
	var got int
	stop := r.Forward(func(p []byte) { got += len(p) })
	defer stop()
	pkt := make([]byte, 20+8+4)
	pkt[0], pkt[9] = 0x45, 17
	binary.BigEndian.PutUint16(pkt[24:], 12)
	tuple := r.Tuple()
	if !u.take(tuple, pkt) || got != 4 {
		t.Fatalf("take: got %d bytes, want the 4-byte payload", got)
	}
	other := conntrack.MakeTuple(conntrack.UDP, netip.MustParseAddrPort("192.0.2.8:40000"), svc)
	if u.take(other, pkt) {
		t.Fatal("an unregistered flow was taken")
	}
	if a := testing.AllocsPerRun(100, func() { u.take(tuple, pkt) }); a != 0 {
		t.Errorf("take allocates %.1f times per datagram, want 0", a)
	}
}

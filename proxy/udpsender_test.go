package proxy

import (
	"net"
	"sync/atomic"
	"testing"
	"time"
)

// TestUDPSenderNoAllocs: the gate calls send once per datagram of a bound
// UDP flow, so it must deliver the datagram and count its bytes without
// allocating.
func TestUDPSenderNoAllocs(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	c, err := net.Dial("udp4", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var sent atomic.Uint64
	s := newUDPSender(c, &sent)
	if s == nil {
		t.Fatal("no sender for a kernel UDP socket")
	}
	s.send([]byte("hello"))
	buf := make([]byte, 16)
	_ = pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, _, err := pc.ReadFrom(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("endpoint got %q, %v", buf[:n], err)
	}
	if sent.Load() != 5 {
		t.Fatalf("counted %d bytes, want 5", sent.Load())
	}
	p := []byte("0123456789")
	if a := testing.AllocsPerRun(100, func() { s.send(p) }); a != 0 {
		t.Errorf("send allocates %.1f times per datagram, want 0", a)
	}
	c.Close()
	before := sent.Load()
	s.send(p) // a closed socket: no panic, nothing counted
	if sent.Load() != before {
		t.Errorf("a send on a closed socket was counted")
	}
}

package netstack

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// The virtio-net header of each packet gVisor writes (struct virtio_net_hdr
// in include/uapi/linux/virtio_net.h, in the host's byte order): nothing for
// a packet gVisor finished; for a host-GSO TCP segment, the partial checksum
// to complete from the TCP header on, and the MSS to cut at once the segment
// is longer than one MSS. TestTUNOffloadsPodClient (integration) has the
// kernel read them.
func TestTUNVirtioHeader(t *testing.T) {
	gso4 := stack.GSO{Type: stack.GSOTCPv4, NeedsCsum: true, CsumOffset: 16, MSS: 1460, L3HdrLen: 20, MaxSize: tunGSOMaxSize}
	gso6 := gso4
	gso6.Type, gso6.L3HdrLen = stack.GSOTCPv6, 40
	type fields struct{ flags, gsoType, hdrLen, gsoSize, csumStart, csumOffset int }
	for _, tc := range []struct {
		name    string
		gso     stack.GSO
		l3, l4  int
		payload int
		want    fields
	}{
		{"finished by gVisor", stack.GSO{}, 20, 20, 3000, fields{}},
		{"IPv4 super-segment", gso4, 20, 32, 3000, fields{1, 1, 52, 1460, 20, 16}},
		{"IPv6 super-segment", gso6, 40, 32, 64000, fields{1, 4, 72, 1460, 40, 16}},
		{"IPv4 segment of one MSS", gso4, 20, 20, 1460, fields{1, 0, 0, 0, 20, 16}},
		{"pure ACK", gso4, 20, 32, 0, fields{1, 0, 0, 0, 20, 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{ReserveHeaderBytes: tc.l3 + tc.l4, Payload: buffer.MakeWithData(make([]byte, tc.payload))})
			defer pkt.DecRef()
			pkt.TransportHeader().Push(tc.l4)
			pkt.NetworkHeader().Push(tc.l3)
			pkt.NetworkProtocolNumber = header.IPv4ProtocolNumber
			pkt.GSOOptions = tc.gso
			e := newTUNEndpoint(nil, 65520, true)
			var h [vnetHdrLen]byte
			e.header(&h, pkt)
			u := binary.NativeEndian.Uint16
			got := fields{int(h[0]), int(h[1]), int(u(h[2:])), int(u(h[4:])), int(u(h[6:])), int(u(h[8:]))}
			if got != tc.want {
				t.Errorf("header %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A device without virtio-net headers offers gVisor no GSO, so its packets
// are MTU-sized and finished (checksummed) by gVisor.
func TestTUNPlainModeOffersNoGSO(t *testing.T) {
	e := newTUNEndpoint(nil, 1500, false)
	if e.SupportedGSO() != stack.GSONotSupported || e.GSOMaxSize() != 0 {
		t.Errorf("plain mode: SupportedGSO %v, GSOMaxSize %d; want none", e.SupportedGSO(), e.GSOMaxSize())
	}
	e = newTUNEndpoint(nil, 1500, true)
	if e.SupportedGSO() != stack.HostGSOSupported || e.GSOMaxSize() != tunGSOMaxSize {
		t.Errorf("offload mode: SupportedGSO %v, GSOMaxSize %d; want host GSO of %d", e.SupportedGSO(), e.GSOMaxSize(), tunGSOMaxSize)
	}
}

// A packet in more views than writev takes at once (gVisor merges queued
// writes into one segment, a view each) is written whole, after its header.
func TestTUNWriteManyViews(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	e := newTUNEndpoint([]tunQueue{{fd: fds[1]}}, 65520, true)
	// Views that share one chunk, as gVisor's clones do, are never merged.
	const views, size = 1100, 7 // more than UIO_MAXIOV (1024)
	var want []byte
	for i := range views {
		want = append(want, bytes.Repeat([]byte{byte(i)}, size)...)
	}
	base := buffer.NewViewWithData(want)
	defer base.Release()
	var payload buffer.Buffer
	for i := range views {
		v := base.Clone()
		v.TrimFront(i * size)
		v.CapLength(size)
		if err := payload.Append(v); err != nil {
			t.Fatal(err)
		}
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: payload})
	defer pkt.DecRef()
	if n := len(pkt.AsSlices()); n <= 1024 {
		t.Fatalf("the packet is in %d views; the test wants more than UIO_MAXIOV", n)
	}
	var pl stack.PacketBufferList
	pl.PushBack(pkt.IncRef())
	defer pl.DecRef()
	if n, err := e.WritePackets(pl); n != 1 || err != nil {
		t.Fatalf("WritePackets: %d, %v", n, err)
	}
	got := make([]byte, 2*len(want))
	n, err := unix.Read(fds[0], got)
	if err != nil {
		t.Fatal(err)
	}
	if n != vnetHdrLen+len(want) || !bytes.Equal(got[vnetHdrLen:n], want) {
		t.Fatalf("read %d bytes, want the %d-byte header and the %d-byte packet", n, vnetHdrLen, len(want))
	}
}

// Every packet read is delivered with its own bytes, whatever reads come
// after it, from one byte to 64 KiB, with and without virtio-net headers. A
// SOCK_SEQPACKET pair stands in for the device: one read, one packet. With
// headers, a GSO type the endpoint did not offer is dropped and counted.
func TestTUNReadKeepsDeliveredPackets(t *testing.T) {
	sizes := []int{60, 1500, 32<<10 - 1, 32 << 10, 40000, 100, 64 << 10, 52, 32<<10 + 1, 1}
	for _, vnet := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "virtio-net headers"}[vnet], func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fds[1])
			if err := unix.SetNonblock(fds[1], false); err != nil { // the writer waits for the reader
				t.Fatal(err)
			}
			f := os.NewFile(uintptr(fds[0]), "tun")
			defer f.Close()
			e := newTUNEndpoint([]tunQueue{{f: f, fd: fds[0]}}, 65520, vnet)
			d := &recordingDispatcher{got: make(chan *stack.PacketBuffer, len(sizes)+1)}
			e.Attach(d)
			defer e.Wait()
			defer e.Attach(nil)

			var want [][]byte
			send := func(gsoType byte, p []byte) {
				t.Helper()
				msg := p
				if vnet {
					msg = append([]byte{0, gsoType, 0, 0, 0, 0, 0, 0, 0, 0}, p...)
				}
				if _, err := unix.Write(fds[1], msg); err != nil {
					t.Fatalf("writing a %d-byte packet: %v", len(p), err)
				}
			}
			for i, size := range sizes {
				p := bytes.Repeat([]byte{byte(0x45 + i)}, size)
				p[0] = 0x45 // IPv4, as ipProtocol reads it
				want = append(want, p)
				send(unix.VIRTIO_NET_HDR_GSO_NONE, p)
			}
			if vnet {
				send(unix.VIRTIO_NET_HDR_GSO_UDP_L4, bytes.Repeat([]byte{0x45}, 2000)) // dropped
			}
			// One more packet marks the end: every packet before it was read.
			end := bytes.Repeat([]byte{0x45}, 64)
			send(unix.VIRTIO_NET_HDR_GSO_NONE, end)

			var got []*stack.PacketBuffer
			defer func() {
				for _, pkt := range got {
					pkt.DecRef()
				}
			}()
			timeout := time.After(10 * time.Second)
			for len(got) < len(sizes)+1 {
				select {
				case pkt := <-d.got:
					got = append(got, pkt)
				case <-timeout:
					t.Fatalf("%d of %d packets delivered", len(got), len(sizes)+1)
				}
			}
			for i, size := range sizes {
				b := got[i].ToView()
				if !bytes.Equal(b.AsSlice(), want[i]) {
					t.Errorf("packet %d (%d bytes): delivered %d bytes that differ from those written", i, size, b.Size())
				}
				b.Release()
			}
			if b := got[len(sizes)].ToView(); !bytes.Equal(b.AsSlice(), end) {
				t.Errorf("the last packet: %d bytes, not the %d written", b.Size(), len(end))
			}
			wantUnsupported := uint64(0)
			if vnet {
				wantUnsupported = 1
			}
			if n := e.unsupported.Load(); n != wantUnsupported {
				t.Errorf("%d packets counted unsupported, want %d", n, wantUnsupported)
			}
		})
	}
}

// recordingDispatcher keeps a reference to each packet delivered to it.
type recordingDispatcher struct{ got chan *stack.PacketBuffer }

func (d *recordingDispatcher) DeliverNetworkPacket(_ tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	d.got <- pkt.IncRef()
}

func (*recordingDispatcher) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// bytesRecorder is a dispatcher that takes bytes, as the gate does: it
// copies each packet handed to DeliverBytes, and fails the test for any
// PacketBuffer.
type bytesRecorder struct {
	t       *testing.T
	got     chan []byte
	trusted chan bool
}

func (d *bytesRecorder) DeliverBytes(_ tcpip.NetworkProtocolNumber, b []byte, trusted bool) {
	d.got <- bytes.Clone(b)
	d.trusted <- trusted
}

func (d *bytesRecorder) DeliverNetworkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {
	d.t.Error("a PacketBuffer was made for a dispatcher that takes bytes")
}

func (*bytesRecorder) DeliverLinkPacket(tcpip.NetworkProtocolNumber, *stack.PacketBuffer) {}

// A dispatcher that takes bytes (the gate) gets each packet's bytes and
// whether the kernel vouched for its checksums (the virtio-net header's
// NEEDS_CSUM or DATA_VALID), and no PacketBuffer.
func TestTUNReadHandsBytesToTheGate(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "tun")
	defer f.Close()
	e := newTUNEndpoint([]tunQueue{{f: f, fd: fds[0]}}, 65520, true)
	d := &bytesRecorder{t: t, got: make(chan []byte, 3), trusted: make(chan bool, 3)}
	e.Attach(d)
	defer e.Wait()
	defer e.Attach(nil)
	for i, flags := range []byte{0, unix.VIRTIO_NET_HDR_F_NEEDS_CSUM, unix.VIRTIO_NET_HDR_F_DATA_VALID} {
		p := bytes.Repeat([]byte{byte(i + 1)}, 100+i)
		p[0] = 0x45
		if _, err := unix.Write(fds[1], append([]byte{flags, 0, 0, 0, 0, 0, 0, 0, 0, 0}, p...)); err != nil {
			t.Fatal(err)
		}
		select {
		case b := <-d.got:
			if !bytes.Equal(b, p) {
				t.Errorf("packet %d: %d bytes delivered that differ from the %d written", i, len(b), len(p))
			}
			if trusted := <-d.trusted; trusted != (flags != 0) {
				t.Errorf("packet %d (header flags %#x): trusted %v", i, flags, trusted)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("packet %d not delivered", i)
		}
	}
}

// WriteBytes writes a finished packet behind an all-zero virtio-net header
// (nothing to complete, nothing to cut), or alone in the plain mode; a
// pipe stands in for the device, and a closed endpoint writes nothing.
func TestTUNWriteBytes(t *testing.T) {
	for _, vnet := range []bool{true, false} {
		var fds [2]int
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
			t.Fatal(err)
		}
		e := newTUNEndpoint([]tunQueue{{fd: fds[1]}}, 1500, vnet)
		want := udpDatagram(netip.MustParseAddrPort("10.96.0.53:53"), netip.MustParseAddrPort("192.0.2.7:40000"), []byte("answer"))
		if err := e.WriteBytes(want); err != nil {
			t.Fatalf("vnet %v: WriteBytes: %v", vnet, err)
		}
		got := make([]byte, 2048)
		n, err := unix.Read(fds[0], got)
		if err != nil {
			t.Fatal(err)
		}
		hdr := 0
		if vnet {
			hdr = vnetHdrLen
		}
		if n != hdr+len(want) || !bytes.Equal(got[:hdr], make([]byte, hdr)) || !bytes.Equal(got[hdr:n], want) {
			t.Fatalf("vnet %v: read % x, want a zero header of %d bytes and the packet % x", vnet, got[:n], hdr, want)
		}
		e.closed.Store(true)
		if err := e.WriteBytes(want); err == nil {
			t.Fatalf("vnet %v: WriteBytes on a closed endpoint succeeded", vnet)
		}
		if n, err := unix.Read(fds[0], got); n > 0 || err != unix.EAGAIN {
			t.Fatalf("vnet %v: a closed endpoint wrote %d bytes (%v)", vnet, n, err)
		}
		unix.Close(fds[0])
		unix.Close(fds[1])
	}
}

package netstack

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
)

// Link is where the stack's packets come from and go to: a TUN device
// (OpenTUN), any packet device read and written as an io.ReadWriteCloser
// (NewDeviceLink), or an in-memory queue for tests (NewMemoryLink). Packets on
// a Link are raw IPv4 or IPv6 packets without a link-layer header.
//
// A Link is handed to New, which owns it from then on: Stack.Close closes it.
type Link struct {
	ep    stack.LinkEndpoint
	close func() error
	name  string

	// Offload is set when the link is a TUN device opened with virtio-net
	// headers and TCP offloads; OffloadRefused then holds why a device that
	// was asked for them is in the plain mode instead.
	Offload        bool
	OffloadRefused error

	unsupported *atomic.Uint64 // packets the link dropped unread (Stats.LinkUnsupported)
	// reads counts the packets each queue handed over (Stats.LinkQueueReads);
	// nil for links without queues.
	reads []queueCounter
	// stopReads, when set, stops the link's readers and waits for them;
	// Stack.Close calls it before gVisor's Wait, which holds the stack's
	// lock while it waits for the link: a reader inside gVisor then could
	// wait for that lock forever.
	stopReads func()
}

// queueCounter counts one queue's packets, on a cache line of its own: each
// queue's reader adds to its own without sharing a line with another's.
type queueCounter struct {
	n atomic.Uint64
	_ [56]byte
}

// queueReads returns the packets each queue handed over, or nil.
func (l *Link) queueReads() []uint64 {
	if l.reads == nil {
		return nil
	}
	out := make([]uint64, len(l.reads))
	for i := range l.reads {
		out[i] = l.reads[i].n.Load()
	}
	return out
}

// Close closes a link that was never handed to New (New's Stack closes the
// links it owns).
func (l *Link) Close() error {
	if l.close == nil {
		return nil
	}
	return l.close()
}

// MTU returns the link's MTU.
func (l *Link) MTU() uint32 { return l.ep.MTU() }

// Name returns the device name, or a description for in-memory links.
func (l *Link) Name() string { return l.name }

// DefaultMTU is the MTU of links whose options leave it unset.
const DefaultMTU = 1500

// MemoryLink is an in-memory Link for tests: the test injects raw packets as
// if a client had sent them through the TUN, and reads what the stack writes
// back. It behaves like the TUN device from the stack's side.
type MemoryLink struct {
	Link
	ch *channel.Endpoint
}

// NewMemoryLink returns an in-memory link whose outbound queue holds up to
// queue packets (further writes are dropped, as a full TUN queue drops).
func NewMemoryLink(mtu uint32, queue int) *MemoryLink {
	if mtu == 0 {
		mtu = DefaultMTU
	}
	ch := channel.New(queue, mtu, "")
	return &MemoryLink{
		Link: Link{ep: ch, name: "memory", close: func() error { ch.Close(); return nil }},
		ch:   ch,
	}
}

// Inject delivers a raw IP packet to the stack, as if read from the device.
// The packet's bytes are copied. Packets that are neither IPv4 nor IPv6 are
// discarded, as a TUN reader would.
func (m *MemoryLink) Inject(pkt []byte) {
	proto, ok := ipProtocol(pkt)
	if !ok {
		return
	}
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(pkt)})
	m.ch.InjectInbound(proto, pb)
	pb.DecRef()
}

// Read returns the next packet the stack wrote to the link, waiting until one
// arrives or ctx is done (then it returns nil).
func (m *MemoryLink) Read(ctx context.Context) []byte {
	pb := m.ch.ReadContext(ctx)
	if pb == nil {
		return nil
	}
	defer pb.DecRef()
	return pb.ToView().AsSlice()
}

// ipProtocol returns the network protocol of a raw packet from its version
// nibble.
func ipProtocol(pkt []byte) (tcpip.NetworkProtocolNumber, bool) {
	if len(pkt) == 0 {
		return 0, false
	}
	switch header.IPVersion(pkt) {
	case header.IPv4Version:
		return header.IPv4ProtocolNumber, true
	case header.IPv6Version:
		return header.IPv6ProtocolNumber, true
	}
	return 0, false
}

// NewDeviceLink makes a Link of a packet device read and written one raw IP
// packet per Read and Write call (a TUN device opened with water, on any
// platform). Two goroutines pump packets: "device reader" (device -> stack)
// and "device writer" (stack -> device). Close stops both and closes dev.
//
// On Linux, OpenTUN uses gVisor's fdbased endpoint instead, which reads
// batches with readv and is faster.
func NewDeviceLink(dev io.ReadWriteCloser, name string, mtu uint32) *Link {
	if mtu == 0 {
		mtu = DefaultMTU
	}
	ch := channel.New(512, mtu, "")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // device reader
		defer wg.Done()
		buf := make([]byte, mtu+64)
		for {
			n, err := dev.Read(buf)
			if err != nil {
				return
			}
			proto, ok := ipProtocol(buf[:n])
			if !ok {
				continue
			}
			pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(buf[:n])})
			ch.InjectInbound(proto, pb)
			pb.DecRef()
		}
	}()
	go func() { // device writer
		defer wg.Done()
		buf := make([]byte, 0, mtu+64)
		for {
			pb := ch.ReadContext(ctx)
			if pb == nil {
				return
			}
			buf = appendPacket(buf[:0], pb)
			pb.DecRef()
			if _, err := dev.Write(buf); err != nil && errors.Is(err, io.ErrClosedPipe) {
				return
			}
		}
	}()
	var once sync.Once
	var closeErr error
	return &Link{ep: ch, name: name, close: func() error {
		once.Do(func() {
			cancel()
			closeErr = dev.Close()
			ch.Close()
			wg.Wait()
		})
		return closeErr
	}}
}

// appendPacket appends the whole packet (headers and payload) to b without
// allocating when b has room.
func appendPacket(b []byte, pkt *stack.PacketBuffer) []byte {
	vl, off := pkt.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		s := v.AsSlice()
		if off >= len(s) {
			off -= len(s)
			continue
		}
		b = append(b, s[off:]...)
		off = 0
	}
	return b
}

// bytesDispatcher is a stack.NetworkDispatcher that also takes a packet as
// the bytes a link read, before any PacketBuffer is made of them (the
// gate). b is valid only during the call: the dispatcher copies what it
// keeps. trusted says the kernel vouched for the packet's checksums, what
// PacketBuffer.RXChecksumValidated says on the other path.
type bytesDispatcher interface {
	DeliverBytes(proto tcpip.NetworkProtocolNumber, b []byte, trusted bool)
}

// bytesWriter is a link endpoint that also writes a packet held in one
// slice, without a PacketBuffer (the Linux TUN): the gate writes the UDP
// replies it builds itself that way (udpreply.go). b is a whole IP packet
// whose checksums are final; the endpoint does not keep it. WriteBytes may
// be called concurrently with itself and with WritePackets, and fails with
// ErrClosedForSend once the endpoint is closed.
type bytesWriter interface {
	WriteBytes(b []byte) tcpip.Error
}

// segmentWriter is a bytesWriter that also writes a TCP segment whose
// checksum the kernel completes, cut at an MSS where it is longer (a TUN
// with virtio-net headers and TCP offloads): the translator's way out
// (translate.go). Offloads reports whether it can; b's checksum field holds
// the pseudo-header's sum, as Linux's CHECKSUM_PARTIAL.
type segmentWriter interface {
	Offloads() bool
	WriteSegment(b []byte, v6 bool, ipLen, hdrLen, mss int) tcpip.Error
}

package netstack

// The link endpoint of a Linux TUN device: one reader goroutine per queue,
// one write(2) per packet.
//
// Opened with virtio-net headers (IFF_VNET_HDR) and offloads (TUNSETOFFLOAD
// TUN_F_CSUM|TUN_F_TSO4|TUN_F_TSO6), every packet on the device is preceded by
// a struct virtio_net_hdr (include/uapi/linux/virtio_net.h), and the packets
// can be far larger than the path's MTU:
//
//   - In: the kernel no longer cuts a TCP super-packet (a pod's TSO send, a
//     GRO-merged burst) into MSS-sized segments before the TUN, nor sums its
//     checksum: it hands over up to 64 KiB at once with
//     VIRTIO_NET_HDR_F_NEEDS_CSUM. The gate then classifies the packet
//     without verifying its checksum, as the kernel's conntrack does for a
//     CHECKSUM_PARTIAL skb (nf_ip_checksum in net/netfilter/utils.c returns
//     valid for anything but CHECKSUM_NONE and CHECKSUM_COMPLETE), and gVisor
//     takes it as one segment, as Linux does after GRO.
//   - Out: gVisor's TCP builds segments of up to 64 KiB with host GSO and
//     leaves the checksum partial; the header tells the kernel the MSS to cut
//     them at (tun_get_user -> virtio_net_hdr_to_skb), and the kernel cuts
//     them only where it must: a veth to a pod takes the whole super-packet.
//
// A device or kernel that refuses the header or the offloads gets the plain
// mode: no header, one MTU-sized packet per read and write, checksums summed
// on both sides, as gVisor's fdbased endpoint did.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/userproxy/userproxy/internal/rawio"
)

// maxWriteViews is the most slices of one packet WritePackets hands to
// writev; a packet in more is copied into one buffer first.
const maxWriteViews = 64

// vnetHdrLen is the size of struct virtio_net_hdr, the TUN's default
// (TUNSETVNETHDRSZ unset).
const vnetHdrLen = 10

// tunGSOMaxSize is the largest packet the endpoint asks gVisor to build: the
// kernel's GSO_LEGACY_MAX_SIZE, the gso_max_size of a TUN device.
const tunGSOMaxSize = 65536

// tunOffloads are the offloads asked of the device: checksums and TCP
// segmentation both ways. UDP segmentation (TUN_F_USO4/6) is not asked
// for: gVisor's UDP neither sends nor takes super-datagrams, so the kernel
// cuts those before the TUN.
const tunOffloads = unix.TUN_F_CSUM | unix.TUN_F_TSO4 | unix.TUN_F_TSO6

// tunQueue is one queue of the device.
type tunQueue struct {
	f  *os.File // in the runtime poller; reads park there
	fd int      // the same descriptor, for writev
}

// tunEndpoint implements stack.LinkEndpoint over the queues of one device.
type tunEndpoint struct {
	queues []tunQueue
	reads  []queueCounter // packets read, by queue
	vnet   bool           // packets carry a virtio_net_hdr; host GSO out, super-packets in
	mtu    atomic.Uint32

	// unsupported counts packets dropped because their header asked for
	// something the endpoint did not offer (a GSO type other than TCP).
	unsupported atomic.Uint64

	mu         sync.Mutex // serializes Attach and SetOnCloseAction
	dispatcher atomic.Pointer[dispatcherBox]
	started    bool
	onClose    func()

	readers  sync.WaitGroup
	paused   bool // the readers are stopped for a handover (under mu; handover_linux.go)
	stopOnce sync.Once
	closed   atomic.Bool // the descriptors are closed (or closing): no more writes
}

// dispatcherBox holds the dispatcher, for one atomic load per packet, and
// the same dispatcher as a bytesDispatcher if it is one (the gate), found
// once at Attach rather than per packet.
type dispatcherBox struct {
	d     stack.NetworkDispatcher
	bytes bytesDispatcher
}

var _ stack.LinkEndpoint = (*tunEndpoint)(nil)
var _ stack.GSOEndpoint = (*tunEndpoint)(nil)
var _ bytesWriter = (*tunEndpoint)(nil)

func newTUNEndpoint(queues []tunQueue, mtu uint32, vnet bool) *tunEndpoint {
	e := &tunEndpoint{queues: queues, reads: make([]queueCounter, len(queues)), vnet: vnet}
	e.mtu.Store(mtu)
	return e
}

// MTU implements stack.LinkEndpoint.
func (e *tunEndpoint) MTU() uint32 { return e.mtu.Load() }

// SetMTU implements stack.LinkEndpoint.
func (e *tunEndpoint) SetMTU(mtu uint32) { e.mtu.Store(mtu) }

// MaxHeaderLength implements stack.LinkEndpoint: the virtio-net header goes
// in an iovec of its own, not in the packet.
func (*tunEndpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.LinkEndpoint: a TUN has none.
func (*tunEndpoint) LinkAddress() tcpip.LinkAddress { return "" }

// SetLinkAddress implements stack.LinkEndpoint.
func (*tunEndpoint) SetLinkAddress(tcpip.LinkAddress) {}

// Capabilities implements stack.LinkEndpoint. gVisor trusts the checksums of
// inbound packets because the gate has verified them, or the kernel vouched
// for them in the virtio-net header (see the top of the file).
// gVisor still sums what it sends but for TCP under host GSO, whose partial
// checksums the header asks the kernel to complete.
func (*tunEndpoint) Capabilities() stack.LinkEndpointCapabilities {
	return stack.CapabilityRXChecksumOffload
}

// GSOMaxSize implements stack.GSOEndpoint.
func (e *tunEndpoint) GSOMaxSize() uint32 {
	if e.vnet {
		return tunGSOMaxSize
	}
	return 0
}

// SupportedGSO implements stack.GSOEndpoint.
func (e *tunEndpoint) SupportedGSO() stack.SupportedGSO {
	if e.vnet {
		return stack.HostGSOSupported
	}
	return stack.GSONotSupported
}

// Attach implements stack.LinkEndpoint: the first attach starts a reader per
// queue, and detaching (nil, as gVisor does when it removes the NIC, before
// it waits) stops them for good.
func (e *tunEndpoint) Attach(d stack.NetworkDispatcher) {
	e.mu.Lock()
	first := e.dispatcher.Load() == nil && d != nil && !e.started
	e.started = e.started || first
	if d == nil {
		e.dispatcher.Store(nil)
	} else {
		bd, _ := d.(bytesDispatcher)
		e.dispatcher.Store(&dispatcherBox{d: d, bytes: bd})
	}
	e.mu.Unlock()
	if d == nil {
		e.stopReaders()
		return
	}
	if !first {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.paused {
		return // an adopted link: ResumeReads starts them (handover_linux.go)
	}
	for i, q := range e.queues {
		e.readers.Add(1)
		go e.read(q, &e.reads[i].n)
	}
}

// IsAttached implements stack.LinkEndpoint.
func (e *tunEndpoint) IsAttached() bool { return e.dispatcher.Load() != nil }

// Wait implements stack.LinkEndpoint: it returns once every reader has
// stopped (after Attach(nil) or Close).
func (e *tunEndpoint) Wait() { e.readers.Wait() }

// ARPHardwareType implements stack.LinkEndpoint.
func (*tunEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.LinkEndpoint: there is no link header.
func (*tunEndpoint) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.LinkEndpoint.
func (*tunEndpoint) ParseHeader(*stack.PacketBuffer) bool { return true }

// SetOnCloseAction implements stack.LinkEndpoint.
func (e *tunEndpoint) SetOnCloseAction(f func()) {
	e.mu.Lock()
	e.onClose = f
	e.mu.Unlock()
}

// Close implements stack.LinkEndpoint: the readers stop (a read deadline in
// the past wakes them). The descriptors stay open until the Link closes
// them, after the stack has stopped writing.
func (e *tunEndpoint) Close() {
	e.stopReaders()
	e.mu.Lock()
	f := e.onClose
	e.mu.Unlock()
	if f != nil {
		f()
	}
}

func (e *tunEndpoint) stopReaders() {
	e.stopOnce.Do(func() {
		for _, q := range e.queues {
			_ = q.f.SetReadDeadline(time.Unix(1, 0))
		}
	})
}

// read delivers the packets of one queue to the dispatcher, each on this
// goroutine, until the queue is closed or its read deadline passes. Its
// reads are raw (internal/rawio) and it parks in the runtime's poller between
// packets. Blocking in ppoll instead, as fdbased does, ends the spin
// described at writevRaw, but interleaved runs put it behind on conn/s, RR
// and UDP (BENCHMARKS.md, tuning log).
func (e *tunEndpoint) read(q tunQueue, reads *atomic.Uint64) {
	defer e.readers.Done()
	off := 0
	if e.vnet {
		off = vnetHdrLen
	}
	// The kernel hands over up to 64 KiB of packet after the header; a
	// larger buffer would only hold what the gate drops as oversized.
	buf := make([]byte, off+maxPacket)
	rc, err := q.f.SyscallConn()
	if err != nil {
		return // a nil File: nothing to read
	}
	var (
		n     int
		errno unix.Errno
	)
	readOne := func(fd uintptr) bool {
		for {
			n, errno = rawio.Read(fd, buf)
			if errno != unix.EINTR {
				return errno != unix.EAGAIN // nothing yet: park in the poller
			}
		}
	}
	for {
		if err := rc.Read(readOne); err != nil {
			// Close sets a read deadline in the past; the Link sets
			// closed before it closes the descriptors (tun_linux.go).
			if e.closed.Load() || errors.Is(err, os.ErrDeadlineExceeded) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if errno != 0 {
			// The device going away under us: retried slowly rather
			// than ending the reader for good.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if n <= off {
			continue
		}
		reads.Add(1)
		if n > len(buf) {
			// tun_put_user returns the whole length of a packet it cut to
			// the buffer: one over 64 KiB (a BIG TCP skb) is dropped.
			e.unsupported.Add(1)
			continue
		}
		trusted := false
		if e.vnet {
			flags, gsoType := buf[0], buf[1]&^unix.VIRTIO_NET_HDR_GSO_ECN
			switch gsoType {
			case unix.VIRTIO_NET_HDR_GSO_NONE, unix.VIRTIO_NET_HDR_GSO_TCPV4, unix.VIRTIO_NET_HDR_GSO_TCPV6:
			default:
				e.unsupported.Add(1)
				continue
			}
			trusted = flags&(unix.VIRTIO_NET_HDR_F_NEEDS_CSUM|unix.VIRTIO_NET_HDR_F_DATA_VALID) != 0
		}
		p := buf[off:n]
		proto, ok := ipProtocol(p)
		if !ok {
			continue
		}
		d := e.dispatcher.Load()
		if d == nil {
			continue
		}
		if d.bytes != nil {
			d.bytes.DeliverBytes(proto, p, trusted) // the gate: a PacketBuffer only for gVisor
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(p)})
		// The gate reads this as "the kernel vouched for the checksum";
		// the NIC sets it again for gVisor after the gate.
		pkt.RXChecksumValidated = trusted
		d.d.DeliverNetworkPacket(proto, pkt)
		pkt.DecRef()
	}
}

// queueOf is the queue a packet of the flow hashed h leaves on. The kernel
// reads a flow's packets into the queue its last packet was written on
// (tun_flow_update on write, tun_automq_select_queue on read, in
// drivers/net/tun.c; the flow hash is symmetric there as flowHash is here),
// so writing each flow on one queue keeps its packets on that queue's reader:
// a flow's work stays on one goroutine, and the flows spread over the queues.
func (e *tunEndpoint) queueOf(h uint32) tunQueue { return e.queues[h%uint32(len(e.queues))] }

// packetBufferQueue is the queue of a packet gVisor hands over: by its
// headers, or for a packet whose headers are not parsed out (the gate's own
// packets, built as payload), by the packet's first view.
func (e *tunEndpoint) packetBufferQueue(pkt *stack.PacketBuffer) tunQueue {
	if len(e.queues) == 1 {
		return e.queues[0]
	}
	if nh := pkt.NetworkHeader().Slice(); len(nh) > 0 {
		return e.queueOf(flowHash(nh, pkt.TransportHeader().Slice()))
	}
	if views := pkt.AsSlices(); len(views) > 0 {
		return e.queueOf(flowHashPacket(views[0]))
	}
	return e.queues[0]
}

// packetQueue is the queue of a whole IP packet's flow.
func (e *tunEndpoint) packetQueue(b []byte) tunQueue {
	if len(e.queues) == 1 {
		return e.queues[0]
	}
	return e.queueOf(flowHashPacket(b))
}

// WritePackets implements stack.LinkEndpoint: one writev per packet, on the
// queue of its flow (queueOf). A packet the device does not take (its queue
// full) is dropped, as on any NIC.
func (e *tunEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	var hdr [vnetHdrLen]byte
	n := 0
	for _, pkt := range pkts.AsSlice() {
		q := e.packetBufferQueue(pkt)
		h := hdr[:0]
		if e.vnet {
			e.header(&hdr, pkt)
			h = hdr[:]
		}
		if e.closed.Load() {
			return n, &tcpip.ErrClosedForSend{}
		}
		if errno := writePacket(q.fd, h, pkt); errno != 0 {
			if n > 0 {
				return n, nil
			}
			return 0, tcpip.TranslateErrno(errno)
		}
		n++
	}
	return n, nil
}

// zeroVnetHdr is the virtio-net header of a finished packet; the kernel
// only reads it.
var zeroVnetHdr [vnetHdrLen]byte

// WriteBytes writes b, a whole packet with final checksums, in one writev
// behind an empty virtio-net header (a packet finished, as header writes
// for one gVisor finished), on the queue of its flow (implements
// bytesWriter).
func (e *tunEndpoint) WriteBytes(b []byte) tcpip.Error {
	if e.closed.Load() {
		return &tcpip.ErrClosedForSend{}
	}
	var arr [2]unix.Iovec
	iovs := arr[:0]
	if e.vnet {
		iovs = appendIovec(iovs, zeroVnetHdr[:])
	}
	if errno := writevRaw(e.packetQueue(b).fd, appendIovec(iovs, b)); errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	return nil
}

// Offloads implements segmentWriter: the device takes virtio-net headers.
func (e *tunEndpoint) Offloads() bool { return e.vnet }

// WriteSegment writes b, a TCP segment whose checksum the kernel completes
// (VIRTIO_NET_HDR_F_NEEDS_CSUM from the TCP header on), cut at mss payload
// bytes if it is longer (host GSO): the header header writes for gVisor's
// segments under host GSO, on the queue of its flow (implements
// segmentWriter; Offloads must hold).
func (e *tunEndpoint) WriteSegment(b []byte, v6 bool, ipLen, hdrLen, mss int) tcpip.Error {
	if e.closed.Load() {
		return &tcpip.ErrClosedForSend{}
	}
	var hdr [vnetHdrLen]byte
	le := binary.NativeEndian
	hdr[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
	le.PutUint16(hdr[6:], uint16(ipLen))
	le.PutUint16(hdr[8:], header.TCPChecksumOffset)
	if len(b)-hdrLen > mss {
		hdr[1] = unix.VIRTIO_NET_HDR_GSO_TCPV4
		if v6 {
			hdr[1] = unix.VIRTIO_NET_HDR_GSO_TCPV6
		}
		le.PutUint16(hdr[2:], uint16(hdrLen))
		le.PutUint16(hdr[4:], uint16(mss))
	}
	var arr [2]unix.Iovec
	if errno := writevRaw(e.packetQueue(b).fd, appendIovec(appendIovec(arr[:0], hdr[:]), b)); errno != 0 {
		return tcpip.TranslateErrno(errno)
	}
	return nil
}

// writePacket writes hdr and pkt as one packet, an iovec per view of pkt
// (built on the stack: no allocation per packet). gVisor merges queued
// writes into one segment, a view each: a packet in more than maxWriteViews
// is copied into one buffer first (writev takes at most UIO_MAXIOV).
func writePacket(fd int, hdr []byte, pkt *stack.PacketBuffer) unix.Errno {
	var arr [maxWriteViews + 1]unix.Iovec
	iovs := appendIovec(arr[:0], hdr)
	vl, skip := pkt.AsViewList()
	for v := vl.Front(); v != nil; v = v.Next() {
		b := v.AsSlice()
		if skip >= len(b) {
			skip -= len(b)
			continue
		}
		b, skip = b[skip:], 0
		if len(iovs) == len(arr) {
			bp := packetPool.Get().(*[]byte)
			errno := writevRaw(fd, appendIovec(appendIovec(arr[:0], hdr), appendPacket((*bp)[:0], pkt)))
			packetPool.Put(bp)
			return errno
		}
		iovs = appendIovec(iovs, b)
	}
	errno := writevRaw(fd, iovs)
	runtime.KeepAlive(pkt)
	return errno
}

// appendIovec appends an iovec of b, unless b is empty.
func appendIovec(iovs []unix.Iovec, b []byte) []unix.Iovec {
	if len(b) == 0 {
		return iovs
	}
	v := unix.Iovec{Base: &b[0]}
	v.SetLen(len(b))
	return append(iovs, v)
}

// header fills hdr for pkt: zero for a packet gVisor finished itself, or the
// checksum to complete and the MSS to cut at for a host-GSO TCP segment
// (virtio_net_hdr_to_skb's view: csum_start counts from the IP header, as a
// TUN has no link header).
func (e *tunEndpoint) header(hdr *[vnetHdrLen]byte, pkt *stack.PacketBuffer) {
	*hdr = [vnetHdrLen]byte{}
	gso := pkt.GSOOptions
	if gso.Type == stack.GSONone {
		return
	}
	le := binary.NativeEndian // a TUN without TUNSETVNETLE/BE uses the host's order
	if gso.NeedsCsum {
		hdr[0] = unix.VIRTIO_NET_HDR_F_NEEDS_CSUM
		le.PutUint16(hdr[6:], gso.L3HdrLen)
		le.PutUint16(hdr[8:], gso.CsumOffset)
	}
	if pkt.Data().Size() > int(gso.MSS) {
		switch gso.Type {
		case stack.GSOTCPv4:
			hdr[1] = unix.VIRTIO_NET_HDR_GSO_TCPV4
		case stack.GSOTCPv6:
			hdr[1] = unix.VIRTIO_NET_HDR_GSO_TCPV6
		}
		le.PutUint16(hdr[2:], uint16(pkt.HeaderSize()))
		le.PutUint16(hdr[4:], gso.MSS)
	}
}

// writevRaw writes the slices as one packet with writev(2), without telling
// the scheduler (RawSyscall, as gVisor's fdbased does): the descriptor is
// non-blocking and a TUN write does not block. With a plain system call the
// runtime may hand the P away while the kernel delivers the packet; gVisor
// writes a SYN-ACK holding the new endpoint's lock, the client's ACK comes
// back through the TUN before the writer runs again to unlock it, and
// gVisor's TCP processor spins on the locked endpoint meanwhile (the connect
// cell's profile: 66% of the CPU in that loop with a plain write, 43% with
// this one; BENCHMARKS.md).
func writevRaw(fd int, iovs []unix.Iovec) unix.Errno {
	if len(iovs) == 0 {
		return 0
	}
	_, _, errno := unix.RawSyscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iovs[0])), uintptr(len(iovs)))
	return errno
}

// openTUNQueue opens one queue of the device name, with virtio-net headers
// and offloads when vnet is set.
func openTUNQueue(name string, multiQueue, persistent, vnet bool) (tunQueue, string, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return tunQueue{}, "", fmt.Errorf("opening /dev/net/tun: %w", err)
	}
	fail := func(what string, err error) (tunQueue, string, error) {
		_ = unix.Close(fd)
		return tunQueue{}, "", fmt.Errorf("%s: %w", what, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fail("device name", err)
	}
	flags := uint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if multiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	if vnet {
		flags |= unix.IFF_VNET_HDR
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fail("TUNSETIFF", err)
	}
	// A persistent device keeps its offloads and header size from the last
	// open (tun_set_iff resets only the flags): set both either way, or a
	// plain-mode reader would get super-packets with partial checksums.
	if vnet {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnetHdrLen); err != nil {
			return fail("TUNSETVNETHDRSZ", err)
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, tunOffloads); err != nil {
			return fail("TUNSETOFFLOAD", err)
		}
	} else if err := unix.IoctlSetInt(fd, unix.TUNSETOFFLOAD, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return fail("TUNSETOFFLOAD 0", err)
	}
	// Set on every open, either way, as water did: an existing device opened
	// without persistent stops being persistent.
	persist := 0
	if persistent {
		persist = 1
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, persist); err != nil {
		return fail("TUNSETPERSIST", err)
	}
	return tunQueue{f: os.NewFile(uintptr(fd), "/dev/net/tun"), fd: fd}, ifr.Name(), nil
}

//go:build linux

package integration

// An impairing wire, for TestFaults: this kernel has no sch_netem, so the
// impairment lives in the test, in a process of its own (wireproc_linux_test.go).
// A middle namespace M holds two veth ends and the process bridges Ethernet
// frames between them in userspace:
//
//  1. reader (one per direction): an AF_PACKET socket (SOCK_RAW, ETH_P_ALL,
//     outgoing frames ignored) bound to one end reads a frame;
//  2. it applies the direction's rules, in netem's order: blackhole window,
//     loss, duplication, corruption, delay with jitter, reordering, rate;
//  3. a frame due now is written at once on the other end's socket; one due
//     later goes into the direction's timed queue (a heap by due time, so
//     jitter reorders as netem's tfifo does);
//  4. sender (one per direction): writes each queued frame when it is due.
//
// Transient faults are armed to fire once a given number of bytes has
// crossed (arm): a blackhole window, or the client-side veth set down for a
// while through netlink and then up. USERPROXY_FAULTS_TRACE traces every
// frame and its fate (faultTrace).
//
// M's IP stack stays out of it: no addresses, IPv6 off, the veth ends
// promiscuous (the frames are for the MACs of the namespaces on either side).
// No frame may exceed the MTU: the veths involved have TX checksumming, TSO,
// GSO and GRO turned off by the legacy SIOCETHTOOL commands (setFeaturesOff),
// so the kernel segments and checksums before a frame reaches a veth and the
// sockets carry wire-sized frames with complete checksums (a frame captured
// with CHECKSUM_PARTIAL would leave the wire with a wrong checksum). A frame
// larger than the MTU is counted (oversize) and dropped, and TestFaults fails
// on any.

import (
	"bufio"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// faultRules are one direction's impairments. Probabilities are in [0, 1].
type faultRules struct {
	loss      float64 // frames dropped
	duplicate float64 // frames sent twice
	corrupt   float64 // frames with one random bit flipped past the IP header
	// reorder is the share of frames held back by reorderDelay while the
	// rest go at once, so that later frames overtake them. (netem's "delay
	// 5ms reorder 25%" sends 25% at once and delays the other 75%; here the
	// named share is the late one.)
	reorder      float64
	reorderDelay time.Duration
	// delay is added to every frame, with a uniform jitter of ±jitter.
	delay, jitter time.Duration
	// rateBits limits the direction to so many bits per second (0: no
	// limit): frames leave one after the other, each taking its length's
	// time on the wire (a token bucket one frame deep, netem rate's virtual
	// clock); at most rateQueue frames wait, further ones are tail-dropped
	// (tbf's limit).
	rateBits  int64
	rateQueue int
}

// faultQueueLimit bounds a direction's timed queue, as netem's default
// limit of 1000 packets does; past it frames are dropped (queueDrop).
const faultQueueLimit = 1000

// faultMaxFrame is the largest frame the wire passes: the veth MTU plus the
// Ethernet header.
const faultMaxFrame = podVethMTU + 14

// faultStats count one direction's frames. A snapshot is a plain value;
// sub gives what happened between two snapshots.
type faultStats struct {
	frames, bytes    uint64 // read from the socket
	sent             uint64 // written to the other end (duplicates included)
	lost, duplicated uint64
	corrupted        uint64
	reordered        uint64 // held back by reorderDelay
	delayed          uint64 // went through the timed queue
	rateDrop         uint64 // tail-dropped by the rate limit's queue
	queueDrop        uint64 // past faultQueueLimit
	blackholed       uint64
	sendErr          uint64 // the other end refused the frame (link down, ENOBUFS)
	oversize         uint64 // larger than faultMaxFrame: dropped
	sockDrop         uint64 // dropped by the reading socket itself (PACKET_STATISTICS)
	recvErr          uint64 // errors reading (ENETDOWN while the link is down)
	lastErr          string // the last send or receive error, for the log
}

// wireCounters are faultStats' live counterparts.
type wireCounters struct {
	frames, bytes, sent, lost, duplicated, corrupted, reordered, delayed,
	rateDrop, queueDrop, blackholed, sendErr, oversize, sockDrop, recvErr atomic.Uint64
	lastErr atomic.Value // string
}

func (c *wireCounters) snapshot() faultStats {
	s := faultStats{frames: c.frames.Load(), bytes: c.bytes.Load(), sent: c.sent.Load(), lost: c.lost.Load(),
		duplicated: c.duplicated.Load(), corrupted: c.corrupted.Load(), reordered: c.reordered.Load(),
		delayed: c.delayed.Load(), rateDrop: c.rateDrop.Load(), queueDrop: c.queueDrop.Load(),
		blackholed: c.blackholed.Load(), sendErr: c.sendErr.Load(), oversize: c.oversize.Load(),
		sockDrop: c.sockDrop.Load(), recvErr: c.recvErr.Load()}
	s.lastErr, _ = c.lastErr.Load().(string)
	return s
}

func (s faultStats) sub(o faultStats) faultStats {
	return faultStats{frames: s.frames - o.frames, bytes: s.bytes - o.bytes, sent: s.sent - o.sent, lost: s.lost - o.lost,
		duplicated: s.duplicated - o.duplicated, corrupted: s.corrupted - o.corrupted, reordered: s.reordered - o.reordered,
		delayed: s.delayed - o.delayed, rateDrop: s.rateDrop - o.rateDrop, queueDrop: s.queueDrop - o.queueDrop,
		blackholed: s.blackholed - o.blackholed, sendErr: s.sendErr - o.sendErr, oversize: s.oversize - o.oversize,
		sockDrop: s.sockDrop - o.sockDrop, recvErr: s.recvErr - o.recvErr, lastErr: s.lastErr}
}

func (s faultStats) String() string {
	pct := func(n uint64) string { return fmt.Sprintf("%d (%.2f%%)", n, 100*float64(n)/float64(max(s.frames, 1))) }
	str := fmt.Sprintf("%d frames %d bytes, sent %d, lost %s, dup %s, corrupt %s, reordered %s, delayed %d, rate-drop %d, queue-drop %d, blackholed %d, send-err %d, sock-drop %d, oversize %d",
		s.frames, s.bytes, s.sent, pct(s.lost), pct(s.duplicated), pct(s.corrupted), pct(s.reordered), s.delayed,
		s.rateDrop, s.queueDrop, s.blackholed, s.sendErr, s.sockDrop, s.oversize)
	if s.recvErr > 0 {
		str += fmt.Sprintf(", recv-err %d", s.recvErr)
	}
	if s.lastErr != "" && (s.sendErr > 0 || s.recvErr > 0) {
		str += " (last error: " + s.lastErr + ")"
	}
	return str
}

// faultEvent is a transient fault, fired once by arm.
type faultEvent int

const (
	faultNoEvent   faultEvent = iota
	faultBlackhole            // drop every frame, both ways
	faultLinkDown             // the client-side veth down (its end in M), then up
)

func (e faultEvent) String() string {
	return [...]string{"none", "blackhole", "link down"}[e]
}

// faultWire bridges the client-side veth end (index 0) and the upstream
// end (index 1) in namespace M. dirs[0] carries client -> upstream,
// dirs[1] upstream -> client.
type faultWire struct {
	nl   *netlink.Handle // in M
	ends [2]*wireEnd
	dirs [2]*wireDir

	blackholeUntil atomic.Int64 // UnixNano; frames before it are dropped

	// The armed event: after armBytes more bytes of frames (both ways),
	// the event fires once, on the reader that crossed the mark.
	armMu    sync.Mutex
	armEvent faultEvent
	armFor   time.Duration
	armLeft  atomic.Int64 // bytes to go; <= 0 with armed set: fire
	armed    atomic.Bool
	fired    atomic.Int64 // events fired since the wire started
	eventWG  sync.WaitGroup
	linkDown atomic.Bool // an event holds the link down

	trace *faultTrace // nil unless tracing

	stop chan struct{}
	wg   sync.WaitGroup
}

// wireDirNames name the directions, dirs[0] and dirs[1].
var wireDirNames = [2]string{"client->upstream", "upstream->client"}

// wireEnd is one veth end in M and its packet socket.
type wireEnd struct {
	name string
	f    *os.File
	rc   syscall.RawConn
}

// wireDir is one direction: its rules, randomness and timed queue.
type wireDir struct {
	name    string
	in, out *wireEnd
	mu      sync.Mutex // guards rules, rng, q, lastDep, rated
	rules   faultRules
	rng     *rand.Rand
	q       frameHeap
	seq     uint64    // ties in q keep arrival order
	lastDep time.Time // rate: when the last frame leaves
	rated   int       // rate: frames waiting for their slot
	kick    chan struct{}
	c       wireCounters
}

// startFaultWire starts the wire between the veth ends client and
// upstream, which must exist in m; close stops it. Randomness comes from
// seed. With a trace file name, every frame is traced to it (faultTrace).
// It runs in a process of its own (wireproc_linux_test.go).
func startFaultWire(m netns.NsHandle, client, upstream string, seed uint64, trace string) (*faultWire, error) {
	w := &faultWire{stop: make(chan struct{})}
	var err error
	if trace != "" {
		if w.trace, err = openFaultTrace(trace); err != nil {
			return nil, fmt.Errorf("the wire's trace: %w", err)
		}
	}
	if w.nl, err = netlink.NewHandleAt(m); err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	err = inNS(m, func() error {
		for i, name := range []string{client, upstream} {
			e, err := openWireEnd(name)
			if err != nil {
				return err
			}
			w.ends[i] = e
		}
		return nil
	})
	if err != nil {
		for _, e := range w.ends {
			if e != nil {
				e.f.Close()
			}
		}
		w.nl.Close()
		return nil, fmt.Errorf("the wire's sockets: %w", err)
	}
	for i := range w.dirs {
		w.dirs[i] = &wireDir{name: wireDirNames[i], in: w.ends[i], out: w.ends[1-i],
			rng: rand.New(rand.NewPCG(seed, uint64(i))), kick: make(chan struct{}, 1)}
	}
	for _, d := range w.dirs {
		w.wg.Add(2)
		go w.read(d)
		go w.send(d)
	}
	return w, nil
}

// openWireEnd opens the packet socket of the device name, in the calling
// thread's namespace.
func openWireEnd(name string) (*wireEnd, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s: %w", name, err)
	}
	// Protocol 0 until bind: the socket sees nothing of other devices.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	for _, o := range []struct {
		level, opt, v int
	}{
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1}, // not our own sends
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8 << 20},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 1 << 20},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("packet socket option %d: %w", o.opt, err)
		}
	}
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding the packet socket to %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name) // non-blocking: reads and writes go through the poller
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &wireEnd{name: name, f: f, rc: rc}, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// recv reads one frame into buf and returns its whole length (MSG_TRUNC:
// larger than buf if it did not fit).
func (e *wireEnd) recv(buf []byte) (int, error) {
	var n int
	var errno syscall.Errno
	err := e.rc.Read(func(fd uintptr) bool {
		r, _, en := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), unix.MSG_TRUNC, 0, 0)
		if en == unix.EAGAIN {
			return false
		}
		n, errno = int(r), en
		return true
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, errno
	}
	return n, nil
}

// send writes one frame out of the end's device.
func (e *wireEnd) send(frame []byte) error {
	var werr error
	err := e.rc.Write(func(fd uintptr) bool {
		_, werr = unix.Write(int(fd), frame)
		return werr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return werr
}

// sockDrops returns (and resets) the frames the socket dropped for want of
// room.
func (e *wireEnd) sockDrops() uint64 {
	var drops uint64
	_ = e.rc.Control(func(fd uintptr) {
		if st, err := unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
			drops = uint64(st.Drops)
		}
	})
	return drops
}

// read is a direction's reader: it takes frames from d.in and applies the
// rules; it ends when the wire closes.
func (w *faultWire) read(d *wireDir) { // pumps frames from d.in through the rules
	defer w.wg.Done()
	buf := make([]byte, 256<<10)
	for {
		n, err := d.in.recv(buf)
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				return
			}
			// ENETDOWN once when the link goes down; anything else is
			// unexpected. Either way, do not spin on it.
			d.c.recvErr.Add(1)
			d.c.lastErr.Store(fmt.Sprintf("reading %s: %v", d.in.name, err))
			select {
			case <-w.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		d.c.frames.Add(1)
		d.c.bytes.Add(uint64(n))
		w.countArmed(n)
		if n > faultMaxFrame {
			d.c.oversize.Add(1)
			continue
		}
		w.pass(d, buf[:n])
	}
}

// pass applies d's rules to frame, which is only valid during the call.
func (w *faultWire) pass(d *wireDir, frame []byte) {
	now := time.Now()
	fate := "pass"
	if w.trace != nil {
		defer func() { w.trace.frame(d.name, frame, now, fate) }()
	}
	if now.UnixNano() < w.blackholeUntil.Load() {
		d.c.blackholed.Add(1)
		fate = "blackholed"
		return
	}
	d.mu.Lock()
	r := d.rules
	if r.loss > 0 && d.rng.Float64() < r.loss {
		d.mu.Unlock()
		d.c.lost.Add(1)
		fate = "lost"
		return
	}
	copies := 1
	if r.duplicate > 0 && d.rng.Float64() < r.duplicate {
		copies = 2
		d.c.duplicated.Add(1)
		fate = "duplicated"
	}
	if r.corrupt > 0 && d.rng.Float64() < r.corrupt {
		if off, ok := payloadOffset(frame); ok {
			i := off + d.rng.IntN(len(frame)-off)
			frame[i] ^= 1 << d.rng.IntN(8)
			d.c.corrupted.Add(1)
			fate = fmt.Sprintf("corrupted@%d", i)
		}
	}
	delay := r.delay
	if r.jitter > 0 {
		delay += time.Duration(d.rng.Int64N(int64(2*r.jitter)+1)) - r.jitter
	}
	if r.reorder > 0 && d.rng.Float64() < r.reorder {
		delay += r.reorderDelay
		d.c.reordered.Add(1)
		fate = "reordered"
	}
	due := now.Add(max(delay, 0))
	if r.rateBits == 0 && !due.After(now) {
		d.mu.Unlock()
		for range copies {
			w.emit(d, frame)
		}
		return
	}
	if len(d.q)+copies > faultQueueLimit {
		d.mu.Unlock()
		d.c.queueDrop.Add(1)
		fate = "queue-drop"
		return
	}
	if r.rateBits > 0 && d.rated+copies > max(r.rateQueue, 1) {
		d.mu.Unlock()
		d.c.rateDrop.Add(1)
		fate = "rate-drop"
		return
	}
	for range copies {
		f := queuedFrame{due: due, rated: r.rateBits > 0, b: append([]byte(nil), frame...)}
		if f.rated {
			// Each frame takes its length's time on the wire after the
			// one before it.
			start := due
			if d.lastDep.After(start) {
				start = d.lastDep
			}
			d.lastDep = start.Add(time.Duration(int64(len(frame)) * 8 * int64(time.Second) / r.rateBits))
			f.due = d.lastDep
			d.rated++
		}
		d.seq++
		f.seq = d.seq
		heap.Push(&d.q, f)
	}
	d.mu.Unlock()
	d.c.delayed.Add(uint64(copies))
	if fate == "pass" {
		fate = "queued"
	}
	fate += fmt.Sprintf(" +%v", due.Sub(now).Round(time.Microsecond))
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// payloadOffset is where the bytes past the IP header start in an Ethernet
// frame holding IPv4 or IPv6, if any are there.
func payloadOffset(frame []byte) (int, bool) {
	if len(frame) < 14+20 {
		return 0, false
	}
	var off int
	switch uint16(frame[12])<<8 | uint16(frame[13]) {
	case unix.ETH_P_IP:
		off = 14 + int(frame[14]&0x0f)*4
	case unix.ETH_P_IPV6:
		off = 14 + 40
	default:
		return 0, false
	}
	return off, off < len(frame)
}

// emit writes frame out of d's other end and counts the result.
func (w *faultWire) emit(d *wireDir, frame []byte) {
	if err := d.out.send(frame); err != nil {
		d.c.sendErr.Add(1)
		d.c.lastErr.Store(fmt.Sprintf("writing %s: %v", d.out.name, err))
		return
	}
	d.c.sent.Add(1)
}

// send is a direction's sender: it writes the timed queue's frames when they
// are due; it ends when the wire closes.
func (w *faultWire) send(d *wireDir) { // pumps due frames from d's timed queue
	defer w.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due []queuedFrame
	for {
		d.mu.Lock()
		now := time.Now()
		due = due[:0]
		for len(d.q) > 0 && !d.q[0].due.After(now) && len(due) < 64 {
			f := heap.Pop(&d.q).(queuedFrame)
			if f.rated {
				d.rated--
			}
			due = append(due, f)
		}
		wait := time.Duration(-1)
		if len(due) == 0 && len(d.q) > 0 {
			wait = d.q[0].due.Sub(now)
		}
		d.mu.Unlock()
		if len(due) > 0 {
			for _, f := range due {
				w.emit(d, f.b)
			}
			select {
			case <-w.stop:
				return
			default:
			}
			continue
		}
		if wait < 0 {
			select {
			case <-w.stop:
				return
			case <-d.kick:
			}
			continue
		}
		timer.Reset(wait)
		select {
		case <-w.stop:
			return
		case <-d.kick:
		case <-timer.C:
		}
	}
}

// queuedFrame is a frame in a timed queue.
type queuedFrame struct {
	due   time.Time
	seq   uint64
	rated bool // counted in the rate limit's queue
	b     []byte
}

// frameHeap orders queued frames by due time, then arrival.
type frameHeap []queuedFrame

func (h frameHeap) Len() int { return len(h) }
func (h frameHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h frameHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *frameHeap) Push(x any)   { *h = append(*h, x.(queuedFrame)) }
func (h *frameHeap) Pop() any {
	old := *h
	f := old[len(old)-1]
	old[len(old)-1] = queuedFrame{}
	*h = old[:len(old)-1]
	return f
}

// setRules sets both directions' rules (the same ones, as netem on both
// ends of a link) and forgets the rate limit's schedule.
func (w *faultWire) setRules(r faultRules) {
	for _, d := range w.dirs {
		d.mu.Lock()
		d.rules = r
		d.lastDep = time.Time{}
		d.mu.Unlock()
	}
}

// stats snapshots both directions' counters.
func (w *faultWire) stats() [2]faultStats {
	var s [2]faultStats
	for i, d := range w.dirs {
		d.c.sockDrop.Add(d.in.sockDrops())
		s[i] = d.c.snapshot()
	}
	return s
}

// arm makes ev (for d) fire once after `after` more bytes have crossed the
// wire, either way. A previous event must be over (waitEvents).
func (w *faultWire) arm(ev faultEvent, d time.Duration, after int64) {
	w.armMu.Lock()
	defer w.armMu.Unlock()
	w.armEvent, w.armFor = ev, d
	w.armLeft.Store(after)
	w.armed.Store(ev != faultNoEvent)
}

// countArmed counts n bytes toward the armed event and fires it at the
// mark. Firing happens under armMu, so that waitEvents, which disarms under
// it, either sees the event started or keeps it from starting.
func (w *faultWire) countArmed(n int) {
	if !w.armed.Load() || w.armLeft.Add(-int64(n)) > 0 {
		return
	}
	w.armMu.Lock()
	defer w.armMu.Unlock()
	if !w.armed.Load() {
		return
	}
	w.armed.Store(false)
	w.fire(w.armEvent, w.armFor)
}

// fire starts ev for d now.
func (w *faultWire) fire(ev faultEvent, d time.Duration) {
	w.fired.Add(1)
	switch ev {
	case faultBlackhole:
		w.blackholeUntil.Store(time.Now().Add(d).UnixNano())
	case faultLinkDown:
		w.linkDown.Store(true)
		w.eventWG.Add(1)
		w.wg.Add(1)
		go w.holdLinkDown(d)
	}
}

// holdLinkDown sets the client-side end in M down for d, then up again:
// the client's eth0 loses its carrier, as when a cable is pulled, and keeps
// its addresses, routes and neighbours.
func (w *faultWire) holdLinkDown(d time.Duration) { // holds the client-side link down for d
	defer w.wg.Done()
	defer w.eventWG.Done()
	defer w.linkDown.Store(false)
	l, err := w.nl.LinkByName(w.ends[0].name)
	if err == nil {
		err = w.nl.LinkSetDown(l)
	}
	if err != nil {
		w.dirs[0].c.lastErr.Store(fmt.Sprintf("link %s down: %v", w.ends[0].name, err))
		return
	}
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-w.stop:
		t.Stop()
	}
	if err := w.nl.LinkSetUp(l); err != nil {
		w.dirs[0].c.lastErr.Store(fmt.Sprintf("link %s up: %v", w.ends[0].name, err))
	}
}

// waitEvents cancels an event that has not fired, waits for a running
// link-down to end and for a blackhole window to pass, so that the next run
// starts on a clean wire.
func (w *faultWire) waitEvents() {
	w.armMu.Lock()
	w.armed.Store(false)
	w.armMu.Unlock()
	w.eventWG.Wait()
	if d := time.Until(time.Unix(0, w.blackholeUntil.Load())); d > 0 {
		time.Sleep(d)
	}
}

// close stops the wire: the senders and any link-down first, then the
// sockets, which ends the readers.
func (w *faultWire) close() {
	close(w.stop)
	for _, e := range w.ends {
		e.f.Close()
	}
	w.wg.Wait()
	w.nl.Close()
	if w.trace != nil {
		w.trace.close()
	}
}

// faultTrace writes a line per frame the wire reads: when it was read, its
// direction, what the rules did with it, and for IPv4 TCP its ports,
// sequence and acknowledgment numbers, flags, payload length, window and
// header length (over 20: options; 32 is timestamps alone, more is SACK).
type faultTrace struct {
	mu sync.Mutex
	f  *os.File
	w  *bufio.Writer
}

func openFaultTrace(name string) (*faultTrace, error) {
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	return &faultTrace{f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

func (tr *faultTrace) frame(dir string, frame []byte, at time.Time, fate string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	ts := at.Format("15:04:05.000000")
	off, ok := payloadOffset(frame)
	if !ok || frame[12] != 0x08 || frame[13] != 0x00 || frame[14+9] != unix.IPPROTO_TCP || len(frame) < off+20 {
		fmt.Fprintf(tr.w, "%s %s %d bytes (not IPv4 TCP) %s\n", ts, dir, len(frame), fate)
		return
	}
	ip, tcp := frame[14:], frame[off:]
	be := binary.BigEndian
	hlen := int(tcp[12]>>4) * 4
	payload := int(be.Uint16(ip[2:])) - (off - 14) - hlen
	fmt.Fprintf(tr.w, "%s %s %d.%d.%d.%d:%d > %d.%d.%d.%d:%d seq %d ack %d flags %s len %d win %d hlen %d %s\n", ts, dir,
		ip[12], ip[13], ip[14], ip[15], be.Uint16(tcp[0:]), ip[16], ip[17], ip[18], ip[19], be.Uint16(tcp[2:]),
		be.Uint32(tcp[4:]), be.Uint32(tcp[8:]), tcpFlagString(tcp[13]), payload, be.Uint16(tcp[14:]), hlen, fate)
}

// tcpFlagString spells TCP flags as tcpdump does (S, F, R, P, ., U, E, W).
func tcpFlagString(f byte) string {
	var b []byte
	for i, c := range []byte("FSRP.UEW") {
		if f&(1<<i) != 0 {
			b = append(b, c)
		}
	}
	return string(b)
}

func (tr *faultTrace) close() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	_ = tr.w.Flush()
	_ = tr.f.Close()
}

// setFeaturesOff turns off TX checksumming, TSO, GSO and GRO on the device
// name in the calling thread's namespace, with the legacy SIOCETHTOOL
// commands (ethtool -K name tx off tso off gso off gro off), and checks
// that they read back off.
func setFeaturesOff(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for _, f := range []struct {
		what     string
		set, get uint32
	}{
		{"tx-checksumming", unix.ETHTOOL_STXCSUM, unix.ETHTOOL_GTXCSUM},
		{"tso", unix.ETHTOOL_STSO, unix.ETHTOOL_GTSO},
		{"gso", unix.ETHTOOL_SGSO, unix.ETHTOOL_GGSO},
		{"gro", unix.ETHTOOL_SGRO, unix.ETHTOOL_GGRO},
	} {
		if _, err := ethtoolValue(fd, name, f.set, 0); err != nil {
			return fmt.Errorf("ethtool -K %s %s off: %w", name, f.what, err)
		}
		v, err := ethtoolValue(fd, name, f.get, 0)
		if err != nil {
			return fmt.Errorf("ethtool -k %s (%s): %w", name, f.what, err)
		}
		if v != 0 {
			return fmt.Errorf("%s: %s still on after turning it off", name, f.what)
		}
	}
	return nil
}

// ethtoolValue issues an ETHTOOL command that takes a struct ethtool_value
// and returns the value it holds afterwards.
func ethtoolValue(fd int, name string, cmd, data uint32) (uint32, error) {
	v := struct{ cmd, data uint32 }{cmd, data}
	// struct ifreq: the name, then the union, whose ifr_data points at v.
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [24 - unsafe.Sizeof(uintptr(0))]byte
	}
	copy(ifr.name[:], name)
	ifr.data = unsafe.Pointer(&v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if errno != 0 {
		return 0, errno
	}
	return v.data, nil
}

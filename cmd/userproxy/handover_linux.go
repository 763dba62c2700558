package main

// Handover for `userproxy run` (package handover; docs/handover.md):
//
//  1. A running proxy listens on its handover socket (--handover-socket).
//  2. A new one started with --take-over dials it when it would open the
//     TUN; nobody there is a clean start. The old one pauses its TUN's
//     readers, detaches its translated TCP flows and its UDP flows, and
//     sends its TUN queues, the flows' sockets and a snapshot
//     (snapshot.go).
//  3. The new one opens its link on the queues it received, builds its
//     stack and adopts the flows, all without acting on them (no packet
//     read, no segment sent), and confirms. The old one commits: it leaves
//     the device, its routes and the moved flows' sockets to the new one,
//     resets the flows that could not move, and exits 0. Only on the
//     commit does the new one act: it starts the flows and its readers.
//     Any failure before the confirmation leaves the old one serving: it
//     reattaches its flows and reads again.

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/handover"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// The handover's bounds: the old process's wait for the new one's
// confirmation (it is paused meanwhile, so the bound is also the longest
// pause a failed handover costs), and the new one's for the state.
const (
	handoverConfirmWait = 10 * time.Second
	handoverReceiveWait = 10 * time.Second
)

// takeover is what a new process received from the running one.
type takeover struct {
	taker  *handover.Taker
	link   linkState
	flows  proxy.Moved
	syns   [][]byte
	queues []*os.File
	socks  []*os.File
	// listeners are the listeners lent, by name (listenerLender): this
	// process serves on them instead of binding their ports.
	listeners map[string]*os.File
	start     time.Time // when the state was asked for: the pause began about then
	// committed: the old process committed; this one serves. Until
	// then every failure tells the old one to serve on (fail).
	committed bool
	failOnce  sync.Once
}

// takeOver dials the running process at path; it returns nil, nil when
// there is none (a clean start).
func takeOver(path string, logger *zap.Logger) (*takeover, error) {
	// Who serves there, read first: if it dies before it answers, this
	// process waits for it to be gone (its device with it) before it
	// starts clean.
	pid, _ := handover.ServerPID(path)
	tk, err := handover.Dial(path, handoverReceiveWait)
	if errors.Is(err, handover.ErrNoServer) {
		logger.Info("no running proxy to take over from: a clean start", zap.String("socket", path))
		return nil, nil
	}
	if err != nil {
		if !errors.Is(err, handover.ErrRefused) && predecessorCrashed(path) && (pid == 0 || processGone(pid)) {
			logger.Warn("the running proxy died before it answered: a clean start", zap.Int("pid", pid), zap.Error(err))
			return nil, errOldDied
		}
		return nil, fmt.Errorf("taking over: %w", err)
	}
	start := time.Now()
	snap, files, err := tk.Receive(handoverReceiveWait)
	if err != nil {
		tk.Close()
		if processGone(tk.ServerPID) {
			logger.Warn("the running proxy died before it handed over: a clean start", zap.Int("pid", tk.ServerPID), zap.Error(err))
			return nil, errOldDied
		}
		return nil, fmt.Errorf("taking over from pid %d: %w", tk.ServerPID, err)
	}
	l, flows, syns, err := decodeSnapshot(snap)
	nsocks := len(flows.TCP) + len(flows.UDP) + 2*len(flows.Host)
	if err == nil && len(files) != l.queues+nsocks+len(l.listeners) {
		err = fmt.Errorf("%d descriptors for %d queues, %d TCP, %d UDP and %d host flows and %d listeners", len(files), l.queues, len(flows.TCP), len(flows.UDP), len(flows.Host), len(l.listeners))
	}
	if err != nil {
		tk.Fail(err.Error())
		for _, f := range files {
			_ = f.Close()
		}
		return nil, fmt.Errorf("taking over from pid %d: the snapshot: %w", tk.ServerPID, err)
	}
	to := &takeover{taker: tk, link: l, flows: flows, syns: syns, queues: files[:l.queues], socks: files[l.queues : l.queues+nsocks],
		listeners: map[string]*os.File{}, start: start}
	for i, name := range l.listeners {
		to.listeners[name] = files[l.queues+nsocks+i]
	}
	return to, nil
}

// processGone reports whether pid has exited, waiting up to 5 s for it: a
// process that dies closes its files one by one, the handover socket
// perhaps before its TUN queues, and is gone (or a zombie) only once all
// are closed.
func processGone(pid int) bool {
	for deadline := time.Now().Add(5 * time.Second); processAlive(pid); {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// fail tells the old process to serve on, once, and closes what was
// received and not handed on (adoptTUN and adoptFlows take theirs).
func (to *takeover) fail(err error) {
	if to == nil || to.committed {
		return
	}
	to.failOnce.Do(func() {
		to.taker.Fail(err.Error())
		for _, f := range append(to.queues, to.socks...) {
			_ = f.Close()
		}
		for _, f := range to.listeners {
			_ = f.Close()
		}
	})
}

// adoptTUN makes the run's device of the queues received. The old
// process's routes become this one's to remove once it commits (before,
// a failure here must leave them to it); service CIDRs this process
// routes that the old one did not are added.
func adoptTUN(to *takeover, name string, cidrs []netip.Prefix, logger *zap.Logger) (*tunDevice, error) {
	l := to.link
	if l.name != name {
		return nil, fmt.Errorf("the running proxy reads TUN device %q, --tun-name is %q", l.name, name)
	}
	link, err := netstack.AdoptTUN(l.name, to.queues, l.mtu, l.vnet)
	if err != nil {
		return nil, err
	}
	to.queues = nil // the link's
	d := &tunDevice{link: link, name: l.name, created: l.created, logger: logger}
	if len(l.routes) > 0 {
		nl, err := netlink.LinkByName(l.name)
		if err != nil {
			_ = link.Close()
			return nil, fmt.Errorf("device %q: %w", l.name, err)
		}
		for _, p := range l.routes {
			d.inherited = append(d.inherited, netlink.Route{LinkIndex: nl.Attrs().Index, Dst: prefixNet(p)})
		}
	}
	if err := d.addRoutes(cidrs); err != nil {
		_ = link.Close()
		return nil, err
	}
	logger.Info("TUN device taken over", zap.String("device", l.name), zap.Int("queues", l.queues), zap.Bool("offload", l.vnet))
	return d, nil
}

// handoverServer is the running process's side: it answers takers until
// one confirms, then reports on done.
type handoverServer struct {
	srv    *handover.Server
	served chan struct{} // closed when serve returns
	st     *netstack.Stack
	tun    *tunDevice
	px     *proxy.Proxy
	lend   listenerLender
	stats  *handoverStats
	logger *zap.Logger
	done   chan struct{} // closed once a taker confirmed
}

// listenHandover opens the handover socket; a failure is logged (the proxy
// serves without handovers), not fatal.
func listenHandover(path string, st *netstack.Stack, tun *tunDevice, px *proxy.Proxy, lend listenerLender, stats *handoverStats, logger *zap.Logger) *handoverServer {
	if path == "" {
		return nil
	}
	srv, err := handover.Listen(path)
	if err != nil {
		logger.Warn("no handover socket: a restart will reset the flows", zap.Error(err))
		return nil
	}
	h := &handoverServer{srv: srv, served: make(chan struct{}), st: st, tun: tun, px: px, lend: lend, stats: stats, logger: logger, done: make(chan struct{})}
	go h.serve()
	return h
}

// Done is closed once the proxy has been handed over.
func (h *handoverServer) Done() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.done
}

// Close stops listening, and waits for an offer under way to end (within
// its bounds): its failure resumes the TUN's readers, which must not
// happen once the stack is closing.
func (h *handoverServer) Close() {
	if h != nil {
		_ = h.srv.Close()
		<-h.served
	}
}

// serve answers takers, one at a time, until one takes over or Close.
func (h *handoverServer) serve() {
	defer close(h.served)
	for o := range h.srv.Offers() {
		if h.offer(o) {
			close(h.done)
			return
		}
	}
}

// offer hands the proxy to o's taker; it reports whether the taker
// confirmed. Otherwise everything is as before.
func (h *handoverServer) offer(o *handover.Offer) bool {
	log := h.logger.With(zap.Int("taker", o.TakerPID))
	queueFDs, err := h.tun.link.QueueFDs()
	if err != nil {
		o.Refuse(err.Error())
		log.Warn("handover refused", zap.Error(err))
		return false
	}
	paused := time.Now()
	if err := h.tun.link.PauseReads(); err != nil {
		o.Refuse(err.Error())
		return false
	}
	syns := h.st.HandOffHandshakes()
	lent, lentFDs := h.lend.lend() // first: a NodePort connection being set up becomes a flow that moves
	moved, sockFDs := h.px.DetachFlows()
	l := linkState{name: h.tun.name, mtu: h.tun.link.MTU(), vnet: h.tun.link.Offload, queues: len(queueFDs), created: h.tun.created,
		balancing: h.px.SaveBalancing(), listeners: lent} // the readers paused: no pick moves it now
	for _, r := range h.tun.routes {
		if p, ok := prefixOf(r.Dst); ok {
			l.routes = append(l.routes, p)
		}
	}
	snap := encodeSnapshot(l, moved, syns)
	err = o.Send(snap, slices.Concat(queueFDs, sockFDs, lentFDs), handoverConfirmWait)
	if err == nil {
		err = o.Wait(handoverConfirmWait)
	} else {
		o.Refuse(err.Error())
	}
	if err != nil {
		h.stats.failed.Add(1)
		h.px.ReattachFlows()
		h.lend.unlend()
		h.tun.link.ResumeReads()
		log.Warn("handover failed: serving on", zap.Error(err), zap.Int("flows", len(moved.TCP)), zap.Int("udpFlows", len(moved.UDP)),
			zap.Duration("paused", time.Since(paused)))
		return false
	}
	// The device, its routes and the moved flows are the new process's.
	h.tun.routes, h.tun.handedOver = nil, true
	h.px.ForgetDetached()
	log.Info("handed over", zap.Int("flowsMoved", len(moved.TCP)), zap.Int("hostFlowsMoved", len(moved.Host)), zap.Int("udpFlowsMoved", len(moved.UDP)), zap.Int("synsMoved", len(syns)), zap.Int("queues", len(queueFDs)), zap.Strings("listeners", lent),
		zap.Duration("paused", time.Since(paused)), zap.Int("snapshotBytes", len(snap)))
	return true
}

// adoptFlows takes the flows handed over into the new stack, detached,
// and confirms. On the old process's commit it starts them, reads the
// SYNs handed over and starts the link's readers (AdoptTUN left them
// waiting: a client segment must find its flow); this process serves.
// Without the commit, the old process serves on: this one ends, having
// sent nothing and read nothing.
func adoptFlows(to *takeover, tun *tunDevice, st *netstack.Stack, px *proxy.Proxy, stats *handoverStats, logger *zap.Logger) error {
	// The pins and templates first: the adopted flows are counted on them.
	balRestored, balDropped, err := px.RestoreBalancing(to.link.balancing)
	if err != nil {
		logger.Warn("balancing state handed over that could not be restored: dropped", zap.Error(err))
	}
	n, nUDP, err := px.AdoptFlows(st, to.flows, to.socks)
	to.socks = nil // the proxy's
	if err != nil {
		logger.Warn("flows handed over that could not be taken: reset", zap.Error(err))
	}
	if err := to.taker.Confirm(handoverConfirmWait); err != nil {
		to.committed = true // nothing to tell it any more
		return fmt.Errorf("taking over: %w", err)
	}
	to.committed = true
	tun.commit()
	px.StartAdopted(st)
	st.DeliverInbound(to.syns)
	tun.link.ResumeReads()
	pause := time.Since(to.start)
	reset, udpDropped := len(to.flows.TCP)+len(to.flows.Host)-n, len(to.flows.UDP)-nUDP // n counts host flows too
	stats.takenMoved.Store(uint64(n + nUDP))
	stats.takenReset.Store(uint64(reset + udpDropped))
	stats.takenPause.Store(int64(pause))
	logger.Info("took over", zap.Int("from", to.taker.ServerPID), zap.Int("flowsMoved", n),
		zap.Int("flowsReset", reset), zap.Int("hostFlows", len(to.flows.Host)), zap.Int("udpFlowsMoved", nUDP), zap.Int("udpFlowsDropped", udpDropped), zap.Int("syns", len(to.syns)), zap.Int("balancingRestored", balRestored), zap.Int("balancingDropped", balDropped),
		zap.Duration("paused", pause))
	return nil
}

// commit makes the routes inherited from the process taken over this
// one's: it has committed to the handover.
func (d *tunDevice) commit() {
	d.routes = append(d.routes, d.inherited...)
	d.inherited = nil
}

// inheritListeners gives the NodePorts the listeners lent to this process
// and serves its NodePorts on them now; it returns the health server's,
// if lent (nil otherwise).
func inheritListeners(to *takeover, nodePorts *proxy.NodePorts, t *service.Table, healthAddr string) net.Listener {
	var health net.Listener
	if f, ok := to.listeners[healthListenerName(healthAddr)]; ok {
		delete(to.listeners, healthListenerName(healthAddr))
		health, _ = net.FileListener(f)
		_ = f.Close()
	}
	nodePorts.Inherit(to.listeners)
	to.listeners = nil
	if t != nil {
		nodePorts.Sync(t)
	}
	nodePorts.DropInherited()
	return health
}

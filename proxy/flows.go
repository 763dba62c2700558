package proxy

// The end of every flow. The proxy is the one owner of flow teardown:
//
//  1. A flow handler that has its connections calls track: the flow joins
//     the live set and its handle is bound on its conntrack entry (Bind), so
//     that the entry's removal can name the flow without a lookup by tuple
//     (the tuple may already belong to a newer flow).
//  2. Whatever removes the entry — a timeout met by a packet inside gVisor
//     (with the endpoint's lock held), the sweeper, a flush from the admin
//     server, an endpoint leaving — only calls OnConntrackRemove, which
//     queues the flow (once) and returns: nothing is torn down on the
//     remover's goroutine. A flow whose entry a SYN reopened
//     (RemoveReopened) is not queued at once: its connection was over in
//     both directions, but its handler may still be copying the last bytes
//     to the endpoint. It lingers instead for the time its TIME_WAIT entry
//     would have had (the TIME_WAIT timeout, on the conntrack clock), and
//     the reaper queues it then if it has not ended on its own.
//  3. The reaper (a goroutine of Run) drains the queue and ends each flow:
//     a TCP flow with a RST to both peers, a UDP flow by closing its
//     sockets.
//  4. A flow that ends on its own calls untrack: it leaves the live set and
//     drops its connections, so the entry that outlives it (TIME_WAIT)
//     holds only the small flow record.
//  5. Shutdown stops admitting, lets TCP flows finish until its context is
//     done (UDP flows end at once: nothing of theirs can be cut short),
//     then resets what is left.
//
// The queue is bounded by the live flows: a flow is queued at most once,
// and every live flow holds a conntrack entry or a UDP session slot, so
// --conntrack-max bounds it, or lingers (step 2) for at most the TIME_WAIT
// timeout, having given its entry to a newer flow on the same tuple.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
)

// flow is one live flow: its conntrack binding (whose Owner is the flow
// itself) and how to end it.
type flow struct {
	conntrack.Binding
	tuple conntrack.Tuple
	// tcp flows get Shutdown's grace period; the others end at its start.
	tcp bool
	// queued is set when the flow is handed to the reaper, at most once.
	queued atomic.Bool
	// dest and tmpl count the flow for its endpoint's scheduler (sched.go),
	// when Counter is set.
	dest *dest
	tmpl *balancer.Template
	// via is the way the flow went, when the policy could send flows more
	// than one way (dialvia.go); "" otherwise.
	via string
	// mover, for a translated TCP flow, hands it to the next process
	// (handover.go); nil for flows that cannot move.
	mover mover

	mu sync.Mutex
	// end ends the flow: a RST to both peers (TCP), or both sockets closed
	// (UDP); reaped says the flow's entry is gone already (else a UDP flow
	// removes it). It must be idempotent and must not block for long. nil
	// once the flow ended on its own.
	end func(reaped bool)
}

// newFlow returns the record of a flow to endpoint of servicePort; end is
// how to end it from outside.
func newFlow(tuple conntrack.Tuple, tcp bool, binding conntrack.Binding, end func(reaped bool)) *flow {
	f := &flow{Binding: binding, tuple: tuple, tcp: tcp, end: end}
	f.Owner = f
	return f
}

// noteWay records the way a TCP flow went, for listing, unless every flow
// goes direct.
func (f *flow) noteWay(policy DialVia, w Way) {
	if policy != ViaDirect {
		f.via = w.String()
	}
}

// Via is the way the flow went to its endpoint ("direct", "apiserver"),
// or "" when every flow goes direct (--dial-via direct). The conntrack
// listing shows it as via=.
func (f *flow) Via() string { return f.via }

// ended reports whether the flow ended on its own (untrack).
func (f *flow) ended() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.end == nil
}

// terminate ends the flow unless it already ended on its own; reaped says
// its entry is gone.
func (f *flow) terminate(reaped bool) {
	f.mu.Lock()
	end := f.end
	f.mu.Unlock()
	if end != nil {
		end(reaped)
	}
}

// flowSet is the live flows and the reaper's queue.
type flowSet struct {
	mu    sync.Mutex
	live  map[*flow]struct{}
	queue []*flow
	wake  chan struct{} // capacity 1: the reaper has work
	// queued and reaped count the flows handed to the reaper and those it
	// ended, under mu; reaped counts in queue order.
	queued, reaped uint64
	// lingering are the flows whose entry a SYN reopened (step 2), each
	// with when the reaper queues it (conntrack clock), under mu; a flow's
	// own mu may be taken under it, never the other way round.
	lingering []lingerer
}

type lingerer struct {
	f     *flow
	until int64
}

func newFlowSet() *flowSet {
	return &flowSet{live: make(map[*flow]struct{}), wake: make(chan struct{}, 1)}
}

// track registers f and binds it on its conntrack entry (step 1). It
// reports false when the entry is already gone (flushed or expired while
// the endpoint was dialled) or Shutdown has begun: the caller must then end
// the flow itself and untrack it.
func (p *Proxy) track(f *flow) bool {
	p.flows.mu.Lock()
	if p.closing.Load() {
		// Shutdown began: its snapshots of the live flows, taken under
		// this lock after it set closing, would miss this one.
		p.flows.mu.Unlock()
		if f.Counter != nil {
			f.Removed(false)
		}
		return false
	}
	p.flows.live[f] = struct{}{}
	p.flows.mu.Unlock()
	if !p.ct.Bind(f.tuple, &f.Binding) {
		if f.Counter != nil {
			f.Removed(false) // never bound: the count is still ours
		}
		return false
	}
	return true
}

// untrack forgets f, which ended (step 4).
func (p *Proxy) untrack(f *flow) {
	f.mu.Lock()
	f.end = nil
	f.mu.Unlock()
	p.flows.mu.Lock()
	delete(p.flows.live, f)
	p.flows.mu.Unlock()
}

// OnConntrackRemove hands the flow whose conntrack entry left the table to
// the reaper (step 2). The proxy wires it as its table's OnRemove; it never
// blocks and never touches a connection.
func (p *Proxy) OnConntrackRemove(info conntrack.EntryInfo, why conntrack.RemoveReason) {
	f, ok := info.Owner.(*flow)
	if !ok {
		return
	}
	if d := f.dest; d != nil {
		for dir := range d.packets {
			d.packets[dir].Add(info.Packets[dir])
			d.bytes[dir].Add(info.Bytes[dir])
		}
	}
	if why == conntrack.RemoveReopened {
		p.linger(f)
		return
	}
	p.queue(f)
}

// linger holds f, whose entry a SYN reopened, until the TIME_WAIT timeout
// has passed (step 2), unless it has ended already.
func (p *Proxy) linger(f *flow) {
	if f.ended() {
		return
	}
	until := p.ctClock.Now() + int64(p.reopenGrace)
	p.flows.mu.Lock()
	p.flows.lingering = append(p.flows.lingering, lingerer{f, until})
	p.flows.mu.Unlock()
}

// queueLingering queues the lingering flows whose time is up and forgets
// those that ended on their own; the reaper calls it every sweep.
func (p *Proxy) queueLingering() {
	now := p.ctClock.Now()
	var due []*flow
	p.flows.mu.Lock()
	keep := p.flows.lingering[:0]
	for _, l := range p.flows.lingering {
		switch {
		case l.f.ended(): // forgotten
		case now >= l.until:
			due = append(due, l.f)
		default:
			keep = append(keep, l)
		}
	}
	clear(p.flows.lingering[len(keep):])
	if p.flows.lingering = keep; len(keep) == 0 {
		p.flows.lingering = nil // what a burst of reopens grew goes
	}
	p.flows.mu.Unlock()
	for _, f := range due {
		p.queue(f)
	}
}

// queue hands f to the reaper, once.
func (p *Proxy) queue(f *flow) {
	if !f.queued.CompareAndSwap(false, true) {
		return
	}
	p.flows.mu.Lock()
	p.flows.queue = append(p.flows.queue, f)
	p.flows.queued++
	p.flows.mu.Unlock()
	select {
	case p.flows.wake <- struct{}{}:
	default:
	}
}

// reap ends the queued flows until ctx is done (step 3); it also sweeps the
// conntrack table and the fragment queues every sweep interval, on the same
// goroutine, so that expiry and teardown have one owner.
func (p *Proxy) reap(ctx context.Context, sweep time.Duration) { // flow reaper and conntrack sweeper
	tick := time.NewTicker(sweep)
	defer tick.Stop()
	templates := time.NewTicker(templateSweep)
	defer templates.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			p.ct.Sweep()
			p.defrag.Sweep()
			p.queueLingering()
		case <-templates.C:
			p.sweepTemplates()
		case <-p.flows.wake:
		}
		p.reapQueued()
	}
}

// reapQueued ends every flow queued so far.
func (p *Proxy) reapQueued() {
	for {
		p.flows.mu.Lock()
		batch := p.flows.queue
		p.flows.queue = nil
		p.flows.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		for _, f := range batch {
			f.terminate(true)
		}
		p.flows.mu.Lock()
		p.flows.reaped += uint64(len(batch))
		p.flows.mu.Unlock()
	}
}

// awaitReaped waits until the reaper has ended every flow queued so far, or
// until limit: SetTable uses it so that a new table takes effect after the
// flows it ended are gone (their sockets would otherwise still take the
// next datagram of the same client port).
func (p *Proxy) awaitReaped(limit time.Duration) {
	p.flows.mu.Lock()
	target := p.flows.queued
	p.flows.mu.Unlock()
	deadline := time.Now().Add(limit)
	for {
		p.flows.mu.Lock()
		done := p.flows.reaped >= target
		p.flows.mu.Unlock()
		if done || time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// liveFlows returns the live flows, tcp ones or the others.
func (p *Proxy) liveFlows(tcp bool) []*flow {
	p.flows.mu.Lock()
	defer p.flows.mu.Unlock()
	out := make([]*flow, 0, len(p.flows.live))
	for f := range p.flows.live {
		if f.tcp == tcp {
			out = append(out, f)
		}
	}
	return out
}

// Flows returns the number of live flows.
func (p *Proxy) Flows() int {
	p.flows.mu.Lock()
	defer p.flows.mu.Unlock()
	return len(p.flows.live)
}

// Shutdown stops admitting flows (new ones are rejected), ends UDP flows
// (their entries go with them), and lets TCP flows finish on their own
// until ctx is done; then it resets the flows left, both sides, so that a
// client whose response was still streaming sees the truncation as a reset
// rather than a clean end (step 5). It returns once every flow has ended,
// or a second after the resets, and reports how many flows it reset.
func (p *Proxy) Shutdown(ctx context.Context) int {
	p.closing.Store(true)
	for _, f := range p.liveFlows(false) {
		f.terminate(false)
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for p.Flows() > 0 {
		select {
		case <-ctx.Done():
			left := p.liveFlows(true)
			left = append(left, p.liveFlows(false)...) // set up meanwhile
			for _, f := range left {
				f.terminate(false)
			}
			deadline := time.Now().Add(time.Second)
			for p.Flows() > 0 && time.Now().Before(deadline) {
				<-t.C
			}
			return len(left)
		case <-t.C:
		}
	}
	return 0
}

package translate

// A flow on its way to the next process (a handover): Export reads what
// the flow is, Restore makes the same flow in the new process around the
// same endpoint socket, whose queues hold every byte in flight both ways.
//
// What moves: the sequence space both ways, the windows and their scales,
// the options agreed in the handshake, the timestamps' clock (the new
// process's values go on from the old's), the congestion window, the
// round-trip estimates and what RACK learned of reordering; a handshake
// whose SYN-ACK is out moves too (the new process sends it again if the
// client's ACK does not come). What does not:
// segments kept past a gap (the client sends them again: its SACK blocks
// say it holds them, not we), a held ACK (sent at once instead), a
// recovery under way and its timers. Restore takes every byte in flight
// as sent at the handover: RACK and the RTO find what was lost before it
// as they find a loss after it.

import (
	"errors"
	"fmt"
	"time"
)

// Moved is a flow's state for the next process.
type Moved struct {
	// SynRcvd: the handshake is not complete (our SYN-ACK is out); the
	// new process sends it again if the client's ACK does not come.
	SynRcvd bool
	// Receive: the client's stream.
	IRS, RcvNxt, RcvAdv uint32
	RcvWnd              uint32 // the window offered while the socket takes everything
	RcvShift            uint8
	FinIn               bool
	SockFull            bool // a write was short: the owner waits for the socket to drain
	// Send: the endpoint's stream.
	ISS, SndUna, SndNxt, SndMax uint32
	SndWnd, MaxSndWnd           uint32
	Recover, SndWl1, SndWl2     uint32
	SndShift                    uint8
	PeerWS                      int8 // the SYN's window scale, -1 for none
	AdvMSS, MSS                 uint16
	FinSent, FinSeen            bool
	DupThresh                   uint16
	// Options agreed in the handshake.
	SackOK, TS bool
	TSRecent   uint32
	TSNow      uint32 // our timestamp clock at the export
	// Estimates.
	Cwnd, Ssthresh   uint32
	SRTT, RTTVar     time.Duration
	Measured         bool
	MinRTT, ReoDelay time.Duration
	ReoSeen          bool
	ReoMult          uint8
}

// ErrNotMovable is a flow whose state does not move: it has ended, or it
// is detached already.
var ErrNotMovable = errors.New("translate: flow not movable")

// Export returns the flow's state; the flow itself is left as it was.
func (f *Flow) Export() (Moved, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.export()
}

// Detach exports the flow and stops it in the same step: from here on
// every entry point does nothing (no segment out, no byte written to or
// dropped from the socket, Abort included), so that the state exported is
// the state the socket's queues match when the next process restores it.
// Reattach undoes it when the handover fails.
func (f *Flow) Detach() (Moved, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.export()
	if err == nil {
		f.detached = true
	}
	return m, err
}

// Reattach starts a detached flow again where it stopped: the socket's
// peek offset is set again (the next process may have moved it before it
// gave up), and an Abort that came meanwhile is done now.
func (f *Flow) Reattach() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.detached {
		return
	}
	f.detached = false
	if f.abortDue {
		f.close(true)
		return
	}
	if f.state == stateClosed {
		return
	}
	peek := f.sndNxt
	if f.finSeen && peek == f.sndMax {
		peek--
	}
	if f.state == stateSynRcvd {
		peek = f.sndUna
	}
	if err := f.sock.SetPeekOffset(int(peek - f.sndUna)); err != nil {
		f.close(true)
	}
}

func (f *Flow) export() (Moved, error) {
	if f.state == stateClosed || f.detached {
		return Moved{}, ErrNotMovable
	}
	return Moved{
		SynRcvd: f.state == stateSynRcvd,
		IRS:     f.irs, RcvNxt: f.rcvNxt, RcvAdv: f.rcvAdv, RcvWnd: f.rcvWnd, RcvShift: f.rcvShift, FinIn: f.finIn, SockFull: f.sockFull,
		ISS: f.iss, SndUna: f.sndUna, SndNxt: f.sndNxt, SndMax: f.sndMax, SndWnd: f.sndWnd, MaxSndWnd: f.maxSndWnd,
		Recover: f.recover, SndWl1: f.sndWl1, SndWl2: f.sndWl2, SndShift: f.sndShift, PeerWS: int8(f.peerWS),
		AdvMSS: uint16(f.advMSS), MSS: uint16(f.mss), FinSent: f.finSent, FinSeen: f.finSeen, DupThresh: uint16(f.dupThresh),
		SackOK: f.sackOK, TS: f.ts, TSRecent: f.tsRecent, TSNow: f.tsNow(),
		Cwnd: uint32(f.cc.window()), Ssthresh: uint32(f.cc.ssthreshold()), SRTT: f.rtt.srtt, RTTVar: f.rtt.rttvar, Measured: f.rtt.measured,
		MinRTT: f.rack.minRTT, ReoDelay: f.rack.reoDelay, ReoSeen: f.rack.reoSeen, ReoMult: uint8(min(f.rack.reoMult, reoMultMax)),
	}, nil
}

// seqLE reports a <= b in sequence space.
func seqLE(a, b uint32) bool { return int32(b-a) >= 0 }

// check validates m as Restore needs it: a snapshot may come from another
// build, or be broken; a flow made from it must hold the same invariants
// as one made from a SYN. Past its handshake a flow's ISS and IRS say
// nothing: after 2 GiB each way sequence space wraps past them (an iperf3
// stream did, in TestBinaryRestartSIGHUP).
func (m *Moved) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("translate: a moved flow %s", fmt.Sprintf(format, args...))
	}
	switch {
	case m.MSS < minMSS:
		return bad("with MSS %d, below %d", m.MSS, minMSS)
	case m.AdvMSS < minMSS:
		return bad("announcing MSS %d", m.AdvMSS)
	case m.RcvShift > 14 || m.SndShift > 14 || m.PeerWS > 14 || m.PeerWS < -1:
		return bad("with window scales %d, %d, %d", m.RcvShift, m.SndShift, m.PeerWS)
	case m.PeerWS < 0 && (m.RcvShift != 0 || m.SndShift != 0):
		return bad("scaling windows the client did not agree to")
	case m.RcvWnd == 0 || m.RcvWnd > 1<<30:
		return bad("offering a window of %d", m.RcvWnd)
	case !seqLE(m.SndUna, m.SndNxt) || !seqLE(m.SndNxt, m.SndMax) || m.SndMax-m.SndUna > 1<<30:
		return bad("with una %d, nxt %d, max %d", m.SndUna, m.SndNxt, m.SndMax)
	case m.SynRcvd && (m.SndUna != m.ISS || m.SndNxt != m.ISS+1 || m.SndMax != m.ISS+1 || m.RcvNxt != m.IRS+1 || m.FinIn || m.FinSeen):
		return bad("in its handshake with una %d, nxt %d, max %d, iss %d", m.SndUna, m.SndNxt, m.SndMax, m.ISS)
	case m.FinSent && (!m.FinSeen || m.SndNxt != m.SndMax):
		return bad("with its FIN sent below sndMax")
	case m.FinSeen && m.SndMax == m.SndUna && !m.FinSent:
		return bad("with its FIN acknowledged but not sent")
	case m.DupThresh < dupAckThresh || m.DupThresh > maxReordering:
		return bad("with a reordering threshold of %d", m.DupThresh)
	case m.Cwnd == 0 || m.Cwnd > maxCwnd || m.Ssthresh == 0 || m.Ssthresh > maxCwnd:
		return bad("with cwnd %d, ssthresh %d", m.Cwnd, m.Ssthresh)
	case m.SRTT < 0 || m.SRTT > rtoMax || m.RTTVar < 0 || m.RTTVar > rtoMax || m.MinRTT < 0 || m.MinRTT > rtoMax || m.ReoDelay < 0 || m.ReoDelay > rtoMin:
		return bad("with round trips out of range")
	case m.MaxSndWnd > 0xffff<<14 || m.SndWnd > 0xffff<<14:
		return bad("with a client window of %d", m.MaxSndWnd)
	}
	return nil
}

// Restore makes the flow m describes around cfg's socket, writer and
// clock (cfg's ISS, TSBase, RcvShift and handshake fields are m's
// business, not cfg's). Bytes in flight count as sent now. Restore sends
// nothing; the owner calls Resume once the flow is where the client's
// segments find it.
func Restore(cfg Config, m Moved) (*Flow, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	now := cfg.Now()
	f := &Flow{
		sock: cfg.Sock, w: cfg.Writer, emit: cfg.Emit, emitPartial: cfg.EmitPartial, gso: cfg.EmitPartial != nil, held: cfg.Held, bytes: cfg.Bytes, now: cfg.Now,
		state: stateEstablished, hsDeadline: cfg.HSDeadline, hsAborted: cfg.HSAborted,
		irs: m.IRS, rcvNxt: m.RcvNxt, rcvAdv: m.RcvAdv, rcvWnd: m.RcvWnd, rcvShift: m.RcvShift, finIn: m.FinIn, sockFull: m.SockFull,
		iss: m.ISS, sndUna: m.SndUna, sndNxt: m.SndNxt, sndMax: m.SndMax, sndWnd: m.SndWnd, maxSndWnd: m.MaxSndWnd,
		recover: m.Recover, sndWl1: m.SndWl1, sndWl2: m.SndWl2, sndShift: m.SndShift, peerWS: int(m.PeerWS),
		advMSS: int(m.AdvMSS), mss: int(m.MSS), finSent: m.FinSent, finSeen: m.FinSeen, dupThresh: int(m.DupThresh),
		sackOK: m.SackOK, ts: m.TS, tsRecent: m.TSRecent, tsBase: m.TSNow, t0: now,
		rtt:      rttEstimator{srtt: m.SRTT, rttvar: m.RTTVar, measured: m.Measured},
		progress: now,
	}
	f.kept.budget = cfg.KeptBudget
	if m.SynRcvd {
		f.state = stateSynRcvd
		f.rtoArmed = true // the SYN-ACK's timer: sent again if the ACK does not come
	}
	if cfg.LinkMSS > 0 {
		f.mss = max(min(f.mss, int(cfg.LinkMSS)), minMSS) // a new process's link may carry less
	}
	f.sendMSS = f.mss
	if f.ts {
		f.sendMSS -= 12
	}
	f.maxWnd = min(f.rcvWnd, 0xffff<<f.rcvShift)
	c := newCubic(f.sendMSS)
	c.cwnd, c.ssthresh = max(int(m.Cwnd), f.sendMSS), max(int(m.Ssthresh), 2*f.sendMSS)
	f.cc = c
	f.rack = rackState{minRTT: m.MinRTT, reoDelay: m.ReoDelay, reoSeen: m.ReoSeen, reoMult: int(m.ReoMult)}
	// What is in flight, as sent now; the FIN is no byte.
	dataEnd := f.sndMax
	if f.finSeen {
		dataEnd--
	}
	if m.SynRcvd {
		f.log = newSentLog(f.iss + 1)
		return f, nil // the peek offset is 0, as the dial left it
	}
	f.log = newSentLog(f.sndUna)
	if f.sackOK && int32(dataEnd-f.sndUna) > 0 {
		f.log.sent(f.sndUna, dataEnd, 0, f.sendMSS)
	}
	if f.sndUna != f.sndMax && !m.SynRcvd {
		f.rtoArmed, f.tlpDue = true, f.sackOK
	}
	peek := f.sndNxt
	if int32(peek-dataEnd) > 0 {
		peek = dataEnd
	}
	if err := f.sock.SetPeekOffset(int(peek - f.sndUna)); err != nil {
		return nil, fmt.Errorf("translate: restoring the peek offset: %w", err)
	}
	return f, nil
}

// Resume starts a restored flow: an ACK with the window the socket allows
// now (the client may wait for a window update the old process owed it),
// then what the socket holds.
func (f *Flow) Resume() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.state != stateEstablished || f.detached {
		return // a handshake's: the client's ACK, or the SYN-ACK's timer
	}
	f.sendAck()
	f.pump()
}

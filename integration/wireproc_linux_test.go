//go:build linux

package integration

// The impairing wire runs in a process of its own in namespace M, as netem
// runs in the kernel, outside the processes whose traffic it carries: in the
// test's process its readers would wait for the same two Ps as the proxy
// under test (the rig) and the transfers' own goroutines, and every frame's
// wait would be the path's round trip. The test binary is that process:
// started under `ip netns exec M` with wireChildEnv set, TestMain runs
// runWireChild instead of the tests. The parent drives it over the child's
// stdin and stdout, one JSON message and one reply at a time (wireProc);
// the child ends when its stdin closes, so a parent that dies leaves no
// wire behind.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// wireChildEnv holds the child's wireConfig, as JSON.
const wireChildEnv = "USERPROXY_FAULTWIRE_CHILD"

func init() { childMains[wireChildEnv] = runWireChild }

// wireConfig is what startFaultWire needs, for the child.
type wireConfig struct {
	Client, Upstream string
	Seed             uint64
	Trace            string
}

// wireMsg is one request to the child: set the rules, arm an event, wait
// for the events, report the counters, or close.
type wireMsg struct {
	Op                                string
	Loss, Duplicate, Corrupt, Reorder float64
	ReorderDelay, Delay, Jitter       time.Duration
	RateBits                          int64
	RateQueue                         int
	Event                             faultEvent
	For                               time.Duration
	After                             int64
}

// wireReply answers a wireMsg.
type wireReply struct {
	Err     string
	Fired   int64
	Counts  [2][15]uint64
	LastErr [2]string
}

func (s faultStats) counts() [15]uint64 {
	return [15]uint64{s.frames, s.bytes, s.sent, s.lost, s.duplicated, s.corrupted, s.reordered, s.delayed,
		s.rateDrop, s.queueDrop, s.blackholed, s.sendErr, s.oversize, s.sockDrop, s.recvErr}
}

func statsFromCounts(c [15]uint64, lastErr string) faultStats {
	return faultStats{frames: c[0], bytes: c[1], sent: c[2], lost: c[3], duplicated: c[4], corrupted: c[5], reordered: c[6],
		delayed: c[7], rateDrop: c[8], queueDrop: c[9], blackholed: c[10], sendErr: c[11], oversize: c[12], sockDrop: c[13],
		recvErr: c[14], lastErr: lastErr}
}

// runWireChild is the child's main: it runs the wire in the namespace it was
// started in and answers the parent's requests until its stdin closes.
func runWireChild() int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "fault wire: %v\n", err)
		return 1
	}
	var cfg wireConfig
	if err := json.Unmarshal([]byte(os.Getenv(wireChildEnv)), &cfg); err != nil {
		return fail(fmt.Errorf("%s: %w", wireChildEnv, err))
	}
	m, err := netns.Get()
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	w, err := startFaultWire(m, cfg.Client, cfg.Upstream, cfg.Seed, cfg.Trace)
	if err != nil {
		return fail(err)
	}
	defer w.close()
	dec, enc := json.NewDecoder(os.Stdin), json.NewEncoder(os.Stdout)
	for {
		var msg wireMsg
		if err := dec.Decode(&msg); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			return fail(err)
		}
		var r wireReply
		switch msg.Op {
		case "rules":
			w.setRules(faultRules{loss: msg.Loss, duplicate: msg.Duplicate, corrupt: msg.Corrupt, reorder: msg.Reorder,
				reorderDelay: msg.ReorderDelay, delay: msg.Delay, jitter: msg.Jitter, rateBits: msg.RateBits, rateQueue: msg.RateQueue})
		case "arm":
			w.arm(msg.Event, msg.For, msg.After)
		case "wait":
			w.waitEvents()
		case "stats":
			for i, s := range w.stats() {
				r.Counts[i], r.LastErr[i] = s.counts(), s.lastErr
			}
		case "close":
			_ = enc.Encode(r)
			return 0
		default:
			r.Err = fmt.Sprintf("unknown request %q", msg.Op)
		}
		r.Fired = w.fired.Load()
		if err := enc.Encode(r); err != nil {
			return fail(err)
		}
	}
}

// wireProc is the parent's handle on a wire in its own process. Its
// methods are faultWire's; a failure to reach the child fails the test.
type wireProc struct {
	t     testing.TB
	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser
	dec   *json.Decoder
	done  chan struct{} // closed when the child has exited
}

// newFaultWire starts the wire between the veth ends client and upstream
// in the namespace named mName, in a process of its own, and stops it when
// the test ends.
func newFaultWire(t testing.TB, mName, client, upstream string, seed uint64, trace string) *wireProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("the test binary: %v", err)
	}
	cfg, err := json.Marshal(wireConfig{Client: client, Upstream: upstream, Seed: seed, Trace: trace})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", mName, exe)
	cmd.Env = append(os.Environ(), wireChildEnv+"="+string(cfg))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the wire in %s: %v", mName, err)
	}
	p := &wireProc{t: t, cmd: cmd, stdin: stdin, dec: json.NewDecoder(stdout), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	t.Cleanup(p.close)
	if trace != "" {
		t.Logf("tracing the wire's frames to %s", trace)
	}
	// The first answer says the wire is up (or why not: the child's
	// error is on stderr and the pipe ends).
	if _, err := p.call(wireMsg{Op: "stats"}); err != nil {
		t.Fatalf("the wire in %s did not start: %v", mName, err)
	}
	return p
}

// call sends msg and waits for the reply.
func (p *wireProc) call(msg wireMsg) (wireReply, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var r wireReply
	b, err := json.Marshal(msg)
	if err != nil {
		return r, err
	}
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		return r, fmt.Errorf("the wire's %s: %w", msg.Op, err)
	}
	if err := p.dec.Decode(&r); err != nil {
		return r, fmt.Errorf("the wire's answer to %s: %w", msg.Op, err)
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

// do calls msg and fails the test if the wire did not answer.
func (p *wireProc) do(msg wireMsg) wireReply {
	r, err := p.call(msg)
	if err != nil {
		p.t.Errorf("fault wire: %v", err)
	}
	return r
}

func (p *wireProc) setRules(r faultRules) {
	p.do(wireMsg{Op: "rules", Loss: r.loss, Duplicate: r.duplicate, Corrupt: r.corrupt, Reorder: r.reorder,
		ReorderDelay: r.reorderDelay, Delay: r.delay, Jitter: r.jitter, RateBits: r.rateBits, RateQueue: r.rateQueue})
}

func (p *wireProc) arm(ev faultEvent, d time.Duration, after int64) {
	p.do(wireMsg{Op: "arm", Event: ev, For: d, After: after})
}

func (p *wireProc) waitEvents() { p.do(wireMsg{Op: "wait"}) }

// fired is how many events have fired since the wire started.
func (p *wireProc) fired() int64 { return p.do(wireMsg{Op: "stats"}).Fired }

func (p *wireProc) stats() [2]faultStats {
	r := p.do(wireMsg{Op: "stats"})
	return [2]faultStats{statsFromCounts(r.Counts[0], r.LastErr[0]), statsFromCounts(r.Counts[1], r.LastErr[1])}
}

// close asks the child to stop and waits for it, 10 s at most.
func (p *wireProc) close() {
	_, _ = p.call(wireMsg{Op: "close"})
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("the fault wire (pid %d) did not exit: killed", p.cmd.Process.Pid)
	}
}

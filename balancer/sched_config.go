package balancer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Choosing a scheduler by name, as `--scheduler` and the
// userproxy.io/scheduler annotation do, with flags as `ipvsadm -b` takes
// them (ipvsadm.c, parse_sched_flags): a comma-separated list of flag-1,
// flag-2, flag-3 (IP_VS_SVC_F_SCHED1..3) or their names for the schedulers
// that read them, sh-fallback and sh-port for sh, mh-fallback and mh-port
// for mh. A named flag on another scheduler is refused, as ipvsadm refuses
// it; flag-N is accepted for any IPVS scheduler and, as in the kernel,
// means nothing to one that does not read it.

// ErrUnknownScheduler is returned for a scheduler name that is not one of
// SchedulerNames.
var ErrUnknownScheduler = errors.New("unknown scheduler")

// ErrSchedulerFlags is returned for scheduler flags that do not parse or do
// not apply to the scheduler.
var ErrSchedulerFlags = errors.New("bad scheduler flags")

// SchedulerNames are the names ParseScheduler accepts: "random" (the
// default: kube-proxy's iptables lottery) and IPVS's schedulers.
var SchedulerNames = []string{"random", "rr", "wrr", "lc", "wlc", "sed", "nq", "sh", "dh", "mh"}

// SchedFlags are a service's scheduler flags (IP_VS_SVC_F_SCHED1..3).
type SchedFlags uint8

const (
	// SchedFlag1 is flag-1: sh-fallback for sh, mh-fallback for mh.
	SchedFlag1 SchedFlags = 1 << iota
	// SchedFlag2 is flag-2: sh-port for sh, mh-port for mh.
	SchedFlag2
	// SchedFlag3 is flag-3, read by no scheduler here.
	SchedFlag3
)

// SchedulerConfig names a scheduler and its flags; New makes one (each
// service port needs its own). The zero value is "random".
type SchedulerConfig struct {
	Name  string
	Flags SchedFlags
}

// ParseScheduler checks a scheduler name and its flags (empty for none). An
// empty name is "random". Errors wrap ErrUnknownScheduler or
// ErrSchedulerFlags and name the scheduler; the caller adds which Service
// asked for it.
func ParseScheduler(name, flags string) (SchedulerConfig, error) {
	if name == "" {
		name = "random"
	}
	if !slices.Contains(SchedulerNames, name) {
		return SchedulerConfig{}, fmt.Errorf("scheduler %q: %w (known: %s)",
			name, ErrUnknownScheduler, strings.Join(SchedulerNames, ", "))
	}
	cfg := SchedulerConfig{Name: name}
	// strtok(optarg, ","): empty items are skipped.
	for item := range strings.SplitSeq(flags, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if name == "random" {
			return SchedulerConfig{}, fmt.Errorf("scheduler %q takes no flags, got %q: %w", name, item, ErrSchedulerFlags)
		}
		f, ok := schedFlagByName(name, item)
		if !ok {
			return SchedulerConfig{}, fmt.Errorf("scheduler %q: flag %q: %w (%s)",
				name, item, ErrSchedulerFlags, flagHelp(name))
		}
		cfg.Flags |= f
	}
	return cfg, nil
}

// schedFlagByName resolves one flag for the scheduler name.
func schedFlagByName(name, flag string) (SchedFlags, bool) {
	switch flag {
	case "flag-1":
		return SchedFlag1, true
	case "flag-2":
		return SchedFlag2, true
	case "flag-3":
		return SchedFlag3, true
	}
	if name != "sh" && name != "mh" {
		return 0, false
	}
	switch flag {
	case name + "-fallback":
		return SchedFlag1, true
	case name + "-port":
		return SchedFlag2, true
	}
	return 0, false
}

func flagHelp(name string) string {
	if name == "sh" || name == "mh" {
		return fmt.Sprintf("want %s-fallback, %s-port, flag-1, flag-2 or flag-3", name, name)
	}
	return "want flag-1, flag-2 or flag-3"
}

// FlagNames returns the flags by the names ipvsadm gives them for this
// scheduler (sh-port, mh-fallback, flag-3, ...), in bit order.
func (c SchedulerConfig) FlagNames() []string {
	var out []string
	for i, f := range []SchedFlags{SchedFlag1, SchedFlag2, SchedFlag3} {
		if c.Flags&f == 0 {
			continue
		}
		name := fmt.Sprintf("flag-%d", i+1)
		if (c.Name == "sh" || c.Name == "mh") && f != SchedFlag3 {
			name = c.Name + []string{"-fallback", "-port"}[i]
		}
		out = append(out, name)
	}
	return out
}

// String returns the name and, if any, the flags by name, as ParseScheduler
// takes them back: "rr", "mh mh-fallback,mh-port".
func (c SchedulerConfig) String() string {
	name := c.Name
	if name == "" {
		name = "random"
	}
	if f := c.FlagNames(); len(f) > 0 {
		return name + " " + strings.Join(f, ",")
	}
	return name
}

// IPVS reports whether the scheduler is one of IPVS's (session affinity is
// then IPVS persistence) rather than the iptables lottery.
func (c SchedulerConfig) IPVS() bool { return c.Name != "" && c.Name != "random" }

// New returns a new scheduler for one service port. r is the random source
// of "random" and is not used by the others; nil means RuntimeSource. It
// panics on a config ParseScheduler would not return.
func (c SchedulerConfig) New(r Source) Scheduler {
	switch c.Name {
	case "", "random":
		if r == nil {
			r = RuntimeSource{}
		}
		return NewRandomScheduler(NewLottery(16), r)
	case "rr":
		return newRR()
	case "wrr":
		return newWRR()
	case "lc":
		return lc{}
	case "wlc":
		return wlc{}
	case "sed":
		return sed{}
	case "nq":
		return nq{}
	case "sh":
		return &sh{flags: c.Flags}
	case "dh":
		return &dh{}
	case "mh":
		return newMH(c.Flags)
	}
	panic(fmt.Sprintf("balancer: scheduler %q: %v", c.Name, ErrUnknownScheduler))
}

// RandomScheduler is the Lottery as a Scheduler: kube-proxy's iptables
// cascade over the endpoints, which knows no weights and no counts.
type RandomScheduler struct {
	lottery *Lottery
	rand    Source
}

var _ Scheduler = (*RandomScheduler)(nil)

// NewRandomScheduler returns the lottery l drawing from r as a Scheduler.
func NewRandomScheduler(l *Lottery, r Source) *RandomScheduler {
	return &RandomScheduler{lottery: l, rand: r}
}

// Name returns "random".
func (*RandomScheduler) Name() string { return "random" }

// Update does nothing: the lottery keeps no state per list.
func (*RandomScheduler) Update([]Endpoint) error { return nil }

// Pick runs the cascade over len(eps) endpoints.
func (s *RandomScheduler) Pick(eps []Endpoint, _ Flow) int {
	return s.lottery.Pick(len(eps), s.rand)
}

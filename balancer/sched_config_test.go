package balancer

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustScheduler(t testing.TB, name, flags string) Scheduler {
	t.Helper()
	cfg, err := ParseScheduler(name, flags)
	if err != nil {
		t.Fatal(err)
	}
	return cfg.New(nil)
}

// flagsFor returns flag-1,flag-2 (fallback and port for sh and mh) for the
// IPVS schedulers, which all accept them, and none for random.
func flagsFor(name string) string {
	if name == "random" {
		return ""
	}
	return "flag-1,flag-2"
}

func TestParseSchedulerNames(t *testing.T) {
	for _, name := range SchedulerNames {
		cfg, err := ParseScheduler(name, "")
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got := cfg.New(nil).Name(); got != name {
			t.Errorf("ParseScheduler(%q).New().Name() = %q", name, got)
		}
		if cfg.IPVS() != (name != "random") {
			t.Errorf("%s: IPVS() = %v", name, cfg.IPVS())
		}
	}
	if cfg, err := ParseScheduler("", ""); err != nil || cfg.Name != "random" {
		t.Errorf(`ParseScheduler("") = %+v, %v; want random`, cfg, err)
	}
}

func TestParseSchedulerRefusesUnknown(t *testing.T) {
	// The kernel matches scheduler names exactly (ip_vs_sched.c,
	// ip_vs_sched_getbyname: strcmp), so "RR" is unknown too.
	for _, name := range []string{"roundrobin", "RR", "lblc", "rr ", "fo"} {
		_, err := ParseScheduler(name, "")
		if !errors.Is(err, ErrUnknownScheduler) {
			t.Errorf("ParseScheduler(%q) = %v, want ErrUnknownScheduler", name, err)
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("%q", name)) {
			t.Errorf("error %q does not name the scheduler %q", err, name)
		}
	}
}

// Flags as ipvsadm -b takes them (ipvsadm.c, parse_sched_flags).
func TestParseSchedulerFlags(t *testing.T) {
	cases := []struct {
		name, flags string
		want        SchedFlags
		wantErr     bool
		names       []string
	}{
		{"sh", "", 0, false, nil},
		{"sh", "sh-port", SchedFlag2, false, []string{"sh-port"}},
		{"sh", "sh-port,sh-fallback", SchedFlag1 | SchedFlag2, false, []string{"sh-fallback", "sh-port"}},
		{"sh", " sh-fallback , ,sh-port ", SchedFlag1 | SchedFlag2, false, []string{"sh-fallback", "sh-port"}},
		{"sh", "flag-2", SchedFlag2, false, []string{"sh-port"}},
		{"mh", "mh-port", SchedFlag2, false, []string{"mh-port"}},
		{"mh", "mh-fallback,flag-3", SchedFlag1 | SchedFlag3, false, []string{"mh-fallback", "flag-3"}},
		{"rr", "flag-1", SchedFlag1, false, []string{"flag-1"}},
		{"rr", "sh-port", 0, true, nil},
		{"sh", "mh-port", 0, true, nil},
		{"mh", "sh-fallback", 0, true, nil},
		{"mh", "port", 0, true, nil},
		{"wlc", "flag-4", 0, true, nil},
		{"random", "flag-1", 0, true, nil},
		{"random", ",", 0, false, nil},
	}
	for _, c := range cases {
		cfg, err := ParseScheduler(c.name, c.flags)
		if c.wantErr {
			if !errors.Is(err, ErrSchedulerFlags) || !strings.Contains(err.Error(), fmt.Sprintf("%q", c.name)) {
				t.Errorf("ParseScheduler(%q, %q) = %v, want ErrSchedulerFlags naming the scheduler", c.name, c.flags, err)
			}
			continue
		}
		if err != nil || cfg.Flags != c.want {
			t.Errorf("ParseScheduler(%q, %q) = %+v, %v; want flags %b", c.name, c.flags, cfg, err, c.want)
			continue
		}
		if diff := cmp.Diff(c.names, cfg.FlagNames()); diff != "" {
			t.Errorf("%s %q: FlagNames (-want +got):\n%s", c.name, c.flags, diff)
		}
	}
	cfg, _ := ParseScheduler("mh", "mh-port,mh-fallback")
	if got := cfg.String(); got != "mh mh-fallback,mh-port" {
		t.Errorf("String() = %q", got)
	}
}

// Whatever the input, ParseScheduler returns an error or a config that New
// can build and that its own String parses back to.
func FuzzParseScheduler(f *testing.F) {
	for _, s := range [][2]string{
		{"rr", ""}, {"sh", "sh-port,sh-fallback"}, {"mh", "mh-port"}, {"", ""},
		{"random", "flag-1"}, {"wlc", "flag-1,flag-2,flag-3"}, {"sh", ",,,"}, {"x", "y"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, name, flags string) {
		cfg, err := ParseScheduler(name, flags)
		if err != nil {
			if !errors.Is(err, ErrUnknownScheduler) && !errors.Is(err, ErrSchedulerFlags) {
				t.Fatalf("error %v wraps neither sentinel", err)
			}
			return
		}
		s := cfg.New(nil)
		if s.Name() != cfg.Name {
			t.Fatalf("New().Name() = %q for %+v", s.Name(), cfg)
		}
		n, fl, _ := strings.Cut(cfg.String(), " ")
		back, err := ParseScheduler(n, fl)
		if err != nil || back != cfg {
			t.Fatalf("String %q parses to %+v, %v; want %+v", cfg.String(), back, err, cfg)
		}
		eps := testEndpoints(3)
		if i := s.Pick(eps, anyFlow); i < -1 || i >= len(eps) {
			t.Fatalf("Pick = %d", i)
		}
	})
}

// Every scheduler on an empty list, and on a list where every weight is 0,
// returns -1 ("no destination available"), except random, which knows no
// weights.
func TestSchedulersNoDestination(t *testing.T) {
	for _, name := range SchedulerNames {
		s := mustScheduler(t, name, flagsFor(name))
		if got := s.Pick(nil, anyFlow); got != -1 {
			t.Errorf("%s: Pick(no endpoints) = %d, want -1", name, got)
		}
		if name == "random" {
			continue
		}
		if got := s.Pick(weighted(0, 0, 0), anyFlow); got != -1 {
			t.Errorf("%s: Pick(all weights 0) = %d, want -1", name, got)
		}
	}
}

// Picks and list changes from many goroutines at once (run with -race).
func TestSchedulersConcurrent(t *testing.T) {
	lists := [][]Endpoint{testEndpoints(3), testEndpoints(5), weighted(2, 1, 0, 3)}
	for _, name := range SchedulerNames {
		t.Run(name, func(t *testing.T) {
			s := mustScheduler(t, name, flagsFor(name))
			if name == "random" {
				s = NewRandomScheduler(NewLottery(8), NewSeededSource(1))
			}
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					for i := range 300 {
						eps := lists[(g+i/50)%len(lists)]
						if i%50 == 0 {
							if err := s.Update(eps); err != nil {
								t.Error(err)
							}
						}
						f := Flow{Client: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(g), byte(i)}), uint16(i)), Service: anyFlow.Service}
						if got := s.Pick(eps, f); got < -1 || got >= len(eps) {
							t.Errorf("Pick = %d for %d endpoints", got, len(eps))
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// A pick allocates nothing once the scheduler has seen the list.
func TestSchedulersPickAllocatesNothing(t *testing.T) {
	eps := testEndpoints(10)
	for i := range eps {
		eps[i].Conns = counted(i%3, i%5)
	}
	for _, name := range SchedulerNames {
		s := mustScheduler(t, name, flagsFor(name))
		if err := s.Update(eps); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() { s.Pick(eps, anyFlow) }); n != 0 {
			t.Errorf("%s: %v allocations per pick", name, n)
		}
	}
}

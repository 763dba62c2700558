package balancer

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

func endpointKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("10.0.%d.%d:8080", i/250, i%250+1)
	}
	return keys
}

func BenchmarkLotteryPick(b *testing.B) {
	for _, n := range []int{3, 100} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			l := NewLottery(n)
			var src RuntimeSource
			b.ReportAllocs()
			for b.Loop() {
				l.Pick(n, src)
			}
		})
	}
}

func BenchmarkPickerPick(b *testing.B) {
	for _, n := range []int{3, 100} {
		keys := endpointKeys(n)
		b.Run(fmt.Sprintf("n=%d/affinity=none", n), func(b *testing.B) {
			p := NewPicker(NewLottery(n), RuntimeSource{}, nil)
			client := netip.MustParseAddr("10.1.0.1")
			b.ReportAllocs()
			for b.Loop() {
				p.Pick(keys, client)
			}
		})
		// One client that keeps coming back: every pick is an affinity
		// hit on one of the lists plus the --set refresh.
		b.Run(fmt.Sprintf("n=%d/affinity=hit", n), func(b *testing.B) {
			p := NewPicker(NewLottery(n), RuntimeSource{}, NewAffinity(AffinityConfig{Timeout: time.Hour}))
			client := netip.MustParseAddr("10.1.0.1")
			p.Pick(keys, client)
			b.ReportAllocs()
			for b.Loop() {
				p.Pick(keys, client)
			}
		})
		// 100 clients in rotation (the lists' capacity): each pick checks
		// the lists in order until the client's endpoint.
		b.Run(fmt.Sprintf("n=%d/affinity=100clients", n), func(b *testing.B) {
			p := NewPicker(NewLottery(n), RuntimeSource{}, NewAffinity(AffinityConfig{Timeout: time.Hour}))
			clients := make([]netip.Addr, 100)
			for i := range clients {
				clients[i] = netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 1)})
				p.Pick(keys, clients[i])
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				p.Pick(keys, clients[i%len(clients)])
				i++
			}
		})
	}
}

// BenchmarkAffinityCheck: a hit on the third list, with the system clock
// and with a clock that costs nothing to read (as the coarse clock that
// `userproxy run` passes, ticked every 10 ms like the kernel's jiffies).
func BenchmarkAffinityCheck(b *testing.B) {
	for _, c := range []struct {
		name  string
		clock Clock
	}{{"system-clock", SystemClock{}}, {"coarse-clock", newManualClock()}} {
		b.Run(c.name, func(b *testing.B) {
			keys := endpointKeys(3)
			a := NewAffinity(AffinityConfig{Timeout: time.Hour, Clock: c.clock})
			client := netip.MustParseAddr("10.1.0.1")
			a.Set(keys[2], client)
			b.ReportAllocs()
			for b.Loop() {
				a.Check(keys, client)
			}
		})
	}
}

// BenchmarkSchedulerPick: one pick per iteration from a scheduler that has
// seen the list, each endpoint carrying some connections; clients vary so
// that the hash schedulers read the whole table.
func BenchmarkSchedulerPick(b *testing.B) {
	for _, name := range SchedulerNames {
		for _, n := range []int{3, 100} {
			b.Run(fmt.Sprintf("%s/n=%d", name, n), func(b *testing.B) {
				eps := testEndpoints(n)
				for i := range eps {
					eps[i].Conns = counted(i%7, i%5)
				}
				s := mustScheduler(b, name, "")
				if err := s.Update(eps); err != nil {
					b.Fatal(err)
				}
				clients := randomClients(1, 1024)
				f := anyFlow
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					f.Client = clients[i%len(clients)]
					s.Pick(eps, f)
					i++
				}
			})
		}
	}
}

// BenchmarkMHTableBuild: the cost of a list change under mh (the kernel's
// ip_vs_mh_reassign), paid once per change.
func BenchmarkMHTableBuild(b *testing.B) {
	for _, n := range []int{3, 10, 100, 1000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			eps := testEndpoints(n)
			s := newMH(0)
			b.ReportAllocs()
			for b.Loop() {
				s.populate(eps, lastWeights(nil, eps))
			}
		})
	}
}

func BenchmarkHSipHash32(b *testing.B) {
	var v uint32
	for b.Loop() {
		v = hsiphash32(mhKey1, mhKey1, v)
	}
}

package balancer

import (
	"fmt"
	"net/netip"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// testEndpoints returns n endpoints 10.0.0.1:80, 10.0.0.2:80, ... of weight
// 1, each with its own counters.
func testEndpoints(n int) []Endpoint {
	eps := make([]Endpoint, n)
	for i := range eps {
		eps[i] = Endpoint{
			Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i / 250), byte(i%250 + 1)}), 80),
			Weight: 1,
			Conns:  &Conns{},
		}
	}
	return eps
}

// weighted returns len(weights) endpoints as testEndpoints, with the weights.
func weighted(weights ...int32) []Endpoint {
	eps := testEndpoints(len(weights))
	for i, w := range weights {
		eps[i].Weight = w
	}
	return eps
}

// counted returns a Conns holding active and inactive flows, reached the way
// the proxy will reach them: Open, then Activate.
func counted(active, inactive int) *Conns {
	c := &Conns{}
	for range active + inactive {
		c.Open()
	}
	for range active {
		c.Activate()
	}
	return c
}

// picks returns n successive picks of s over eps for one flow.
func picks(s Scheduler, eps []Endpoint, f Flow, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = s.Pick(eps, f)
	}
	return out
}

var anyFlow = Flow{
	Client:  netip.MustParseAddrPort("10.1.0.1:40000"),
	Service: netip.MustParseAddrPort("10.96.0.10:80"),
}

// The counters follow IPVS: a new flow is inactive (the destination's
// conn_flags carry IP_VS_CONN_F_INACTIVE, ip_vs_ctl.c), ESTABLISHED makes it
// active and leaving ESTABLISHED inactive again (ip_vs_proto_tcp.c,
// set_tcp_state), and the overhead is active*256 + inactive
// (ip_vs_dest_conn_overhead).
func TestConnsTransitions(t *testing.T) {
	var c Conns
	type counts struct{ Active, Inactive int32 }
	get := func() counts { a, i := c.Load(); return counts{a, i} }
	steps := []struct {
		name string
		do   func()
		want counts
	}{
		{"open", c.Open, counts{0, 1}},
		{"open", c.Open, counts{0, 2}},
		{"established", c.Activate, counts{1, 1}},
		{"established", c.Activate, counts{2, 0}},
		{"fin", c.Deactivate, counts{1, 1}},
		{"close inactive", func() { c.Close(false) }, counts{1, 0}},
		{"close active", func() { c.Close(true) }, counts{0, 0}},
	}
	for _, s := range steps {
		s.do()
		if diff := cmp.Diff(s.want, get()); diff != "" {
			t.Fatalf("after %s (-want +got):\n%s", s.name, diff)
		}
	}
	if got := counted(3, 5).Overhead(); got != 3*256+5 {
		t.Errorf("overhead of 3 active, 5 inactive = %d, want %d", got, 3*256+5)
	}
	var nilConns *Conns
	if a, i := nilConns.Load(); a != 0 || i != 0 || nilConns.Overhead() != 0 {
		t.Errorf("nil Conns counts %d/%d, overhead %d; want nothing", a, i, nilConns.Overhead())
	}
}

// Transitions from many goroutines at once leave exact counts: each is one
// atomic add on the shared word (run with -race).
func TestConnsConcurrent(t *testing.T) {
	var c Conns
	const workers, flows = 8, 1000
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range flows {
				c.Open()
				c.Activate()
				if j%2 == 0 {
					c.Deactivate()
					c.Close(false)
				}
			}
		})
	}
	wg.Wait()
	a, i := c.Load()
	if a != workers*flows/2 || i != 0 {
		t.Errorf("counts %d active / %d inactive, want %d / 0", a, i, workers*flows/2)
	}
}

func ExampleConns() {
	var c Conns
	c.Open()     // SYN: a new flow, inactive
	c.Activate() // ESTABLISHED
	c.Open()     // a second flow, still in its handshake
	a, i := c.Load()
	fmt.Println(a, i, c.Overhead())
	// Output: 1 1 257
}

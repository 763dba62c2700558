package balancer

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// How the expected buckets below are worked out. ip_vs_sh_hashkey and
// ip_vs_dh_hashkey keep (x * 2654435761) & 255, and 2654435761 is
// 0x9E3779B1, so the bucket is (low byte of x) * 0xB1 mod 256, 0xB1 = 177:
//
//	10.1.0.1 -> x low byte 0x01 -> 177 * 1 mod 256 = 177
//	10.1.0.2 -> 0x02 -> 354 mod 256 = 98
//	10.1.0.3 -> 0x03 -> 531 mod 256 = 19
//	10.96.0.10 -> 0x0a -> 1770 mod 256 = 234
//
// and with weights 1 bucket b holds the (b mod n)-th endpoint.

func TestFoldAddr(t *testing.T) {
	cases := []struct {
		addr string
		want uint32
	}{
		{"10.1.0.1", 0x0a010001},
		{"192.168.7.200", 0xc0a807c8},
		// The exclusive or of the four words: 0x20010db8 ^ 0x00010002 ^
		// 0x00030004 ^ 0x00050006.
		{"2001:db8:1:2:3:4:5:6", 0x20060db8},
		{"fd00::1", 0xfd000001},
		// IPv4-mapped is IPv6: 0x0000ffff ^ 0x0a010001.
		{"::ffff:10.1.0.1", 0x0a01fffe},
	}
	for _, c := range cases {
		if got := foldAddr(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("foldAddr(%s) = %#x, want %#x", c.addr, got, c.want)
		}
	}
}

// ip_vs_sh_reassign: bucket by bucket, each endpoint in list order for as
// many buckets as its weight, cycling; weight 0 still takes one.
func TestSHTableFill(t *testing.T) {
	cases := []struct {
		weights []int32
		cycle   []int32 // the repeating pattern of the buckets
	}{
		{[]int32{1}, []int32{0}},
		{[]int32{1, 1, 1}, []int32{0, 1, 2}},
		{[]int32{2, 1}, []int32{0, 0, 1}},
		{[]int32{3, 0, 1}, []int32{0, 0, 0, 1, 2}},
		{[]int32{1, 1, 1, 1, 1, 1, 1}, []int32{0, 1, 2, 3, 4, 5, 6}},
	}
	for _, c := range cases {
		s := mustScheduler(t, "sh", "").(*sh)
		tab := s.tables.get(weighted(c.weights...), fillSH)
		for b, got := range tab.buckets {
			if want := c.cycle[b%len(c.cycle)]; got != want {
				t.Errorf("weights %v: bucket %d holds %d, want %d", c.weights, b, got, want)
				break
			}
		}
	}
	// Shares for weights 1: 256 = q*n + r buckets, so the first r
	// endpoints hold q+1 and the others q.
	for n := 1; n <= 10; n++ {
		s := mustScheduler(t, "sh", "").(*sh)
		tab := s.tables.get(testEndpoints(n), fillSH)
		count := make([]int, n)
		for _, d := range tab.buckets {
			count[d]++
		}
		q, r := hashTabSize/n, hashTabSize%n
		for i, c := range count {
			if want := q + boolInt(i < r); c != want {
				t.Errorf("n=%d: endpoint %d holds %d buckets, want %d", n, i, c, want)
			}
		}
	}
	// An empty list: every bucket NULL.
	s := mustScheduler(t, "sh", "").(*sh)
	for b, d := range s.tables.get(nil, fillSH).buckets {
		if d != -1 {
			t.Fatalf("empty list: bucket %d holds %d", b, d)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

type hashCase struct {
	why     string
	weights []int32
	flags   string
	client  string // addr:port
	service string // addr:port; 10.96.0.10:80 when empty
	want    int
}

func runHashCases(t *testing.T, name string, cases []hashCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.why, func(t *testing.T) {
			s := mustScheduler(t, name, c.flags)
			svc := c.service
			if svc == "" {
				svc = "10.96.0.10:80"
			}
			f := Flow{Client: netip.MustParseAddrPort(c.client), Service: netip.MustParseAddrPort(svc)}
			if got := s.Pick(weighted(c.weights...), f); got != c.want {
				t.Errorf("%s %s: client %s, service %s, weights %v: %d, want %d", name, c.flags, c.client, svc, c.weights, got, c.want)
			}
		})
	}
}

var ones3, ones4 = []int32{1, 1, 1}, []int32{1, 1, 1, 1}

// ip_vs_sh.c for given addresses; each expected value is the bucket worked
// out above, mod n (or the weighted pattern).
func TestSHPicks(t *testing.T) {
	runHashCases(t, "sh", []hashCase{
		{"10.1.0.1 bucket 177, 177%3=0", ones3, "", "10.1.0.1:40000", "", 0},
		{"10.1.0.2 bucket 98, 98%3=2", ones3, "", "10.1.0.2:40000", "", 2},
		{"10.1.0.3 bucket 19, 19%3=1", ones3, "", "10.1.0.3:40000", "", 1},
		{"10.1.0.1 of 4: 177%4=1", ones4, "", "10.1.0.1:40000", "", 1},
		{"10.1.0.2 of 4: 98%4=2", ones4, "", "10.1.0.2:40000", "", 2},
		{"10.1.0.3 of 4: 19%4=3", ones4, "", "10.1.0.3:40000", "", 3},
		{"port ignored without sh-port", ones3, "", "10.1.0.1:1", "", 0},
		{"only the low byte counts", ones3, "", "192.168.7.1:40000", "", 0},
		{"service ignored", ones3, "", "10.1.0.1:40000", "10.96.0.99:53", 0},
		// fd00::1 folds to 0xfd000001: bucket 177.
		{"IPv6 fd00::1", ones3, "", "[fd00::1]:40000", "[fd00::10]:80", 0},
		// 2001:db8::5 folds to 0x20010dbd: 0xbd = 189, 189*177 = 33453,
		// mod 256 = 173, 173%3 = 2.
		{"IPv6 2001:db8::5", ones3, "", "[2001:db8::5]:40000", "[fd00::10]:80", 2},
		// sh-port: 40000 = 0x9c40, + 0x0a010001 has low byte 0x41 = 65;
		// 65*177 = 11505, mod 256 = 241, 241%3 = 1.
		{"sh-port 40000", ones3, "sh-port", "10.1.0.1:40000", "", 1},
		// 0x42 = 66: 66*177 = 11682, mod 256 = 162, 162%3 = 0.
		{"sh-port 40001", ones3, "sh-port", "10.1.0.1:40001", "", 0},
		// 0xffff + 0x0a010001 = 0x0a020000: low byte 0, bucket 0.
		{"sh-port carry", ones3, "sh-port", "10.1.0.1:65535", "", 0},
		// Weights 2, 1: the buckets go A A B; 177%3 = 0 is A, 98%3 = 2
		// is B, 19%3 = 1 is A.
		{"weights 2,1: 10.1.0.1", []int32{2, 1}, "", "10.1.0.1:40000", "", 0},
		{"weights 2,1: 10.1.0.2", []int32{2, 1}, "", "10.1.0.2:40000", "", 1},
		{"weights 2,1: 10.1.0.3", []int32{2, 1}, "", "10.1.0.3:40000", "", 0},
		// Weights 1, 0, 1 fill as 1, 1, 1 (weight 0 takes a bucket too):
		// 10.1.0.3's bucket 19 holds endpoint 1, unavailable.
		{"bucket of weight 0: no destination", []int32{1, 0, 1}, "", "10.1.0.3:40000", "", -1},
		// sh-fallback: offset 0 gives roffset = 19 and bucket
		// (19 + 19) & 255 = 38, 38%3 = 2.
		{"sh-fallback, one step", []int32{1, 0, 1}, "sh-fallback", "10.1.0.3:40000", "", 2},
		// ihash 177 holds 0 (weight 0); roffset 177: bucket 354&255 = 98
		// holds 2 (weight 0); roffset 178: 99 holds 0; roffset 179: 100
		// holds 1.
		{"sh-fallback, three steps", []int32{0, 1, 0}, "sh-fallback", "10.1.0.1:40000", "", 1},
		{"one endpoint", []int32{1}, "", "10.1.0.2:40000", "", 0},
	})
}

// ip_vs_dh.c: the table ignores weights (bucket b holds b mod n) and the hash
// is of the destination address, the Service's: every client of one
// ClusterIP goes to the same endpoint.
func TestDHPicks(t *testing.T) {
	runHashCases(t, "dh", []hashCase{
		{"10.96.0.10 bucket 234, 234%3=0", ones3, "", "10.1.0.1:40000", "10.96.0.10:80", 0},
		{"another client, same endpoint", ones3, "", "10.1.0.2:50000", "10.96.0.10:80", 0},
		{"port ignored", ones3, "", "10.1.0.2:50000", "10.96.0.10:8080", 0},
		{"of 4: 234%4=2", ones4, "", "10.1.0.1:40000", "10.96.0.10:80", 2},
		{"of 5: 234%5=4", []int32{1, 1, 1, 1, 1}, "", "10.1.0.1:40000", "10.96.0.10:80", 4},
		{"10.96.0.1: bucket 177, 177%4=1", ones4, "", "10.1.0.1:40000", "10.96.0.1:443", 1},
		// Weights play no part in the table: still bucket 234 -> 0.
		{"weights ignored", []int32{5, 1, 1}, "", "10.1.0.1:40000", "10.96.0.10:80", 0},
		{"weight 0: no destination", []int32{0, 1, 1}, "", "10.1.0.1:40000", "10.96.0.10:80", -1},
		// fd00:10:96::a folds to 0xfd000010 ^ 0x00960000 ^ 0x0000000a,
		// low byte 0x1a = 26: 26*177 = 4602, mod 256 = 250, 250%3 = 1.
		{"IPv6 service", ones3, "", "[fd00::1]:40000", "[fd00:10:96::a]:80", 1},
	})
}

// The tables are rebuilt when the list changes, and only then.
func TestHashTablesFollowTheList(t *testing.T) {
	for _, name := range []string{"sh", "dh"} {
		s := mustScheduler(t, name, "")
		f := Flow{Client: netip.MustParseAddrPort("10.1.0.1:40000"), Service: netip.MustParseAddrPort("10.96.0.1:80")}
		// Bucket 177 for both hashes: 177%3 = 0, 177%4 = 1.
		three, four := testEndpoints(3), testEndpoints(4)
		got := []int{s.Pick(three, f), s.Pick(four, f), s.Pick(three, f)}
		if diff := cmp.Diff([]int{0, 1, 0}, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
}

func ExampleParseScheduler() {
	cfg, err := ParseScheduler("sh", "sh-port")
	if err != nil {
		panic(err)
	}
	s := cfg.New(nil)
	eps := make([]Endpoint, 3)
	for i := range eps {
		eps[i] = Endpoint{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(i + 1)}), 8080), Weight: 1}
	}
	for _, port := range []uint16{40000, 40001} {
		f := Flow{Client: netip.AddrPortFrom(netip.MustParseAddr("10.1.0.1"), port)}
		fmt.Println(cfg, port, "->", eps[s.Pick(eps, f)].Addr)
	}
	// Output:
	// sh sh-port 40000 -> 10.244.0.2:8080
	// sh sh-port 40001 -> 10.244.0.1:8080
}

package service_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/service"
)

func addrFrom(base netip.Addr, off uint32) netip.Addr {
	b := base.As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+off)
	return netip.AddrFrom4(b)
}

var (
	benchSvcBase = netip.MustParseAddr("10.96.0.0")
	benchEpBase  = netip.MustParseAddr("10.128.0.0")
)

// benchObjects returns n services with one TCP port each and, per service,
// one EndpointSlice of perSvc ready endpoints.
func benchObjects(n, perSvc int) ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*v1.Service, n)
	sls := make([]*discoveryv1.EndpointSlice, n)
	for i := range n {
		name := fmt.Sprintf("svc-%d", i)
		svcs[i] = svc("bench/"+name, addrFrom(benchSvcBase, uint32(i)).String(), ports(tcp("http", 80, intstr.FromInt32(8080))))
		eps := make([]discoveryv1.Endpoint, perSvc)
		for j := range perSvc {
			eps[j] = ep(addrFrom(benchEpBase, uint32(i*perSvc+j)).String(), onNode(fmt.Sprintf("node-%d", j)))
		}
		sls[i] = slice("bench/"+name+"-abcde", name, discoveryv1.AddressTypeIPv4, eports(eport("http", v1.ProtocolTCP, 8080)), eps...)
	}
	return svcs, sls
}

func feed(tr *service.Tracker, svcs []*v1.Service, sls []*discoveryv1.EndpointSlice) {
	for _, s := range svcs {
		tr.OnServiceAdd(s)
	}
	for _, s := range sls {
		tr.OnEndpointSliceAdd(s)
	}
}

// BenchmarkTableBuild measures a full table of 10,000 services x 10
// endpoints: "events+build" from the first event to the published table,
// "build" only the build OnSynced triggers. Target: under 100 ms.
func BenchmarkTableBuild(b *testing.B) {
	svcs, sls := benchObjects(10000, 10)
	b.Run("10000x10/events+build", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tr, _ := service.NewTracker(service.Config{NodeName: "node-0", Clock: service.NewManualClock(epoch)})
			feed(tr, svcs, sls)
			tr.OnSynced()
			if tr.Current().Len() != 10000 {
				b.Fatal("wrong table")
			}
		}
	})
	b.Run("10000x10/build", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			b.StopTimer()
			tr, _ := service.NewTracker(service.Config{NodeName: "node-0", Clock: service.NewManualClock(epoch)})
			feed(tr, svcs, sls)
			b.StartTimer()
			tr.OnSynced()
		}
	})
}

// BenchmarkEndpointChange measures one EndpointSlice update (one endpoint
// replaced) in a table of 10,000 services x 10 endpoints, from the event to
// the published table. Target: under 1 ms.
func BenchmarkEndpointChange(b *testing.B) {
	svcs, sls := benchObjects(10000, 10)
	tr, _ := service.NewTracker(service.Config{NodeName: "node-0", Clock: service.NewManualClock(epoch)})
	feed(tr, svcs, sls)
	tr.OnSynced()
	// Two versions of slice 5000, differing in one endpoint.
	a := sls[5000]
	c := a.DeepCopy()
	c.Endpoints[3].Addresses = []string{"10.250.0.1"}
	versions := [2]*discoveryv1.EndpointSlice{c, a}
	gen := tr.Current().Generation()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		tr.OnEndpointSliceUpdate(versions[(i+1)%2], versions[i%2])
		i++
	}
	if tr.Current().Generation() != gen+uint64(i) {
		b.Fatalf("%d changes made %d tables", i, tr.Current().Generation()-gen)
	}
}

// BenchmarkLookup measures Table.Lookup of a service port with 1 and
// 10,000 services in the table. Target: independent of the count, 0 allocs.
func BenchmarkLookup(b *testing.B) {
	for _, n := range []int{1, 10000} {
		svcs, sls := benchObjects(n, 10)
		tr, _ := service.NewTracker(service.Config{Clock: service.NewManualClock(epoch)})
		feed(tr, svcs, sls)
		tr.OnSynced()
		tbl := tr.Current()
		ip := addrFrom(benchSvcBase, uint32(n/2))
		b.Run(fmt.Sprintf("services=%d/hit", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, v := tbl.Lookup(service.TCP, ip, 80); v != service.Forward {
					b.Fatal(v)
				}
			}
		})
		b.Run(fmt.Sprintf("services=%d/unknown-port", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, v := tbl.Lookup(service.TCP, ip, 81); v != service.UnknownPort {
					b.Fatal(v)
				}
			}
		})
		tr.Close()
	}
}

// TestLookupAllocs keeps the 0-allocation promise as a test, not only a
// benchmark figure.
func TestLookupAllocs(t *testing.T) {
	svcs, sls := benchObjects(100, 3)
	tr := syncedTracker(t, service.Config{})
	feed(tr, svcs, sls)
	tbl := tr.Current()
	hit, miss := addrFrom(benchSvcBase, 7), netip.MustParseAddr("192.0.2.1")
	n := testing.AllocsPerRun(1000, func() {
		tbl.Lookup(service.TCP, hit, 80)
		tbl.Lookup(service.UDP, hit, 80)
		tbl.Lookup(service.TCP, miss, 80)
	})
	if n != 0 {
		t.Fatalf("Lookup allocates %v times per run", n)
	}
	if _, v := tbl.Lookup(service.TCP, hit, 80); v != service.Forward {
		t.Fatalf("hit: %v", v)
	}
}

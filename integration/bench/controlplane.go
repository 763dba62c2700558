package main

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/service"
)

// tableObjects are n services with one TCP port and one EndpointSlice of
// ten ready endpoints each, as the API server would hand them over.
func tableObjects(n int) ([]*v1.Service, []*discoveryv1.EndpointSlice) {
	svcs := make([]*v1.Service, n)
	sls := make([]*discoveryv1.EndpointSlice, n)
	ready := true
	for i := range n {
		name := manyName(i)
		svcs[i] = &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceTypeClusterIP, ClusterIP: manyIP(i), ClusterIPs: []string{manyIP(i)},
				Ports: []v1.ServicePort{{Name: "p", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}
		eps := make([]discoveryv1.Endpoint, endpoints)
		for j := range eps {
			a := [4]byte{10, 128, 0, 0}
			binary.BigEndian.PutUint32(a[:], binary.BigEndian.Uint32(a[:])+uint32(i*endpoints+j))
			eps[j] = discoveryv1.Endpoint{
				Addresses:  []string{fmt.Sprintf("%d.%d.%d.%d", a[0], a[1], a[2], a[3])},
				Conditions: discoveryv1.EndpointConditions{Ready: &ready},
			}
		}
		port, proto, pname := int32(8080), v1.ProtocolTCP, "p"
		sls[i] = &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "bench", Name: name + "-1",
				Labels: map[string]string{discoveryv1.LabelServiceName: name}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   eps,
			Ports:       []discoveryv1.EndpointPort{{Name: &pname, Protocol: &proto, Port: &port}},
		}
	}
	return svcs, sls
}

// tableBuild returns medians over reps for n services x 10 endpoints:
// build is OnSynced to the published table (the sync itself), total is
// from the first event to the published table (every object converted and
// delivered before the sync, as after an informer's initial list); and the
// median time one endpoint change takes to publish a new table.
func tableBuild(n, reps int) (build, total, change time.Duration, err error) {
	svcs, sls := tableObjects(n)
	var builds, totals []float64
	var tr *service.Tracker
	for range reps {
		runtime.GC()
		start := time.Now()
		tr, err = service.NewTracker(service.Config{NodeName: "bench-node"})
		if err != nil {
			return 0, 0, 0, err
		}
		for _, s := range svcs {
			tr.OnServiceAdd(s)
		}
		for _, s := range sls {
			tr.OnEndpointSliceAdd(s)
		}
		synced := time.Now()
		tr.OnSynced()
		builds = append(builds, float64(time.Since(synced)))
		totals = append(totals, float64(time.Since(start)))
		if got := tr.Current().Len(); got != n {
			tr.Close()
			return 0, 0, 0, fmt.Errorf("table of %d services has %d ports", n, got)
		}
		tr.Close()
	}
	tr, err = service.NewTracker(service.Config{NodeName: "bench-node"})
	if err != nil {
		return 0, 0, 0, err
	}
	defer tr.Close()
	for _, s := range svcs {
		tr.OnServiceAdd(s)
	}
	for _, s := range sls {
		tr.OnEndpointSliceAdd(s)
	}
	tr.OnSynced()
	a := sls[n/2]
	b := a.DeepCopy()
	b.Endpoints[3].Addresses = []string{"10.250.0.1"}
	versions := [2]*discoveryv1.EndpointSlice{b, a}
	var changes []float64
	for i := range 101 {
		gen := tr.Current().Generation()
		start := time.Now()
		tr.OnEndpointSliceUpdate(versions[(i+1)%2], versions[i%2])
		changes = append(changes, float64(time.Since(start)))
		if tr.Current().Generation() != gen+1 {
			return 0, 0, 0, fmt.Errorf("an endpoint change did not publish a table")
		}
	}
	return time.Duration(medianOf(builds)), time.Duration(medianOf(totals)), time.Duration(medianOf(changes)), nil
}

// conntrackEntryBytes fills a conntrack table with n confirmed UDP flows
// and returns the Go heap it grew by, per entry.
func conntrackEntryBytes(n int) (float64, error) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	tab, err := conntrack.NewTable(conntrack.Config{Max: n, SkipChecksums: true})
	if err != nil {
		return 0, err
	}
	pkt := make([]byte, 28)
	pkt[0], pkt[3], pkt[8], pkt[9] = 0x45, 28, 64, 17 // IPv4, length 28, TTL, UDP
	copy(pkt[12:16], []byte{192, 0, 2, 1})
	copy(pkt[16:20], []byte{10, 96, 1, 2})
	binary.BigEndian.PutUint16(pkt[22:], 53)
	binary.BigEndian.PutUint16(pkt[24:], 8)
	for i := range n {
		pkt[13], pkt[14] = byte(i>>16), byte(i>>8) // a distinct client per 256 ports
		binary.BigEndian.PutUint16(pkt[20:], uint16(1024+i%256))
		r := tab.Classify(pkt, conntrack.Original)
		if r.Verdict != conntrack.New {
			return 0, fmt.Errorf("flow %d: verdict %v (%v)", i, r.Verdict, r.Reason)
		}
		if err := tab.Confirm(&r); err != nil {
			return 0, fmt.Errorf("flow %d: %w", i, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if tab.Len() != n {
		return 0, fmt.Errorf("table holds %d of %d flows", tab.Len(), n)
	}
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n), nil
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

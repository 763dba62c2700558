package proxy

import (
	"fmt"
	"testing"

	"github.com/userproxy/userproxy/service"
)

// BenchmarkSetTableCold: a first table of 10,000 services x 10 endpoints
// handed to a proxy with no state yet (DESIGN.md section 7: the table
// itself builds in under 100 ms; this is what the proxy adds to it: one
// portState and ten dests per service port).
func BenchmarkSetTableCold(b *testing.B) {
	var tbl *service.Table
	tr, err := service.NewTracker(service.Config{OnSync: func(t *service.Table, _ service.Changes) { tbl = t }})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	for i := range 10000 {
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		name := fmt.Sprintf("s%d", i)
		tr.OnServiceAdd(svc(name, ip, "TCP", 80))
		addrs := make([]string, 10)
		for j := range addrs {
			addrs[j] = fmt.Sprintf("10.%d.%d.%d", 100+i/62500, (i/250)%250, (i%250)*10/10+j)
		}
		tr.OnEndpointSliceAdd(slice(name, name+"-1", "TCP", 8080, "", addrs...))
	}
	tr.OnSynced()
	if tbl == nil || tbl.Len() != 10000 {
		b.Fatalf("table of %d ports", tbl.Len())
	}
	b.ReportAllocs()
	for b.Loop() {
		p, err := New(Config{})
		if err != nil {
			b.Fatal(err)
		}
		p.SetTable(tbl, service.Changes{})
	}
}

package proxy

import "testing"

// TestEstimatorAsIPVS: ip_vs_est.c's fixed-point EWMA. 100 connections and
// 1000 bytes per 2 s interval are 50 conn/s and 500 B/s; each sample moves
// the estimate a quarter of the way (scaled by 2^10 and 2^5), and reads
// round as ip_vs_read_estimator does: cps 12, 22, 29, ... towards 50.
func TestEstimatorAsIPVS(t *testing.T) {
	var e estimator
	var total IPVSStats
	e.sample(&total) // the first sample only sets the baseline
	wantCPS := []uint64{12, 22, 29, 34, 38}
	for i, want := range wantCPS {
		total.Conns += 100
		total.InBytes += 1000
		e.sample(&total)
		var got IPVSStats
		e.read(&got)
		if got.CPS != want {
			t.Fatalf("sample %d: cps %d, want %d", i+1, got.CPS, want)
		}
	}
	for range 60 {
		total.Conns += 100
		total.InBytes += 1000
		e.sample(&total)
	}
	var got IPVSStats
	e.read(&got)
	if got.CPS != 50 || got.InBPS != 500 || got.OutBPS != 0 || got.InPPS != 0 {
		t.Fatalf("steady state: %+v, want 50 conn/s and 500 B/s in", got)
	}
	// Traffic stops: the estimate decays to zero.
	for range 60 {
		e.sample(&total)
	}
	e.read(&got)
	if got.CPS != 0 || got.InBPS != 0 {
		t.Fatalf("after traffic stopped: %+v", got)
	}
}

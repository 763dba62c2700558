package conntrack

import (
	"testing"
	"time"
)

func TestClocks(t *testing.T) {
	sc := NewSystemClock()
	a := sc.Now()
	if b := sc.Now(); b < a || a < 0 {
		t.Errorf("SystemClock went from %d to %d", a, b)
	}

	cc := NewCoarseClock()
	if cc.Now() != 0 {
		t.Errorf("CoarseClock reads %d before any Tick", cc.Now())
	}
	v := cc.Tick()
	if cc.Now() != v || v < 0 {
		t.Errorf("Tick returned %d, Now reads %d", v, cc.Now())
	}
	if w := cc.Tick(); w < v || cc.Now() != w {
		t.Errorf("second Tick %d after %d, Now %d", w, v, cc.Now())
	}

	mc := NewManualClock(100)
	mc.Advance(time.Second)
	mc.Advance(-time.Hour)
	if mc.Now() != 100+int64(time.Second) {
		t.Errorf("ManualClock reads %d", mc.Now())
	}
}

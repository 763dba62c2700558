package service_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/userproxy/userproxy/service"
)

func TestManualClock(t *testing.T) {
	clk := service.NewManualClock(epoch)
	var fired []string
	at := func(name string) func() {
		return func() { fired = append(fired, name+"@"+clk.Now().Sub(epoch).String()) }
	}
	clk.AfterFunc(2*time.Second, at("b"))
	clk.AfterFunc(time.Second, at("a"))
	stopped := clk.AfterFunc(1500*time.Millisecond, at("never"))
	// A callback that schedules another timer within the same Advance.
	clk.AfterFunc(1200*time.Millisecond, func() { clk.AfterFunc(100*time.Millisecond, at("chained")) })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop must report true once")
	}
	clk.Advance(1999 * time.Millisecond)
	clk.Advance(time.Millisecond)
	want := []string{"a@1s", "chained@1.3s", "b@2s"}
	if diff := cmp.Diff(want, fired); diff != "" {
		t.Errorf("fired (-want +got):\n%s", diff)
	}
	if got := clk.Now(); !got.Equal(epoch.Add(2 * time.Second)) {
		t.Errorf("Now = %v", got)
	}
	if clk.Pending() != 0 {
		t.Errorf("%d timers pending", clk.Pending())
	}
}

func TestStringers(t *testing.T) {
	got := []string{
		service.TCP.String(), service.UDP.String(), service.Protocol(1).String(),
		service.IPv4.String(), service.IPv6.String(),
		service.PortName{Namespace: "ns", Name: "web", Port: "http"}.String(),
		service.PortName{Namespace: "ns", Name: "web"}.String(),
		service.ServiceName{Namespace: "ns", Name: "web"}.String(),
		service.Forward.String(), service.NotService.String(), service.NoLocalEndpoints.String(),
		service.Endpoint{Addr: addrPort(t, "[fd00::1]:80")}.Key(),
	}
	want := []string{
		"TCP", "UDP", "proto(1)",
		"IPv4", "IPv6",
		"ns/web:http", "ns/web", "ns/web",
		"Forward", "NotService", "NoLocalEndpoints",
		"[fd00::1]:80",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	for v, want := range map[service.Verdict][2]bool{
		service.NotService: {true, false}, service.UnknownPort: {true, false}, service.NoEndpoints: {true, false},
		service.NoLocalEndpoints: {false, true}, service.Forward: {false, false},
	} {
		if v.Reject() != want[0] || v.Drop() != want[1] {
			t.Errorf("%v: Reject %v Drop %v", v, v.Reject(), v.Drop())
		}
	}
}

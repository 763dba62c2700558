package main

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// ipvs asks the admin server of a running proxy (here one on a loopback
// port with a fixed snapshot) and prints its answer as it is.
func TestIPVSFromAdminServer(t *testing.T) {
	snapshot := func() []proxy.VirtualService {
		return []proxy.VirtualService{{
			Protocol: service.UDP, Addr: netip.MustParseAddrPort("10.96.0.10:53"),
			Scheduler: balancer.SchedulerConfig{Name: "rr"},
			Dests: []proxy.Destination{{Addr: netip.MustParseAddrPort("10.244.0.7:53"), Weight: 1, InActConn: 2,
				Stats: proxy.IPVSStats{Conns: 9, InBPS: 640}}},
		}}
	}
	srv := admin.New(admin.Config{IPVS: snapshot})
	ln, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.ServeListener(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeListener: %v", err)
		}
	}()
	for _, tt := range []struct {
		flags []string
		want  string
	}{
		{nil, "UDP  10.96.0.10:53 rr\n  -> 10.244.0.7:53                Masq    1      0          2         \n"},
		{[]string{"--stats"}, "  -> 10.244.0.7:53                       9        0        0        0        0\n"},
		{[]string{"--rate"}, "  -> 10.244.0.7:53                       0        0        0      640        0\n"},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"ipvs", "--admin-addr", ln.Addr().String()}, tt.flags...)
		if err := runMain(ctx, args, &out, &errOut); err != nil {
			t.Errorf("%v: %v\n%s", args, err, errOut.String())
			continue
		}
		if !strings.HasPrefix(out.String(), "IP Virtual Server version 1.2.1 (size=4096)\n") || !strings.HasSuffix(out.String(), tt.want) {
			t.Errorf("%v printed:\n%s\nwant it to end in:\n%s", tt.flags, out.String(), tt.want)
		}
	}
}

// Without a proxy to ask, ipvs says so.
func TestIPVSWithoutProxy(t *testing.T) {
	ln, err := admin.New(admin.Config{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	var out, errOut bytes.Buffer
	err = runMain(context.Background(), []string{"ipvs", "--admin-addr", addr}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), errNoAdmin.Error()) {
		t.Errorf("ipvs without a proxy: %v", err)
	}
}

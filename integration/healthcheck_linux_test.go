package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A cloud load balancer's view of a node (issue 17): an HTTP GET every
// 100 ms, from another namespace, on the health check node port of an
// externalTrafficPolicy: Local Service (kube-proxy's service_health.go). It
// must see 503 within one sync of the node's last local endpoint leaving,
// and 200 within one sync of its return.
//
//	prober ns: 192.0.2.2/24 --veth-- node ns: 192.0.2.1/24, userproxy run
//	                                   --nodeport-addresses 192.0.2.1/32

func hcConfig(hc int, local bool) string {
	node := "node-b"
	if local {
		node = "node-a"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: lb, namespace: default}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.60
  externalTrafficPolicy: Local
  healthCheckNodePort: %d
  ports: [{name: http, protocol: TCP, port: 80, nodePort: 30060}]
`, hc) + sliceYAML("lb-1", "lb", netip.MustParseAddrPort("10.244.1.5:8080"), node)
}

func TestBinaryHealthCheckNodePortProbe(t *testing.T) {
	requireRoot(t)
	bin := userproxyBinary(t)
	nodeNS, nodeName := newNetNS(t)
	proberNS, _ := newNetNS(t)
	node := netip.MustParseAddr("192.0.2.1")
	spec := vethSpec{local: "pr0", peer: "nd0",
		localAddr: netip.MustParsePrefix("192.0.2.2/24"), peerAddr: netip.PrefixFrom(node, 24)}
	if err := spec.create(proberNS, nodeNS); err != nil {
		t.Fatal(err)
	}
	if err := inNS(nodeNS, func() error { _, err := linkUp("lo"); return err }); err != nil {
		t.Fatal(err)
	}
	prober := &nsClient{ns: proberNS, work: make(chan func())}
	startWorkers(t, prober)

	const hc = 32060
	cfg := filepath.Join(t.TempDir(), "hc.yaml")
	writeFile(t, cfg, hcConfig(hc, true))
	p := startProc(t, "ip", "netns", "exec", nodeName, bin, "run", "--config", cfg, "--tun-name", "upxhc0",
		"--node-name", "node-a", "--nodeport-addresses", node.String()+"/32",
		"--min-sync-period", "0", "--log-format", "json", "--log-level", "info")
	b := &binNS{t: t, ns: nodeNS, name: nodeName, c: &nsClient{ns: nodeNS, work: make(chan func())}}
	startWorkers(t, b.c)
	b.waitHealthy(p)

	// The load balancer's prober: GET every 100 ms, each answer kept with
	// its time, until stopped.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(_ context.Context, network, addr string) (net.Conn, error) { return prober.dial(network, addr) },
	}}
	url := fmt.Sprintf("http://%s:%d/healthz", node, hc)
	type answer struct {
		at   time.Time
		code int
	}
	var mu sync.Mutex
	var answers []answer
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the prober
		defer wg.Done()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for range 600 { // at most a minute
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			code := 0
			if resp, err := client.Get(url); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				code = resp.StatusCode
			}
			mu.Lock()
			answers = append(answers, answer{time.Now(), code})
			mu.Unlock()
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	// waitCode returns how long after since the prober first saw code.
	waitCode := func(code int, since time.Time) time.Duration {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			for _, a := range answers {
				if a.at.After(since) && a.code == code {
					mu.Unlock()
					return a.at.Sub(since)
				}
			}
			mu.Unlock()
		}
		t.Fatalf("the prober saw no %d within 10 s of %v", code, since)
		return 0
	}
	waitCode(200, time.Now().Add(-time.Minute)) // a local endpoint: healthy

	// The last local endpoint leaves (it moves to another node).
	leave := time.Now()
	writeFile(t, cfg, hcConfig(hc, false))
	down := waitCode(503, leave)
	// Back.
	back := time.Now()
	writeFile(t, cfg, hcConfig(hc, true))
	up := waitCode(200, back)
	t.Logf("probe every 100 ms: 503 %v after the local endpoint left, 200 %v after it came back", down.Round(time.Millisecond), up.Round(time.Millisecond))
	// One sync: the file source notices the change and the table is built
	// (--min-sync-period 0), plus a probe interval.
	for what, d := range map[string]time.Duration{"503": down, "200": up} {
		if d > 3*time.Second {
			t.Errorf("%s came %v after the change: more than one sync and a probe interval", what, d)
		}
	}
	if err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

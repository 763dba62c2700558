package kubeapi_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// TestPortForwarderThroughAPIServer drives source/kube's PortForwarder (the
// proxy's --dial-via apiserver dialer) through the real API server to the
// fake kubelet: each pod is reached by name; 100 concurrent flows to one
// pod share one tunnel; an unknown port is a read error carrying the
// kubelet's message; an idle tunnel closes; a killed kubelet breaks the open
// flow with an error (not a clean EOF), and once it is back the next dial
// opens a new tunnel.
func TestPortForwarderThroughAPIServer(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	ns := newNamespace(t, cs)
	const port = 8080
	backends := map[string]*echoServer{"pod-a": newEchoServer(t, "pod-a"), "pod-b": newEchoServer(t, "pod-b")}
	k, kcfg := podsBehindKubelet(t, cs, "pf-node", ns, port, map[string]string{"pod-a": backends["pod-a"].addr, "pod-b": backends["pod-b"].addr},
		netip.MustParseAddr("198.51.100.20"), kubeapi.KubeletConfig{})
	kubeletPort := k.Port()
	pf, err := kube.NewPortForwarder(kube.PortForwardConfig{REST: c.RESTConfig(c.AdminToken()), Idle: 500 * time.Millisecond,
		Logger: zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pf.Close)
	dial := func(pod string, p uint16) (net.Conn, *bufio.Reader, error) {
		dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		conn, err := pf.DialPod(dctx, service.PodRef{Namespace: ns, Name: pod}, p)
		if err != nil {
			return nil, nil, err
		}
		return conn, bufio.NewReader(conn), nil
	}
	// exchange reads the backend's name and echoes msg.
	exchange := func(conn net.Conn, r *bufio.Reader, msg string) (string, error) {
		name, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		if _, err := io.WriteString(conn, msg+"\n"); err != nil {
			return "", err
		}
		back, err := r.ReadString('\n')
		if err != nil || back != msg+"\n" {
			return "", errors.Join(err, errors.New("echo "+back))
		}
		return strings.TrimSpace(name), nil
	}

	// Each pod by name.
	for _, pod := range []string{"pod-a", "pod-b"} {
		conn, r, err := dial(pod, port)
		if err != nil {
			t.Fatal(err)
		}
		got, err := exchange(conn, r, "hi")
		if err != nil || got != pod {
			t.Fatalf("%s answered %q, %v", pod, got, err)
		}
		conn.(interface{ CloseWrite() error }).CloseWrite()
		if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
			t.Fatalf("after the half-close: %q, %v; want a clean EOF", rest, err)
		}
		conn.Close()
	}

	// 100 flows at once to pod-a: one tunnel.
	key := ns + "/pod-a"
	tunnels0 := k.Tunnels()[key]
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	conns := make(chan net.Conn, 100)
	for i := range 100 {
		wg.Go(func() {
			conn, r, err := dial("pod-a", port)
			if err != nil {
				errs <- err
				return
			}
			conns <- conn
			if _, err := exchange(conn, r, strings.Repeat("x", i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// At most one new tunnel: the first step's may still be open (Idle).
	if got := k.Tunnels()[key] - tunnels0; got > 1 {
		t.Errorf("100 concurrent flows opened %d tunnels to pod-a, want at most 1", got)
	}
	if got := pf.Tunnels()[key]; got != 100 {
		t.Errorf("pod-a's tunnel carries %d flows, want all 100 (%v)", got, pf.Tunnels())
	}
	if s := pf.Stats(); s.StreamsOpen != 100 {
		t.Errorf("streams open %d, want 100", s.StreamsOpen)
	}
	close(conns)
	for c := range conns {
		c.Close()
	}

	// An unknown port: the kubelet's message is the read error.
	conn, r, err := dial("pod-b", 9999)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.ReadString('\n')
	if err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "9999") {
		t.Errorf("read from an unknown port: %v, want the kubelet's error", err)
	}
	t.Logf("unknown port: %v", err)
	conn.Close()

	// Idle tunnels close.
	start := time.Now()
	for pf.Stats().Tunnels > 0 || k.OpenTunnels() > 0 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("tunnels still open 10 s after their last flow: %v, agent %d", pf.Tunnels(), k.OpenTunnels())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("idle tunnels closed %v after the last flow (Idle 500 ms)", time.Since(start).Round(time.Millisecond))
	if s := pf.Stats(); s.StreamsOpen != 0 || s.Streams != 103 {
		t.Errorf("with every flow closed: %+v; want 0 streams open of 103", s)
	}

	// The kubelet dies under an open flow: the flow fails with an error.
	conn, r, err = dial("pod-a", port)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exchange(conn, r, "before"); err != nil {
		t.Fatal(err)
	}
	k.Kill()
	killed := time.Now()
	readErr := make(chan error, 1)
	go func() { _, err := r.ReadString('\n'); readErr <- err }()
	select {
	case err := <-readErr:
		if err == nil || errors.Is(err, io.EOF) {
			t.Errorf("read after the kubelet died: %v, want an error other than EOF", err)
		}
		t.Logf("read after the kubelet died, %v later: %v", time.Since(killed).Round(time.Millisecond), err)
	case <-time.After(40 * time.Second):
		t.Fatal("the flow did not fail within 40 s of the kubelet's death")
	}
	conn.Close()

	// Back on the same port: the next dial works.
	ln2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(kubeletPort)))
	if err != nil {
		t.Fatal(err)
	}
	kcfg.Listener = ln2
	k2, err := kubeapi.StartKubelet(kcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k2.Close() })
	start = time.Now()
	for {
		conn, r, err := dial("pod-a", port)
		if err == nil {
			got, err2 := exchange(conn, r, "after")
			conn.Close()
			if err2 == nil && got == "pod-a" {
				break
			}
			err = err2
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("no flow 30 s after the kubelet came back: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("a flow through the restarted kubelet %v after it came back; stats %+v", time.Since(start).Round(time.Millisecond), pf.Stats())
}

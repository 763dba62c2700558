//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const (
	connections = 1000
	adminAddr   = "127.0.0.1:10249"
)

func main() {
	if err := quickstart(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func quickstart() error {
	if os.Geteuid() != 0 {
		return errors.New(`needs root for its network namespace and TUN device; run: sudo "$(command -v go)" run ./examples/quickstart`)
	}
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "userproxy-quickstart-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// 1. Build the binary.
	bin := filepath.Join(tmp, "userproxy")
	fmt.Println("== building userproxy")
	build := exec.Command("go", "build", "-o", bin, "./cmd/userproxy")
	build.Dir, build.Stdout, build.Stderr = root, os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}

	// 2. A namespace of our own, with loopback up and a client address.
	name := fmt.Sprintf("userproxy-qs-%d", os.Getpid())
	ns, err := newNamespace(name)
	if err != nil {
		return err
	}
	defer func() {
		ns.Close()
		if err := netns.DeleteNamed(name); err != nil {
			fmt.Fprintln(os.Stderr, "quickstart: deleting namespace:", err)
		}
	}()
	w := &nsWorker{ns: ns}
	if err := w.do(func() error { return prepareNamespace() }); err != nil {
		return fmt.Errorf("preparing namespace %s: %w", name, err)
	}

	// 3. The endpoints, on loopback inside the namespace.
	stop, err := startEndpoints(w)
	if err != nil {
		return err
	}
	defer stop()

	// 4. The proxy, in the namespace.
	fmt.Println("== starting userproxy in network namespace", name)
	cmd := exec.Command("ip", "netns", "exec", name, bin, "run",
		"--config", filepath.Join(root, "examples", "quickstart.yaml"),
		"--tun-name", "upx-qs0", "--admin-addr", adminAddr, "--min-sync-period", "0", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting userproxy: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				fmt.Fprintln(os.Stderr, "quickstart: userproxy exited:", err)
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	if err := waitHealthy(w, exited); err != nil {
		return err
	}

	// 5. Traffic.
	fmt.Printf("== %d connections to 10.96.0.10:80 (service default/web, 3 endpoints)\n", connections)
	counts, err := connect(w)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "endpoint\tconnections\tshare")
	var names []string
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\n", n, counts[n], 100*float64(counts[n])/connections)
	}
	tw.Flush()
	reply, err := udpExchange(w)
	if err != nil {
		return err
	}
	fmt.Printf("== UDP 10.96.0.53:53 answered %q\n", reply)

	// 6. What the proxy saw.
	fmt.Println("== userproxy conntrack list --protocol udp")
	list := exec.Command("ip", "netns", "exec", name, bin, "conntrack", "list", "--admin-addr", adminAddr, "--protocol", "udp")
	list.Stdout, list.Stderr = os.Stdout, os.Stderr
	if err := list.Run(); err != nil {
		return fmt.Errorf("conntrack list: %w", err)
	}
	fmt.Println("== metrics (excerpt of /metrics)")
	if err := printMetrics(w); err != nil {
		return err
	}
	if len(counts) != 3 {
		return fmt.Errorf("connections reached %d endpoints, want 3", len(counts))
	}
	fmt.Println("== done; cleaning up")
	return nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("run the quickstart from the userproxy repository")
	}
	return filepath.Dir(mod), nil
}

func newNamespace(name string) (netns.NsHandle, error) {
	type result struct {
		h   netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread ends in the new namespace
		h, err := netns.NewNamed(name)
		ch <- result{h, err}
	}()
	r := <-ch
	if r.err != nil {
		return 0, fmt.Errorf("creating network namespace %s: %w", name, r.err)
	}
	return r.h, nil
}

// nsWorker runs functions on threads inside the namespace.
type nsWorker struct{ ns netns.NsHandle }

func (w *nsWorker) do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
		if err := netns.Set(w.ns); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// prepareNamespace sets loopback up and gives the namespace a client address
// (a documentation address) for traffic to the ClusterIPs.
func prepareNamespace() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	addr, _ := netlink.ParseAddr("192.0.2.1/32")
	return netlink.AddrAdd(lo, addr)
}

func startEndpoints(w *nsWorker) (func(), error) {
	var closers []io.Closer
	var wg sync.WaitGroup
	stop := func() {
		for _, c := range closers {
			c.Close()
		}
		wg.Wait()
	}
	for _, ip := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"} {
		var ln net.Listener
		if err := w.do(func() (err error) { ln, err = net.Listen("tcp", ip+":8080"); return err }); err != nil {
			stop()
			return nil, fmt.Errorf("endpoint %s:8080: %w", ip, err)
		}
		closers = append(closers, ln)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, ip+":8080")
				c.Close()
			}
		}()
	}
	var pc net.PacketConn
	if err := w.do(func() (err error) { pc, err = net.ListenPacket("udp", "127.0.0.1:5353"); return err }); err != nil {
		stop()
		return nil, fmt.Errorf("UDP endpoint: %w", err)
	}
	closers = append(closers, pc)
	wg.Add(1)
	go func() {
		defer wg.Done()
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(append([]byte("hello from 127.0.0.1:5353, you said "), buf[:n]...), from)
		}
	}()
	return stop, nil
}

// httpGet fetches a URL of the admin server from inside the namespace.
func httpGet(w *nsWorker, url string) (int, string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := w.do(func() (err error) { c, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
			return c, err
		},
	}}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

func waitHealthy(w *nsWorker, exited <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err := httpGet(w, "http://"+adminAddr+"/healthz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("userproxy exited before it was healthy: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("userproxy not healthy after 30 s (last: %d %s %v)", code, body, err)
		}
	}
}

func connect(w *nsWorker) (map[string]int, error) {
	counts := map[string]int{}
	for i := range connections {
		var c net.Conn
		if err := w.do(func() (err error) { c, err = net.DialTimeout("tcp", "10.96.0.10:80", 5*time.Second); return err }); err != nil {
			return nil, fmt.Errorf("connection %d: %w", i+1, err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if err != nil {
			return nil, fmt.Errorf("connection %d: %w", i+1, err)
		}
		counts[string(b)]++
	}
	return counts, nil
}

func udpExchange(w *nsWorker) (string, error) {
	var c net.Conn
	if err := w.do(func() (err error) { c, err = net.Dial("udp", "10.96.0.53:53"); return err }); err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 1500)
	for try := 0; try < 3; try++ {
		if _, err := c.Write([]byte("ping")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := c.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
	}
	return "", errors.New("no UDP answer from 10.96.0.53:53")
}

func printMetrics(w *nsWorker) error {
	_, body, err := httpGet(w, "http://"+adminAddr+"/metrics")
	if err != nil {
		return fmt.Errorf("fetching /metrics: %w", err)
	}
	want := []string{"userproxy_flows_total", "userproxy_conntrack_entries", "kubeproxy_iptables_ct_state_invalid_dropped_packets_total",
		"kubeproxy_sync_proxy_rules_last_timestamp_seconds", "userproxy_spliced_bytes_total"}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, p := range want {
			if strings.HasPrefix(line, p) {
				fmt.Println(line)
			}
		}
	}
	return nil
}

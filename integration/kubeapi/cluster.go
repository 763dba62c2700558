package kubeapi

// A Cluster, in order:
//
//  1. Start: the state directory, the certificates and keys (pki.go), three
//     free loopback ports;
//  2. etcd on the first two (client, peer), its data in Dir/etcd; wait for
//     /health;
//  3. kube-apiserver on the third, dual-stack service ranges, the endpoint
//     reconciler off; wait for /readyz; write Dir/kubeconfig;
//  4. Stop, Kill and Start of either process restart it on the same ports
//     and data (an outage, a crash, a restart);
//  5. Stop ends both, the API server first, by PID; each process is waited
//     for, so nothing is left behind.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Version is the Kubernetes release integration/kubeapiserver builds; a
// test holds it against that module's go.mod.
const Version = "v1.37.2"

// ServiceCIDRs are the API server's --service-cluster-ip-range: IPv4 first,
// so single-stack Services get an IPv4 ClusterIP; dual-stack ones get both.
var ServiceCIDRs = []netip.Prefix{
	netip.MustParsePrefix("10.96.0.0/16"),
	netip.MustParsePrefix("fd00:96::/112"),
}

// Binaries are the programs a Cluster runs.
type Binaries struct {
	Etcd, APIServer string
}

// Environment variables that override where the binaries are found.
const (
	EnvAPIServer = "USERPROXY_KUBE_APISERVER"
	EnvCache     = "USERPROXY_KUBE_CACHE"
	EnvEtcd      = "USERPROXY_ETCD"
)

// DefaultAPIServerPath is where integration/kubeapiserver/build.sh puts the
// binary: $USERPROXY_KUBE_CACHE (default /var/cache/userproxy)/
// kube-apiserver-<Version>/kube-apiserver.
func DefaultAPIServerPath() string {
	dir := os.Getenv(EnvCache)
	if dir == "" {
		dir = "/var/cache/userproxy"
	}
	return filepath.Join(dir, "kube-apiserver-"+Version, "kube-apiserver")
}

// ErrNoBinaries is returned by FindBinaries when etcd or kube-apiserver is
// missing; its message says how to get them.
var ErrNoBinaries = errors.New("etcd and kube-apiserver are needed: `apt-get install etcd-server` " +
	"and `integration/kubeapiserver/build.sh` (or `make kube-apiserver`); " +
	EnvEtcd + " and " + EnvAPIServer + " name other binaries")

// FindBinaries returns etcd ($USERPROXY_ETCD, else etcd on PATH, else
// /usr/bin/etcd) and kube-apiserver ($USERPROXY_KUBE_APISERVER, else
// DefaultAPIServerPath).
func FindBinaries() (Binaries, error) {
	var b Binaries
	var missing []string
	b.Etcd = os.Getenv(EnvEtcd)
	if b.Etcd == "" {
		if p, err := exec.LookPath("etcd"); err == nil {
			b.Etcd = p
		} else {
			b.Etcd = "/usr/bin/etcd"
		}
	}
	if !executable(b.Etcd) {
		missing = append(missing, "etcd ("+b.Etcd+")")
	}
	b.APIServer = os.Getenv(EnvAPIServer)
	if b.APIServer == "" {
		b.APIServer = DefaultAPIServerPath()
	}
	if !executable(b.APIServer) {
		missing = append(missing, "kube-apiserver ("+b.APIServer+")")
	}
	if len(missing) > 0 {
		return b, fmt.Errorf("missing %s: %w", strings.Join(missing, " and "), ErrNoBinaries)
	}
	return b, nil
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Config configures a Cluster.
type Config struct {
	Binaries Binaries
	// Dir holds the state: pki/, tokens.csv, etcd/ (the data: put Dir on a
	// tmpfs such as /dev/shm), the logs and the kubeconfig. It is created
	// if missing and not removed.
	Dir string
	// Wrap prefixes both commands, e.g. ["ip", "netns", "exec", "ns1"]; it
	// must exec the program (so the PID is the program's).
	Wrap []string
	// Dial is how this process reaches the processes' loopback (nil: the
	// host's); for a namespace, a dialer that runs there.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// ExtraAPIServerArgs are appended to the API server's flags.
	ExtraAPIServerArgs []string
}

// Cluster is a running etcd and kube-apiserver. Its methods are safe for
// concurrent use.
type Cluster struct {
	cfg   Config
	token string
	caPEM []byte
	ports struct{ etcd, peer, api int }

	mu   sync.Mutex
	etcd *child
	api  *child
}

// AdminUser is the user of the Cluster's admin token, in system:masters.
const AdminUser = "admin"

// Start starts etcd and the API server and returns once /readyz answers ok
// and Dir/kubeconfig is written. On error nothing is left running.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("kubeapi: Config.Dir is empty")
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("kubeapi: %w", err)
	}
	c := &Cluster{cfg: cfg}
	var err error
	if c.caPEM, c.token, err = writePKI(cfg.Dir); err != nil {
		return nil, fmt.Errorf("kubeapi: certificates: %w", err)
	}
	// The ports were free a moment before the process binds them; another
	// process (a test's own listener, a client's ephemeral port) may take
	// one meanwhile. A process that exits on a taken port is started
	// again on fresh ones, a few times.
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, fmt.Errorf("kubeapi: %w", err)
		}
		c.ports.etcd, c.ports.peer = ports[0], ports[1]
		// etcd binds before it writes its data directory; a failed start
		// leaves nothing that names the old ports, but clear it anyway.
		_ = os.RemoveAll(filepath.Join(cfg.Dir, "etcd"))
		err = c.StartEtcd(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return nil, err
		}
	}
	for attempt := 1; ; attempt++ {
		ports, err := freePorts(1)
		if err != nil {
			c.Stop()
			return nil, fmt.Errorf("kubeapi: %w", err)
		}
		c.ports.api = ports[0]
		err = c.StartAPIServer(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortTaken) || attempt == portAttempts {
			c.Stop()
			return nil, err
		}
	}
	if err := c.WriteKubeconfig(c.Kubeconfig(), c.token); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// portAttempts bounds Start's tries with fresh ports.
const portAttempts = 4

// errPortTaken is a process's exit because a port it was to listen on was
// taken (its log says "address already in use").
var errPortTaken = errors.New("a port was taken")

// freePorts returns n distinct TCP ports free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("picking a free port: %w", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Dir returns the state directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// Kubeconfig returns the path of the admin kubeconfig.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.cfg.Dir, "kubeconfig") }

// URL returns the API server's address, https://127.0.0.1:PORT.
func (c *Cluster) URL() string { return "https://127.0.0.1:" + strconv.Itoa(c.ports.api) }

// EtcdURL returns etcd's client address.
func (c *Cluster) EtcdURL() string { return "http://127.0.0.1:" + strconv.Itoa(c.ports.etcd) }

// CA returns the PEM certificate that signed the API server's.
func (c *Cluster) CA() []byte { return bytes.Clone(c.caPEM) }

// AdminToken returns the bearer token of AdminUser.
func (c *Cluster) AdminToken() string { return c.token }

// PIDs returns the process IDs of etcd and the API server (0 when stopped).
func (c *Cluster) PIDs() (etcd, apiserver int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.etcd.pid(), c.api.pid()
}

// RESTConfig returns a client configuration with token (the admin's when
// empty), generous rate limits (tests write thousands of objects) and the
// Cluster's dialer.
func (c *Cluster) RESTConfig(token string) *rest.Config {
	if token == "" {
		token = c.token
	}
	return &rest.Config{
		Host:            c.URL(),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA()},
		Dial:            c.cfg.Dial,
		QPS:             1000,
		Burst:           2000,
		UserAgent:       "userproxy-kubeapi-test",
	}
}

// Client returns an admin clientset.
func (c *Cluster) Client() (kubernetes.Interface, error) {
	cs, err := kubernetes.NewForConfig(c.RESTConfig(""))
	if err != nil {
		return nil, fmt.Errorf("kubeapi: client: %w", err)
	}
	return cs, nil
}

// WriteKubeconfig writes a kubeconfig for the API server with token.
func (c *Cluster) WriteKubeconfig(path, token string) error {
	return c.WriteKubeconfigVia(path, c.URL(), token)
}

// WriteKubeconfigVia writes a kubeconfig for server (a proxy in front of the
// API server, say) with token; the server must present the API server's
// certificate (valid for 127.0.0.1).
func (c *Cluster) WriteKubeconfigVia(path, server, token string) error {
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: kubeapi
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: user
  user:
    token: %s
contexts:
- name: kubeapi
  context: {cluster: kubeapi, user: user}
current-context: kubeapi
`, server, base64.StdEncoding.EncodeToString(c.caPEM), token)
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		return fmt.Errorf("kubeapi: kubeconfig: %w", err)
	}
	return nil
}

// StartEtcd starts etcd on its ports and data directory and waits until it
// is healthy.
func (c *Cluster) StartEtcd(ctx context.Context) error {
	client, peer := "http://127.0.0.1:"+strconv.Itoa(c.ports.etcd), "http://127.0.0.1:"+strconv.Itoa(c.ports.peer)
	args := []string{
		"--name=kubeapi",
		"--data-dir=" + filepath.Join(c.cfg.Dir, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kubeapi=" + peer,
		"--logger=zap", "--log-outputs=stderr", "--log-level=warn",
	}
	ch, err := c.start(&c.etcd, "etcd", c.cfg.Binaries.Etcd, args)
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: c.cfg.Dial, DisableKeepAlives: true}, Timeout: 2 * time.Second}
	err = c.waitReady(ctx, ch, func() error {
		return get(hc, client+"/health", "", func(body string) bool { return strings.Contains(body, `"health":"true"`) })
	})
	if err != nil {
		_ = c.StopEtcd()
		return err
	}
	return nil
}

// StartAPIServer starts kube-apiserver on its port and waits for /readyz.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	pki := filepath.Join(c.cfg.Dir, "pki")
	var cidrs []string
	for _, p := range ServiceCIDRs {
		cidrs = append(cidrs, p.String())
	}
	args := []string{
		"--etcd-servers=" + c.EtcdURL(),
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(c.ports.api),
		"--cert-dir=" + pki,
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--token-auth-file=" + filepath.Join(c.cfg.Dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=" + strings.Join(cidrs, ","),
		// No controller-manager and nothing to reconcile the kubernetes
		// Service's endpoints against: tests own every EndpointSlice.
		"--endpoint-reconciler-type=none",
		"--profiling=false",
		// As kubeadm's own kube-apiserver manifest: kube-proxy's
		// DaemonSet runs privileged, and a cluster that refuses it is
		// not one kube-proxy's users have.
		"--allow-privileged=true",
	}
	args = append(args, c.cfg.ExtraAPIServerArgs...)
	ch, err := c.start(&c.api, "kube-apiserver", c.cfg.Binaries.APIServer, args)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.caPEM)
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: c.cfg.Dial, DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
	}}
	err = c.waitReady(ctx, ch, func() error {
		return get(hc, c.URL()+"/readyz", c.token, func(body string) bool { return strings.TrimSpace(body) == "ok" })
	})
	if err != nil {
		_ = c.StopAPIServer()
		return err
	}
	return nil
}

// get fetches url and checks a 200 answer with ok.
func get(hc *http.Client, url, token string, ok func(string) bool) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK || !ok(string(body)) {
		return fmt.Errorf("%s: %s: %.300s", url, resp.Status, body)
	}
	return nil
}

// readyTimeout bounds the wait for a process to answer; the API server
// usually takes about 5 s, a loaded machine longer.
const readyTimeout = 90 * time.Second

// waitReady polls check until it succeeds, the process exits, ctx ends or
// readyTimeout passes.
func (c *Cluster) waitReady(ctx context.Context, ch *child, check func() error) error {
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-ch.done:
			tail := c.LogTail(ch.name, 30)
			if run := tail[strings.LastIndex(tail, "=== ")+1:]; strings.Contains(run, "address already in use") { // this run's lines only
				return fmt.Errorf("kubeapi: %s exited before it was ready (%v): %w; its log ends:\n%s", ch.name, ch.err, errPortTaken, tail)
			}
			return fmt.Errorf("kubeapi: %s exited before it was ready (%v); its log ends:\n%s", ch.name, ch.err, tail)
		case <-ctx.Done():
			return fmt.Errorf("kubeapi: waiting for %s: %w", ch.name, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("kubeapi: %s not ready after %v: %w; its log ends:\n%s", ch.name, readyTimeout, last, c.LogTail(ch.name, 30))
		case <-tick.C:
		}
	}
}

// CompactEtcd compacts etcd's history up to its current revision, so that
// reading from an older resource version fails with 410 Gone where the API
// server goes to etcd. It returns that revision.
func (c *Cluster) CompactEtcd(ctx context.Context) (int64, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: c.cfg.Dial, DisableKeepAlives: true}}
	post := func(path, body string, out any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.EtcdURL()+path, strings.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s: %.300s", path, resp.Status, b)
		}
		return json.Unmarshal(b, out)
	}
	// The gRPC gateway prints int64 as a string.
	var rng struct {
		Header struct {
			Revision string `json:"revision"`
		} `json:"header"`
	}
	if err := post("/v3/kv/range", `{"key":"AA=="}`, &rng); err != nil {
		return 0, fmt.Errorf("kubeapi: etcd revision: %w", err)
	}
	rev, err := strconv.ParseInt(rng.Header.Revision, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("kubeapi: etcd revision %q: %w", rng.Header.Revision, err)
	}
	var out struct{}
	if err := post("/v3/kv/compaction", fmt.Sprintf(`{"revision":"%d","physical":true}`, rev), &out); err != nil {
		return 0, fmt.Errorf("kubeapi: compacting etcd: %w", err)
	}
	return rev, nil
}

// StopAPIServer stops the API server gracefully (SIGTERM) and waits for it
// to exit. Open watches hold a graceful stop up to the server's 60 s
// shutdown timeout; after stopGrace it is killed. Stopping a stopped server
// does nothing.
func (c *Cluster) StopAPIServer() error { return c.take(&c.api).stop(stopGrace) }

// KillAPIServer kills the API server (SIGKILL, a crash: connections reset,
// nothing drained) and waits for it to exit.
func (c *Cluster) KillAPIServer() { c.take(&c.api).kill() }

// StopEtcd stops etcd (SIGTERM) and waits for it to exit; its data stays.
func (c *Cluster) StopEtcd() error { return c.take(&c.etcd).stop(stopGrace) }

// KillEtcd kills etcd (SIGKILL) and waits; its data stays, as after a
// crash.
func (c *Cluster) KillEtcd() { c.take(&c.etcd).kill() }

// take removes a process from the Cluster and returns it (nil when none).
func (c *Cluster) take(p **child) *child {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := *p
	*p = nil
	return ch
}

// Stop stops the API server, then etcd, each with SIGTERM and after 5 s
// SIGKILL. It may be called more than once.
func (c *Cluster) Stop() {
	_ = c.take(&c.api).stop(5 * time.Second)
	_ = c.take(&c.etcd).stop(5 * time.Second)
}

// LogTail returns the last n lines of a process's log ("etcd",
// "kube-apiserver").
func (c *Cluster) LogTail(name string, n int) string {
	b, err := os.ReadFile(filepath.Join(c.cfg.Dir, name+".log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// child is one running process, waited for by its own goroutine.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's error, set before done closes
}

// start starts a process into slot, unless the one there still runs.
func (c *Cluster) start(slot **child, name, bin string, args []string) (*child, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if (*slot).pid() != 0 {
		return nil, fmt.Errorf("kubeapi: %s is already running", name)
	}
	argv := append(append(append([]string(nil), c.cfg.Wrap...), bin), args...)
	logf, err := os.OpenFile(filepath.Join(c.cfg.Dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kubeapi: %s log: %w", name, err)
	}
	defer logf.Close() // the child holds its own descriptor
	fmt.Fprintf(logf, "=== %s: %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(argv, " "))
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.cfg.Dir
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("kubeapi: starting %s: %w", name, err)
	}
	ch := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { // process waiter: reaps the child
		ch.err = cmd.Wait()
		close(ch.done)
		spawned()
	}()
	*slot = ch
	return ch, nil
}

func (ch *child) pid() int {
	if ch == nil {
		return 0
	}
	select {
	case <-ch.done:
		return 0
	default:
		return ch.cmd.Process.Pid
	}
}

// stopGrace bounds a graceful stop: the API server's own shutdown timeout
// (60 s, for open watches) and a little.
const stopGrace = 65 * time.Second

// stop sends SIGTERM, waits up to grace, then kills; it reports a kill.
func (ch *child) stop(grace time.Duration) error {
	if ch == nil {
		return nil
	}
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ch.done:
		return nil
	case <-time.After(grace):
	}
	ch.kill()
	return fmt.Errorf("kubeapi: %s ignored SIGTERM for %v and was killed", ch.name, grace)
}

// kill sends SIGKILL and waits for the exit.
func (ch *child) kill() {
	if ch == nil {
		return
	}
	_ = ch.cmd.Process.Kill()
	<-ch.done
}

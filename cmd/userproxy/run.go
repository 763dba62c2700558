package main

// userproxy run, in order:
//
//  1. flags, logger; the open-file limit logged;
//  2. the conntrack table, the proxy, the service tracker (which hands each
//     new table to the proxy);
//  3. the source of objects: --config (file or directory) or the API server;
//  4. the TUN device and its routes (created when missing); cluster DNS
//     registered with the host's resolver (dns.go);
//  5. the stack over the TUN, with the proxy as admission and flow handler
//     (and cluster DNS as the local server at the DNS service IP);
//  6. the admin server, the conntrack sweeper;
//  7. on SIGINT/SIGTERM: stop admitting, let flows finish for up to
//     shutdownGrace, reset the ones left (both sides), stop the source,
//     close the stack, undo the host DNS settings, remove what run created,
//     exit 0. Any failure before that (admin address taken, source ended,
//     DNS bind) returns at once, removing what run created on the way out;
//  8. on SIGHUP: the binary is started again and takes over (restart.go);
//     once it has, or once any --take-over taker has, this process leaves
//     the device and the moved flows to it and exits 0.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/netstack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/file"
	"github.com/userproxy/userproxy/source/kube"
)

// defaultHealthzAddr is --healthz-bind-address's default: kube-proxy's port,
// on loopback only, so that a laptop exposes nothing.
const defaultHealthzAddr = "127.0.0.1:10256"

// defaultMTU is the MTU of a TUN device run creates: 64 KiB packets cost the
// kernel and the stack the same per packet as 1500-byte ones, and bulk
// transfers through the TUN ran 5.6 times faster with it (BENCHMARKS.md).
const defaultMTU = 65520

type runFlags struct {
	config, kubeconfig string
	tunName            string
	tunOffload         bool
	tunPortable        bool
	tunQueues          int
	mtu                int
	serviceCIDRs       prefixList
	clusterCIDRs       prefixList
	nodePortAddresses  string
	healthzAddr        string
	nodeName, zone     string
	adminAddr          string
	controlSocket      string
	handoverSocket     string
	takeOver           bool
	afterHandover      string
	handoverOnTerm     time.Duration
	minSyncPeriod      time.Duration
	conntrackMax       int
	ctEstablished      time.Duration
	ctCloseWait        time.Duration
	ctUDP, ctUDPStream time.Duration
	ctLiberal          bool
	affinityListSize   int
	scheduler          string
	schedulerFlags     string
	sched              balancer.SchedulerConfig // parsed by validate
	dialTimeout        time.Duration
	dialViaName        string
	via                proxy.DialVia // parsed by validate
	dialDirect         time.Duration
	tunnelIdle         time.Duration
	maxInFlight        int
	maxInFlightClient  int
	tcpTranslate       bool
	maxUDPSessions     int
	handshakeTimeout   time.Duration
	profiling          bool
	procs              int
	dns                dnsFlags
	log                logFlags

	// Set by kube-proxy's command line (kubeproxy.go), not run's flags.
	proxyMode           string // /proxyMode's answer; "" for run: from the scheduler
	clientQPS           float32
	clientBurst         int
	clientContentType   string
	master              string                // the API server's URL, over the kubeconfig's
	nodePortFilter      func(netip.Addr) bool // NodePort addresses kept (nil: all)
	oomScoreAdj         *int32                // written to /proc/self/oom_score_adj
	conntrackMaxPerCore int                   // with conntrackMin: the table's size as kube-proxy sizes nf_conntrack_max
	conntrackMin        int
	bindAddressHardFail bool
	configz             func() ([]byte, error) // /configz's body; nil: 404
}

func (f *runFlags) register(fs *pflag.FlagSet) {
	host, _ := os.Hostname()
	host = strings.ToLower(host) // kube-proxy's default node name
	def := conntrack.DefaultTimeouts()
	fs.StringVar(&f.config, "config", "", "YAML/JSON file or directory of Services and EndpointSlices (reloaded on change)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the API server to watch (in-cluster config when neither --config nor --kubeconfig is given)")
	fs.StringVar(&f.tunName, "tun-name", "userproxy0", "TUN device (created when missing)")
	fs.IntVar(&f.mtu, "mtu", defaultMTU, "MTU of a TUN device run creates")
	fs.BoolVar(&f.tunOffload, "tun-offload", true, "open the TUN with virtio-net headers and TCP segmentation and checksum offloads (Linux; falls back without them if refused); false: every packet cut to the MTU and checksummed")
	fs.IntVar(&f.tunQueues, "tun-queues", 0, "queues of the TUN (Linux multi-queue), each read by its own goroutine: the kernel spreads flows over them, and a flow's packets stay on one; 0: one per CPU the process may run on")
	f.serviceCIDRs.values = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	fs.BoolVar(&f.tunPortable, "tun-portable", os.Getenv("USERPROXY_TUN") == "portable", "open the TUN as macOS must (water's device, the generic device link, routes by commands: ip(8) here, route(8) there) instead of Linux's own path, to run that code on Linux; no offloads, one packet per read (the default follows USERPROXY_TUN=portable)")
	fs.Var(&f.serviceCIDRs, "service-cidr", "service CIDR routed into the TUN (repeatable; IPv6 too)")
	fs.Var(&f.clusterCIDRs, "cluster-cidr", "pod CIDR of this cluster (repeatable): flows from it, as from this host's own addresses, to a NodePort, external IP or LB IP of an externalTrafficPolicy Local service use every endpoint (kube-proxy's short-circuit)")
	fs.StringVar(&f.nodePortAddresses, "nodeport-addresses", defaultNodePortAddresses, "where NodePorts are served: comma-separated CIDRs (this host's addresses in them) or \"primary\" (kube-proxy's syntax); empty: nowhere")
	fs.StringVar(&f.nodeName, "node-name", host, "this node's name, for internalTrafficPolicy Local and topology hints")
	fs.StringVar(&f.zone, "zone", "", "this node's topology.kubernetes.io/zone, for zone hints (empty: hints ignored)")
	fs.StringVar(&f.healthzAddr, "healthz-bind-address", defaultHealthzAddr, "kube-proxy's health server: /healthz and /livez with kube-proxy's JSON, for probes and load balancers (a node sets 0.0.0.0:10256); empty disables it")
	fs.StringVar(&f.adminAddr, "admin-addr", defaultAdminAddr, "address of the admin server (/healthz, /metrics, /debug: read-only); empty disables it")
	fs.StringVar(&f.controlSocket, "control-socket", "", "unix socket (mode 0600) that serves what changes the proxy's state, the conntrack flush (default: "+defaultControlSocket("TUN")+"); \"none\" disables it")
	fs.StringVar(&f.handoverSocket, "handover-socket", "", "unix socket (mode 0600) on which a new process started with --take-over takes this one's TUN and flows (default: "+defaultHandoverSocket("TUN")+"); \"none\" disables it")
	fs.BoolVar(&f.takeOver, "take-over", os.Getenv(takeOverEnv) == "1", "take the TUN and the flows over from the proxy running on --handover-socket, which then exits (a restart or upgrade without resetting connections); with none running, a clean start (the default follows USERPROXY_TAKE_OVER=1, which a restart by SIGHUP sets)")
	fs.DurationVar(&f.minSyncPeriod, "min-sync-period", service.DefaultMinSyncPeriod, "least time between two service table builds (0: build on every change)")
	fs.IntVar(&f.conntrackMax, "conntrack-max", 0, "conntrack table size (0: 32768 per core, at least 131072, as kube-proxy)")
	fs.DurationVar(&f.ctEstablished, "conntrack-tcp-timeout-established", def.TCPEstablished, "idle timeout of established TCP flows")
	fs.DurationVar(&f.ctCloseWait, "conntrack-tcp-timeout-close-wait", def.TCPCloseWait, "timeout of TCP flows in CLOSE_WAIT")
	fs.DurationVar(&f.ctUDP, "conntrack-udp-timeout", def.UDP, "timeout of UDP flows without a reply")
	fs.DurationVar(&f.ctUDPStream, "conntrack-udp-timeout-stream", def.UDPStream, "timeout of UDP flows that saw replies")
	fs.BoolVar(&f.ctLiberal, "conntrack-tcp-be-liberal", false, "accept out-of-window TCP segments (only out-of-window RSTs stay INVALID)")
	fs.IntVar(&f.affinityListSize, "affinity-list-size", balancer.DefaultListSize, "clients per endpoint in ClientIP affinity lists (xt_recent ip_list_tot)")
	fs.StringVar(&f.scheduler, "scheduler", "random", "endpoint scheduler of Services without a "+service.AnnotationScheduler+" annotation: random (kube-proxy's iptables lottery) or an IPVS scheduler: rr, wrr, lc, wlc, sed, nq, sh, dh, mh")
	fs.StringVar(&f.schedulerFlags, "scheduler-flags", "", "flags of --scheduler, as ipvsadm -b takes them (sh-port, sh-fallback, mh-port, mh-fallback, flag-N; comma-separated)")
	fs.DurationVar(&f.dialTimeout, "dial-timeout", 5*time.Second, "timeout of a connection to an endpoint")
	fs.StringVar(&f.dialViaName, "dial-via", "", "how TCP flows reach endpoints: direct (from this host), apiserver (through the API server's pods/portforward, for pods this host cannot route to), auto (direct first, then the API server; remembered per endpoint address). Default: auto with an API server, direct with --config")
	fs.DurationVar(&f.dialDirect, "dial-direct-timeout", time.Second, "with --dial-via auto: how long the first direct dial of an endpoint may take before the API server is tried")
	fs.DurationVar(&f.tunnelIdle, "apiserver-tunnel-idle", 30*time.Second, "how long a pod's tunnel through the API server stays open without flows")
	fs.IntVar(&f.maxInFlight, "max-inflight", netstack.DefaultMaxInFlight, "TCP handshakes waiting for their endpoint at once (the kernel's default listen backlog); further SYNs are dropped (counted)")
	fs.IntVar(&f.maxInFlightClient, "max-inflight-per-client", 0, "one client address's share of --max-inflight; 0: a quarter of it")
	fs.BoolVar(&f.tcpTranslate, "tcp-translate", os.Getenv("USERPROXY_TCP_TRANSLATE") != "0", "carry TCP flows to endpoints dialled directly without gVisor's TCP: their sequence space follows the endpoint sockets' (false: gVisor terminates them; the default follows USERPROXY_TCP_TRANSLATE=0|1)")
	fs.IntVar(&f.maxUDPSessions, "max-udp-sessions", 65536, "concurrent UDP flows; further flows are refused (counted as table_full)")
	fs.DurationVar(&f.handshakeTimeout, "handshake-timeout", 10*time.Second, "time a client has to complete its TCP handshake, from its SYN: the endpoint dial runs within it")
	fs.BoolVar(&f.profiling, "profiling", false, "serve Go's profiles on the admin server under /debug/pprof/")
	fs.IntVar(&f.procs, "procs", 0, "CPUs that run the proxy's Go code at once (GOMAXPROCS); 0: one while one is enough, all while goroutines queue or wait for it (unless the GOMAXPROCS variable is set)")
	f.dns.register(fs)
	f.log.register(fs)
	groupFlags(fs, "Objects", "config", "kubeconfig", "min-sync-period", "node-name", "zone")
	groupFlags(fs, "Device and addresses", "tun-name", "mtu", "tun-offload", "tun-queues", "tun-portable", "service-cidr", "cluster-cidr", "nodeport-addresses")
	groupFlags(fs, "Endpoints", "scheduler", "scheduler-flags", "affinity-list-size", "dial-via", "dial-timeout",
		"dial-direct-timeout", "apiserver-tunnel-idle", "tcp-translate")
	groupFlags(fs, "Conntrack", "conntrack-max", "conntrack-tcp-timeout-established", "conntrack-tcp-timeout-close-wait",
		"conntrack-udp-timeout", "conntrack-udp-timeout-stream", "conntrack-tcp-be-liberal")
	groupFlags(fs, "Limits", "max-inflight", "max-inflight-per-client", "max-udp-sessions", "handshake-timeout", "procs")
	groupFlags(fs, "Servers", "healthz-bind-address", "admin-addr", "control-socket", "profiling")
	fs.StringVar(&f.afterHandover, "after-handover", afterHandoverExit, "once handed over to a new process: exit (status 0), or wait, serving nothing, for a signal (a container whose exit its kubelet would restart)")
	fs.DurationVar(&f.handoverOnTerm, "handover-on-term", 0, "on SIGTERM, wait up to this long for a new process to take over before draining (a DaemonSet's rolling update with maxSurge stops the old pod once the new one is ready); 0: drain at once")
	groupFlags(fs, "Restarts", "handover-socket", "take-over", "after-handover", "handover-on-term")
	groupFlags(fs, "DNS", "dns", "dns-ip", "cluster-domain", "dns-upstream", "dns-host-config")
	groupFlags(fs, "Logging", "log-level", "log-format")
}

func (f *runFlags) validate() error {
	switch {
	case f.config != "" && f.kubeconfig != "":
		return errors.New("--config and --kubeconfig exclude each other")
	case f.tunName == "" || len(f.tunName) > 15:
		return fmt.Errorf("--tun-name %q: want 1 to 15 characters", f.tunName)
	case f.mtu < 1280 || f.mtu > 65520:
		return fmt.Errorf("--mtu %d: want 1280..65520", f.mtu)
	case len(f.serviceCIDRs.values) == 0:
		return errors.New("--service-cidr: at least one is needed")
	case f.minSyncPeriod < 0:
		return fmt.Errorf("--min-sync-period %v is negative", f.minSyncPeriod)
	case f.conntrackMax < 0:
		return fmt.Errorf("--conntrack-max %d is negative", f.conntrackMax)
	case f.ctEstablished <= 0 || f.ctCloseWait <= 0 || f.ctUDP <= 0 || f.ctUDPStream <= 0:
		return errors.New("--conntrack-*-timeout flags must be positive")
	case f.affinityListSize <= 0:
		return fmt.Errorf("--affinity-list-size %d: want a positive number", f.affinityListSize)
	case f.dialTimeout <= 0:
		return fmt.Errorf("--dial-timeout %v: want a positive duration", f.dialTimeout)
	case f.procs < 0:
		return fmt.Errorf("--procs %d is negative", f.procs)
	case f.tunQueues < 0 || f.tunQueues > maxTUNQueues:
		return fmt.Errorf("--tun-queues %d: want 0 (one per CPU) to %d (the kernel's limit)", f.tunQueues, maxTUNQueues)
	case f.maxInFlight <= 0 || f.maxInFlightClient < 0 || f.maxUDPSessions <= 0 || f.handshakeTimeout <= 0:
		return errors.New("--max-inflight, --max-udp-sessions and --handshake-timeout must be positive, --max-inflight-per-client not negative")
	}
	via, err := f.dialVia()
	if err != nil {
		return err
	}
	f.via = via
	if via == proxy.ViaAuto && (f.dialDirect <= 0 || f.dialDirect >= f.dialTimeout) {
		return errDialDirectTimeout
	}
	if f.tunnelIdle <= 0 {
		return errors.New("--apiserver-tunnel-idle must be positive")
	}
	f.nodeName = strings.ToLower(f.nodeName) // kube-proxy lowercases an override too
	switch f.handoverSocket {
	case "":
		f.handoverSocket = defaultHandoverSocket(f.tunName)
	case "none":
		f.handoverSocket = ""
	}
	if f.takeOver && f.handoverSocket == "" {
		return errors.New("--take-over needs a --handover-socket")
	}
	switch {
	case f.afterHandover != afterHandoverExit && f.afterHandover != afterHandoverWait:
		return fmt.Errorf("--after-handover %q: want %s or %s", f.afterHandover, afterHandoverExit, afterHandoverWait)
	case f.handoverOnTerm < 0:
		return fmt.Errorf("--handover-on-term %v is negative", f.handoverOnTerm)
	case f.handoverOnTerm > 0 && f.handoverSocket == "":
		return errors.New("--handover-on-term needs a --handover-socket")
	}
	if f.controlSocket == "" {
		f.controlSocket = defaultControlSocket(f.tunName)
	}
	sched, err := balancer.ParseScheduler(f.scheduler, f.schedulerFlags)
	if err != nil {
		return fmt.Errorf("--scheduler: %w", err)
	}
	f.sched = sched
	return f.dns.validate(f.serviceCIDRs.values)
}

// rulesOptions are /debug/rules' options for what run serves: the cluster
// CIDRs, and NodePorts on exactly the addresses run listens on.
func rulesOptions(f *runFlags, npAddrs []netip.Addr) rules.Options {
	o := rules.Options{ClusterCIDRs: f.clusterCIDRs.values, LocalAddrs: npAddrs}
	for _, a := range npAddrs {
		o.NodePortAddresses = append(o.NodePortAddresses, hostPrefix(a))
	}
	return o
}

// checkScheduler refuses a scheduler name or flags balancer does not know
// (service.Config.CheckScheduler).
func checkScheduler(name, flags string) error {
	_, err := balancer.ParseScheduler(name, flags)
	return err
}

// checkServiceAnnotations refuses a Service whose userproxy.io annotations
// do not parse (file.WithServiceCheck): a bad file fails its load. The
// scheduler and its flags must parse; the PROXY protocol version must be
// one the Service's ports can carry (v1 has no UDP).
func checkServiceAnnotations(s *v1.Service) error {
	name, flags := s.Annotations[service.AnnotationScheduler], s.Annotations[service.AnnotationSchedulerFlags]
	if name != "" || flags != "" {
		if err := checkScheduler(name, flags); err != nil {
			return fmt.Errorf("metadata.annotations[%s]: %w", service.AnnotationScheduler, err)
		}
	}
	if pp, ok := s.Annotations[service.AnnotationProxyProtocol]; ok {
		v, err := proxy.ParseProxyProtocol(pp)
		for i := 0; err == nil && i < len(s.Spec.Ports); i++ {
			proto := service.TCP
			if s.Spec.Ports[i].Protocol == v1.ProtocolUDP {
				proto = service.UDP
			}
			err = v.Check(proto)
		}
		if err != nil {
			return fmt.Errorf("metadata.annotations[%s]: %w", service.AnnotationProxyProtocol, err)
		}
	}
	return nil
}

// objectSource is what run needs of a source.
type objectSource interface {
	Run(ctx context.Context) error
	LastError() error
}

func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var f runFlags
	f.register(fs)
	if help, err := parseArgs(fs, args, stdout, runAbout); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fmt.Errorf("run: unexpected arguments %v (a file of Services and EndpointSlices goes to --config FILE)", fs.Args()))
	}
	logger, err := f.validatedLogger(stderr)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	return runProxy(ctx, &f, logger)
}

// --after-handover's values.
const (
	afterHandoverExit = "exit"
	afterHandoverWait = "wait"
)

// errHandedOver is run's return once the proxy was handed over to a new
// process: no failure (runProxy makes it nil).
var errHandedOver = errors.New("handed over")

// runProxy runs the proxy until ctx ends; once it has handed over, it
// exits, or with --after-handover wait, waits for ctx to end: a container
// that exits is started again by its kubelet, and would take the proxy
// back.
func runProxy(ctx context.Context, f *runFlags, logger *zap.Logger) error {
	err := run(ctx, f, logger)
	if !errors.Is(err, errHandedOver) {
		return err
	}
	if f.afterHandover == afterHandoverWait && ctx.Err() == nil {
		// SIGHUP would end it, and its kubelet start it again: a
		// restart of what no longer serves is nothing.
		signal.Ignore(syscall.SIGHUP)
		logger.Info("handed over: serving nothing, waiting for a signal to exit (--after-handover wait)")
		<-ctx.Done()
	}
	return nil
}

// validatedLogger validates f and returns the logger its flags ask for.
func (f *runFlags) validatedLogger(w io.Writer) (*zap.Logger, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	return f.log.newLogger(w)
}

func run(ctx context.Context, f *runFlags, logger *zap.Logger) error {
	logger.Info("userproxy starting", zap.String("version", versionString()), zap.String("mode", proxyModeOf(f)),
		zap.String("scheduler", f.scheduler), zap.String("node", f.nodeName))
	// 1. The proxy and its conntrack table (a random hash seed, a coarse
	// clock ticked by px.Run, which also sweeps and ends flows), the tracker.
	timeouts := conntrack.DefaultTimeouts()
	timeouts.TCPEstablished, timeouts.TCPCloseWait = f.ctEstablished, f.ctCloseWait
	timeouts.UDP, timeouts.UDPStream = f.ctUDP, f.ctUDPStream
	ctMax := f.conntrackMax
	switch {
	case ctMax == 0 && f.conntrackMaxPerCore > 0:
		// kube-proxy's sizing of nf_conntrack_max (pkg/proxy/conntrack
		// sysctls.go): maxPerCore per CPU, at least min.
		ctMax = max(f.conntrackMaxPerCore*runtime.NumCPU(), f.conntrackMin)
	case ctMax == 0:
		ctMax = conntrack.DefaultMax(runtime.NumCPU())
	}
	locals := newLocalSources(f.clusterCIDRs.values, logger.Named("local-addresses"))
	pf, err := newPortForwarder(f, f.via, logger.Named("portforward"))
	if err != nil {
		return err
	}
	pxc := proxy.Config{
		LocalSource: locals.local,
		Conntrack:   conntrack.Config{Max: ctMax, Timeouts: timeouts, Liberal: f.ctLiberal},
		DialTimeout: f.dialTimeout, AffinityListSize: f.affinityListSize,
		Via: f.via, DirectAttempt: f.dialDirect,
		MaxUDPSessions: f.maxUDPSessions, Scheduler: f.sched, Logger: logger.Named("proxy")}
	if pf != nil {
		defer pf.Close() // after the flows: their streams go first
		pxc.PodDialer = pf
	}
	px, err := proxy.New(pxc)
	if err != nil {
		return err
	}
	ct, defrag := px.Conntrack(), px.Reassembler()
	responder, err := newResponder(f, px, logger)
	if err != nil {
		return err
	}
	var synced sync.Once
	firstSync := make(chan struct{})
	var routes atomic.Pointer[extRoutes] // set once the TUN is open
	npAddrs, err := nodePortAddrs(f.nodePortAddresses)
	if err != nil {
		return err
	}
	if f.nodePortFilter != nil {
		npAddrs = slices.DeleteFunc(npAddrs, func(a netip.Addr) bool { return !f.nodePortFilter(a) })
	}
	nodePorts := px.NewNodePorts(npAddrs)
	defer nodePorts.Close()
	var serviceHealth atomic.Pointer[admin.ServiceHealth] // set once the tracker exists
	steppedAside := stepAsideLogger(f, logger)
	cf := newConflicts(f.serviceCIDRs.values, f.tunName, newHostProbe(), logger.Named("conflicts"))
	tracker, err := service.NewTracker(service.Config{
		NodeName: f.nodeName, Zone: f.zone, MinSyncPeriod: f.minSyncPeriod,
		CheckScheduler: checkScheduler,
		OnSync: func(t *service.Table, c service.Changes) {
			px.SetTable(t, c)
			if r := routes.Load(); r != nil {
				r.Sync(t.ExternalAddrs())
			}
			nodePorts.Sync(t)
			if sh := serviceHealth.Load(); sh != nil {
				sh.Sync(t)
			}
			steppedAside(t)
			cf.syncTable(t)
			synced.Do(func() { close(firstSync) })
			if ce := logger.Check(zap.DebugLevel, "service table live"); ce != nil {
				ce.Write(zap.Int("servicePorts", t.Len()), zap.Int("changedPorts", len(c.Ports)))
			}
		},
	})
	if err != nil {
		return err
	}
	defer tracker.Close()
	// kube-proxy's health state; the Node is watched with a cluster source.
	proxierHealth := admin.NewProxierHealth(tracker, servedFamilies(f.serviceCIDRs.values), f.config == "", admin.DefaultHealthTimeout, nil)
	proxierHealth.SetProblems(cf.notes)
	sh := admin.NewServiceHealth(npAddrs, proxierHealth.IsHealthy, logger.Named("healthcheck"))
	defer sh.Close()
	serviceHealth.Store(sh)
	if t := tracker.Current(); t != nil {
		sh.Sync(t)
	}

	// 2. The source. A bad config at start is fatal, with file, document
	// and field named.
	// client-go's request metrics, for the admin server's registry: set up
	// before the source so that its first requests count.
	var rest *restClientMetrics
	if f.config == "" {
		rest = newRESTClientMetrics()
		useRESTClientMetrics(rest)
		defer useRESTClientMetrics(nil)
	}
	src, client, err := newSource(f, tracker, logger)
	if err != nil {
		return err
	}
	// A descriptor per proxied connection and flow: said once the
	// configuration is known to be good.
	logFileLimit(logger)
	if client != nil {
		readNode(ctx, client, f, tracker, proxierHealth, logger.Named("node"))
	}
	// kube-proxy's health server: a port that is taken fails the start, as
	// the admin server's does.
	// Taking over, the running proxy holds the port until it has handed
	// over: the listen waits for it (listenTakingOver).
	var healthLn net.Listener
	if f.healthzAddr != "" && !f.takeOver {
		if healthLn, err = net.Listen("tcp", f.healthzAddr); err != nil {
			return listenHint("--healthz-bind-address", f.healthzAddr, err)
		}
		defer healthLn.Close()
	}

	// 3. The TUN and the stack: the running proxy's, taken over (its
	// queues, its flows, its routes: handover_linux.go), or our own.
	// Taking over, the source runs first: the running proxy pauses from
	// the moment it is asked, and the first packets after the pause need
	// this process's service table (takeOverSync).
	srcErr := make(chan error, 1)
	var srcWG sync.WaitGroup
	srcCtx, cancelSrc := context.WithCancel(ctx)
	defer func() { cancelSrc(); srcWG.Wait() }()
	var to *takeover
	hoStats := &handoverStats{}
	// A handover socket nobody serves: the proxy before this one crashed.
	crashed := predecessorCrashed(f.handoverSocket)
	if f.takeOver {
		srcWG.Add(1)
		go func() { defer srcWG.Done(); srcErr <- src.Run(srcCtx) }()
		select {
		case <-firstSync:
		case err := <-srcErr:
			return fmt.Errorf("taking over: source: %w", err)
		case <-time.After(takeOverSync):
			return fmt.Errorf("taking over: no service table after %v; the running proxy serves on", takeOverSync)
		}
		to, err = takeOver(f.handoverSocket, logger.Named("handover"))
		if errors.Is(err, errOldDied) {
			crashed, err = true, nil
		}
		if err != nil {
			return err
		}
	}
	var strayResets time.Duration
	if crashed {
		strayResets = strayResetWindow
		logger.Warn("a proxy before this one ended without cleaning up: its clients' segments of flows it held are answered with a RST for a while, so that their connections end instead of hanging",
			zap.String("handoverSocket", f.handoverSocket), zap.Duration("for", strayResets))
	}
	var tun *tunDevice
	if to != nil {
		// Until the old process commits, every way out tells it to serve
		// on (takeover.fail does nothing once it has committed).
		defer to.fail(errors.New("the new process ended before taking over"))
		if tun, err = adoptTUN(to, f.tunName, f.serviceCIDRs.values, logger.Named("tun")); err != nil {
			to.fail(err)
			return fmt.Errorf("taking over: %w", err)
		}
	} else {
		tun, err = openTUN(tunConfig{name: f.tunName, mtu: f.mtu, offload: f.tunOffload, portable: f.tunPortable, queues: f.queues()},
			f.serviceCIDRs.values, logger.Named("tun"))
		if err != nil {
			return err
		}
	}
	defer tun.close()
	ops, err := tun.hostRoutes()
	if err != nil {
		return err
	}
	cf.tun = tun.name
	ext := newExtRoutes(ops, tun.name, f.serviceCIDRs.values, logger.Named("tun"))
	defer ext.Close() // before tun.close
	routes.Store(ext)
	ext.Sync(px.Table().ExternalAddrs())
	// The host's checks and its resolver's settings. Taking over, they
	// wait for the commit: the old process is paused until this one
	// confirms, and the checks run commands (iptables-save, nft,
	// resolvectl) that would lengthen the pause by a few hundred ms.
	var revertDNS func()
	defer func() {
		// Not once handed over (the next process's now), nor after a
		// takeover that failed (the old process's still).
		if revertDNS != nil && !tun.handedOver && (to == nil || to.committed) {
			revertDNS()
		}
	}()
	hostSetup := func() {
		cf.checkHost()
		if responder != nil {
			revertDNS = configureHostDNS(hostDNS{tun: tun.name, ip: f.dns.addr, domain: f.dns.domain, enabled: f.dns.hostConfig}, logger.Named("dns"))
		}
	}
	if to == nil {
		hostSetup()
	}
	if f.tcpTranslate {
		if err := proxy.TranslateSupported(); err != nil {
			logger.Warn("TCP flows are terminated by gVisor's stack, not translated", zap.Error(err))
			f.tcpTranslate = false
		}
	}
	st, err := netstack.New(netstack.Options{Link: tun.link, Conntrack: ct, Reassembler: defrag, Admit: px.Admit, Logger: logger.Named("netstack"),
		MaxInFlight: f.maxInFlight, MaxInFlightPerClient: f.maxInFlightClient, HandshakeTimeout: f.handshakeTimeout,
		StrayResets:  strayResets,
		TranslateTCP: f.tcpTranslate})
	if err != nil {
		if to != nil {
			to.fail(err)
		}
		return err
	}
	defer st.Close() // runs before tun.close: flows end, then routes go
	st.SetFlowHandler(px)
	if to != nil {
		if err := adoptFlows(to, tun, st, px, hoStats, logger.Named("handover")); err != nil {
			return err
		}
		hostSetup()
		// The old process's NodePort and health listeners, lent: served
		// on at once, no port bound anew.
		if healthLn = inheritListeners(to, nodePorts, px.Table(), f.healthzAddr); healthLn == nil {
			if healthLn, err = listenTakingOver(f.healthzAddr); err != nil {
				return listenHint("--healthz-bind-address", f.healthzAddr, err)
			}
		}
		if healthLn != nil {
			defer healthLn.Close()
		}
	}

	// Every early return below must stop these goroutines before the
	// deferred closes run: cancel first, then wait.
	// Their context is not the signal's: on SIGTERM this process may wait
	// for a taker first (--handover-on-term), serving meanwhile.
	sigCtx := ctx
	ctx, cancel := context.WithCancel(context.WithoutCancel(sigCtx))
	var wg sync.WaitGroup
	// The tracker goes first: a build timer firing during teardown would
	// sync the routes and sockets the deferred closes take down.
	defer func() { cancel(); cancelSrc(); srcWG.Wait(); wg.Wait(); tracker.Close() }()
	if !f.takeOver {
		srcWG.Add(1)
		go func() { defer srcWG.Done(); srcErr <- src.Run(srcCtx) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); px.Run(ctx) }()
	go func() { defer wg.Done(); locals.run(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); runProcs(ctx, f.procs, logger) }()
	wg.Add(1)
	go func() { defer wg.Done(); cf.run(ctx) }()
	wg.Add(1)
	go func() { // retries the sockets a taken port refused
		defer wg.Done()
		retryFailed(ctx, func() {
			if t := px.Table(); t != nil && (len(nodePorts.Failed()) > 0 || len(sh.Failed()) > 0) {
				nodePorts.Sync(t)
				sh.Sync(t)
			}
		})
	}()
	if healthLn != nil {
		wg.Add(1)
		go func() { defer wg.Done(); proxierHealth.Serve(ctx, healthLn, logger.Named("healthz")) }()
	}
	if client != nil {
		wg.Add(1)
		go func() { defer wg.Done(); watchNode(ctx, client, f, tracker, proxierHealth, logger.Named("node")) }()
		wg.Add(1)
		go func() { defer wg.Done(); watchServiceCIDRs(ctx, client, ext, cf, px, logger.Named("servicecidrs")) }()
	}

	// 4. The admin server.
	if f.adminAddr != "" {
		stopAdmin, err := startAdmin(ctx, f.adminAddr, f.controlSocket, adminDeps{takingOver: to != nil, handover: hoStats, proxyMode: proxyModeOf(f), configz: f.configz, ct: ct, defrag: defrag, px: px, st: st, tracker: tracker, src: src, firstSync: firstSync, dns: responder, profiling: f.profiling, nodePorts: nodePorts, proxierHealth: proxierHealth,
			rest: rest, families: servedFamilies(f.serviceCIDRs.values), dial: dialView(f.via, px, pf), pf: pf,
			rules:     rulesOptions(f, npAddrs),
			conflicts: cf, clusterDomain: f.dns.domain,
			notes: func() []string {
				return append(append(append(ext.notes(), nodePorts.Failed()...), sh.Failed()...), cf.notes()...)
			}}, logger.Named("admin"))
		if err != nil {
			return err
		}
		defer stopAdmin()
	}
	ho := listenHandover(f.handoverSocket, st, tun, px, listenerLender{nodePorts: nodePorts, health: healthLn, healthAddr: f.healthzAddr}, hoStats, logger.Named("handover"))
	defer ho.Close()
	// SIGHUP: a restart, handing over to the binary started again
	// (restart.go). Without this, SIGHUP would end the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	rs := newRestarter(f.handoverSocket, ho.Done(), logger.Named("restart"))
	if ho == nil && rs.enabled == nil {
		rs.enabled = errors.New("no handover socket")
	}
	wg.Add(1)
	go func() { defer wg.Done(); rs.run(ctx, hup) }()
	logger.Info("userproxy running", zap.String("tun", tun.name), zap.Stringer("serviceCIDRs", &f.serviceCIDRs),
		zap.String("node", f.nodeName), zap.String("admin", f.adminAddr), zap.Stringer("dialVia", f.via), f.dns.field())

	// 5. Until a signal, a handover, or the source fails for good.
	handedOver := false
	select {
	case <-sigCtx.Done():
		handedOver = awaitTaker(ho, f.handoverOnTerm, logger)
		if !handedOver {
			logger.Info("shutting down: draining flows", zap.Int("flows", px.Flows()))
			ho.Close() // no taker while draining; its socket file goes now, before a second signal's exit
			select {
			case <-ho.Done(): // a taker confirmed while Close waited for it
				handedOver = true
			default:
			}
		}
	case err := <-srcErr:
		if err != nil {
			return fmt.Errorf("source: %w", err)
		}
	case <-ho.Done():
		handedOver = true
	}
	cancel() // the servers and the sweeper stop, and free their ports
	if handedOver {
		// The next process reads the TUN now: what did not move ends at
		// once (a reset, as a restart gives it), and nothing of the
		// device's is removed.
		ho.Close()
		nodePorts.Close()
		ext.handOver()
		expired, cancelExpired := context.WithTimeout(context.Background(), 0)
		defer cancelExpired()
		if n := px.Shutdown(expired); n > 0 {
			logger.Info("handed over: reset the flows that could not move", zap.Int("flows", n))
		}
		return errHandedOver
	}
	// Stop admitting, let the flows finish for a moment, then reset what is
	// left (a response cut short must look cut short); the deferred Close
	// of the stack then removes the rest.
	nodePorts.Close() // no new NodePort flows while the others drain
	drain, cancelDrain := context.WithTimeout(context.Background(), shutdownGrace)
	if n := px.Shutdown(drain); n > 0 {
		logger.Info("shutdown: reset the flows still open after the grace period", zap.Int("flows", n), zap.Duration("grace", shutdownGrace))
	}
	cancelDrain()
	return nil
}

// awaitTaker waits up to d, after SIGTERM, for a new process to take over
// (--handover-on-term); it reports whether one did.
func awaitTaker(ho *handoverServer, d time.Duration, logger *zap.Logger) bool {
	if d <= 0 || ho == nil {
		return false
	}
	logger.Info("SIGTERM: waiting for a new process to take over before draining (--handover-on-term)", zap.Duration("upTo", d))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ho.Done():
		return true
	case <-t.C:
		logger.Info("no new process took over", zap.Duration("waited", d))
		return false
	}
}

// takeOverSync bounds a taker's wait for its first service table: an API
// server's informers sync in seconds.
const takeOverSync = time.Minute

// shutdownGrace bounds how long SIGTERM waits for flows to finish on their
// own before resetting them.
const shutdownGrace = 3 * time.Second

// newSource returns the object source, and the API server's client when
// the source is a cluster (nil for a file).
func newSource(f *runFlags, h service.Handler, logger *zap.Logger) (objectSource, kubernetes.Interface, error) {
	if f.config != "" {
		s := file.New(f.config, h, logger.Named("file"), file.WithServiceCheck(checkServiceAnnotations))
		if err := s.Load(); err != nil {
			return nil, nil, err
		}
		return s, nil, nil
	}
	if err := checkInClusterHost(f); err != nil {
		return nil, nil, err
	}
	client, err := kube.NewClientWith(kube.ClientOptions{Kubeconfig: f.kubeconfig, Master: f.master,
		QPS: f.clientQPS, Burst: f.clientBurst, ContentType: f.clientContentType})
	if err != nil {
		return nil, nil, fmt.Errorf("API server: %w", err)
	}
	return kube.New(client, h, logger.Named("kube")), client, nil
}

// retryInterval is how often NodePorts and health check node ports that
// could not be opened (a port taken on the host) are tried again.
const retryInterval = 10 * time.Second

// retryFailed calls retry every retryInterval until ctx is done.
func retryFailed(ctx context.Context, retry func()) { every(ctx, retryInterval, retry) }

// every calls f every interval until ctx is done.
func every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// readNode reads this node's Node once at start, so that the first table
// already uses its zone; a failure is logged (the watch tries on).
func readNode(ctx context.Context, client kubernetes.Interface, f *runFlags, tracker *service.Tracker, ph *admin.ProxierHealth, logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	node, err := client.CoreV1().Nodes().Get(ctx, f.nodeName, metav1.GetOptions{})
	if err != nil {
		logger.Warn("reading this Node at start (is --node-name right?); its zone and eligibility wait for the watch", zap.String("node", f.nodeName), zap.Error(err))
		return
	}
	st := kube.NodeStateOf(node, false)
	ph.SetNodeEligible(st.Eligible)
	if f.zone == "" {
		tracker.SetZone(st.Zone)
	}
}

// checkInClusterHost refuses an in-cluster configuration whose API server
// address (KUBERNETES_SERVICE_HOST, the kubernetes Service's ClusterIP by
// default) is inside a --service-cidr: run routes that CIDR into its own
// TUN, and cannot serve the address before its first table, which needs the
// API server. kube-proxy's DaemonSet has the same problem and solves it the
// same way: the control plane's own address (examples/kubernetes).
func checkInClusterHost(f *runFlags) error {
	if f.kubeconfig != "" {
		return nil
	}
	host := os.Getenv("KUBERNETES_SERVICE_HOST")
	a, err := netip.ParseAddr(host)
	if err != nil {
		return nil // a name, or none: the client says what is wrong
	}
	for _, p := range f.serviceCIDRs.values {
		if p.Contains(a.Unmap()) {
			return fmt.Errorf("the API server is reached at KUBERNETES_SERVICE_HOST=%s, inside --service-cidr %s, which userproxy itself serves, "+
				"so it cannot reach the API server before its first table: set KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "+
				"to the control plane's address (examples/kubernetes reads them from the userproxy-apiserver ConfigMap), or give --kubeconfig", host, p)
		}
	}
	return nil
}

// watchNode follows this node's Node (with a cluster source): its zone
// label sets the zone of topology hints unless --zone is given, and its
// deletion or autoscaler taint makes /healthz's nodeEligible false.
// watchServiceCIDRs routes the cluster's ServiceCIDRs into the TUN besides
// --service-cidr's, while the cluster has them, and checks the table and
// the host against every CIDR routed (kube.WatchServiceCIDRs).
func watchServiceCIDRs(ctx context.Context, client kubernetes.Interface, ext *extRoutes, cf *conflicts, px *proxy.Proxy, logger *zap.Logger) {
	err := kube.WatchServiceCIDRs(ctx, client, logger, func(cluster []netip.Prefix) {
		cf.setServiceCIDRs(ext.SetServiceCIDRs(cluster))
		if t := px.Table(); t != nil {
			cf.syncTable(t)
		}
		cf.checkHost()
	})
	if err != nil {
		logger.Info("the routes follow --service-cidr alone", zap.Error(err))
	}
}

func watchNode(ctx context.Context, client kubernetes.Interface, f *runFlags, tracker *service.Tracker, ph *admin.ProxierHealth, logger *zap.Logger) {
	err := kube.WatchNode(ctx, client, f.nodeName, logger, func(st kube.NodeState) {
		ph.SetNodeEligible(st.Eligible)
		if f.zone == "" && st.Zone != tracker.Zone() {
			logger.Info("zone from the Node's label", zap.String("zone", st.Zone))
			tracker.SetZone(st.Zone)
		}
	})
	if err != nil {
		logger.Error("watching this Node", zap.Error(err))
	}
}

// logFileLimit logs the open-file limit run works within (Go's syscall
// package raised the soft limit to just under the hard one at start; macOS
// caps it at kern.maxfilesperproc). Every proxied TCP connection holds a host
// socket, and so does every UDP flow; a dial that finds no descriptor left
// fails (a TCP client gets a RST) and counts as dial_failed.
func logFileLimit(logger *zap.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		logger.Warn("reading the open file limit", zap.Error(err))
		return
	}
	logger.Info("open file limit: one descriptor per proxied TCP connection and per UDP flow",
		zap.Uint64("soft", lim.Cur), zap.Uint64("hard", lim.Max))
}

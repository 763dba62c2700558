package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/balancer"
	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/file"
)

const explainAbout = `userproxy explain: what a new connection to DESTINATION would meet, step by
step: the route into the TUN (or what takes it first), the Service and port,
the traffic policies and topology, the usable endpoints and why others are
left out, affinity, the lottery's odds or the IPVS scheduler, and the verdict
(FORWARD, REJECT or DROP). It asks the running proxy (its admin address), or
with --config evaluates a file's objects as run would. DESTINATION is
IP:PORT, NAME.NAMESPACE[.svc[.cluster.local]]:PORT (the port's number or
name), or a NodePort with --nodeport.

Examples:
  userproxy explain 10.96.0.10:80
  userproxy explain web.default.svc:http --from 10.244.1.7
  userproxy explain --nodeport 127.0.0.1:30080
  userproxy explain --config services.yaml web.default:80 --dial
`

// runExplain explains a destination.
func runExplain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("admin-addr", defaultAdminAddr, "admin address of the running proxy")
	config := fs.String("config", "", "evaluate this file or directory of Services and EndpointSlices instead of asking a running proxy")
	from := fs.String("from", "", "the client's address (default: the source address this host's route to DESTINATION takes, else 192.0.2.1)")
	protocol := fs.String("protocol", "tcp", "tcp or udp")
	nodePort := fs.Bool("nodeport", false, "DESTINATION's port is a NodePort (on one of the node's NodePort addresses)")
	dial := fs.Bool("dial", false, "also connect to DESTINATION (TCP) from this host and say what happened")
	asJSON := fs.Bool("json", false, "print the answer as JSON")
	nodeName := fs.String("node-name", "", "with --config: this node's name (default: the hostname)")
	zone := fs.String("zone", "", "with --config: this node's zone, for topology hints")
	scheduler := fs.String("scheduler", "random", "with --config: the default scheduler, as run's --scheduler")
	domain := fs.String("cluster-domain", clusterdns.DefaultDomain, "the cluster domain of service names")
	tunName := fs.String("tun-name", "userproxy0", "the proxy's TUN device, to check the route against")
	if help, err := parseArgs(fs, args, stdout, explainAbout); help || err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageErr(errors.New("explain: want one DESTINATION (userproxy explain --help)"))
	}
	dest := fs.Arg(0)
	proto := strings.ToLower(*protocol)
	if proto != "tcp" && proto != "udp" {
		return usageErr(fmt.Errorf("--protocol %q: want tcp or udp", *protocol))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	var ans admin.ExplainAnswer
	var route string
	if *config == "" {
		// The route is the host's: look it up first, for the client too.
		client := *from
		if ap, err := netip.ParseAddrPort(dest); err == nil {
			route, client = describeRoute(ap.Addr(), *tunName, client)
		}
		if client == "" {
			client = defaultExplainClient
		}
		a, err := admin.FetchExplain(ctx, *addr, dest, client, proto, *nodePort)
		if err != nil {
			return fmt.Errorf("explain: %w (is a proxy running? --admin-addr names its address; --config FILE explains a file instead)", err)
		}
		ans = a
		if route == "" {
			if ap, err := netip.ParseAddrPort(a.Destination); err == nil {
				route, _ = describeRoute(ap.Addr(), *tunName, client)
			}
		}
	} else {
		client := *from
		if client == "" {
			client = defaultExplainClient
		}
		a, err := explainFile(*config, *nodeName, *zone, *scheduler, *domain, dest, client, proto, *nodePort)
		if err != nil {
			return err
		}
		ans = a
	}
	if *dial {
		ans.Steps = append(ans.Steps, dialStep(ctx, proto, ans.Destination))
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Route string `json:"route,omitempty"`
			admin.ExplainAnswer
		}{route, ans})
	}
	printExplanation(stdout, route, ans)
	return nil
}

// defaultExplainClient is the client assumed when none is given or found:
// a documentation address (RFC 5737), neither this host nor a pod.
const defaultExplainClient = "192.0.2.1"

// explainFile evaluates the objects of path as run would serve them.
func explainFile(path, nodeName, zone, scheduler, domain, dest, client, proto string, nodePort bool) (admin.ExplainAnswer, error) {
	if nodeName == "" {
		nodeName, _ = os.Hostname()
	}
	sched, err := parseSchedulerFlag(scheduler)
	if err != nil {
		return admin.ExplainAnswer{}, err
	}
	px, err := proxy.New(proxy.Config{Scheduler: sched, Logger: zap.NewNop()})
	if err != nil {
		return admin.ExplainAnswer{}, err
	}
	tracker, err := service.NewTracker(service.Config{NodeName: strings.ToLower(nodeName), Zone: zone, OnSync: px.SetTable,
		CheckScheduler: checkScheduler})
	if err != nil {
		return admin.ExplainAnswer{}, err
	}
	defer tracker.Close()
	if err := file.New(path, tracker, zap.NewNop(), file.WithFSNotify(false), file.WithPollInterval(0),
		file.WithServiceCheck(checkServiceAnnotations)).Load(); err != nil {
		return admin.ExplainAnswer{}, err
	}
	dst, err := px.Destination(dest, domain)
	if err != nil {
		return admin.ExplainAnswer{}, err
	}
	c, err := netip.ParseAddr(client)
	if err != nil {
		return admin.ExplainAnswer{}, usageErr(fmt.Errorf("--from %q: %w", client, err))
	}
	p := service.TCP
	if proto == "udp" {
		p = service.UDP
	}
	return admin.ExplainAnswer{Destination: dst.String(), Client: c.String(), Protocol: p.String(), NodePort: nodePort,
		Explanation: px.Explain(proxy.ExplainQuery{Protocol: p, Client: c, Destination: dst, NodePort: nodePort, LeftOut: tracker.LeftOut})}, nil
}

// dialStep connects to dst from this host (TCP) and says what happened.
func dialStep(ctx context.Context, proto, dst string) string {
	if proto != "tcp" {
		return "--dial: only TCP is dialled"
	}
	start := time.Now()
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", dst)
	if err != nil {
		return fmt.Sprintf("--dial: %s: %v after %v", dst, err, time.Since(start).Round(time.Millisecond))
	}
	_ = c.Close()
	return fmt.Sprintf("--dial: connected to %s in %v", dst, time.Since(start).Round(time.Microsecond))
}

// printExplanation writes ans as numbered steps, the endpoints, and the
// verdict.
func printExplanation(w io.Writer, route string, a admin.ExplainAnswer) {
	kind := ""
	if a.NodePort {
		kind = " (NodePort)"
	}
	fmt.Fprintf(w, "%s/%s%s from %s\n", a.Destination, a.Protocol, kind, a.Client)
	steps := a.Steps
	if route != "" {
		steps = append([]string{route}, steps...)
	}
	for i, s := range steps {
		fmt.Fprintf(w, "%2d. %s\n", i+1, s)
	}
	if len(a.Endpoints) > 0 {
		fmt.Fprintf(w, "endpoints (%s):\n", a.Scheduler)
		for _, e := range a.Endpoints {
			fmt.Fprintf(w, "    %-24s %s", e.Address, where(e))
			if a.Scheduler == "random" {
				fmt.Fprintf(w, "  chance %.4f", e.Chance)
			} else {
				fmt.Fprintf(w, "  active %d inactive %d", e.Active, e.Inactive)
			}
			if e.Address == a.Pinned {
				fmt.Fprint(w, "  <- this client, by affinity")
			}
			fmt.Fprintln(w)
		}
	}
	if len(a.LeftOut) > 0 {
		fmt.Fprintln(w, "left out:")
		for _, e := range a.LeftOut {
			fmt.Fprintf(w, "    %-24s %s  %s\n", e.Address, where(e), e.Why)
		}
	}
	fmt.Fprintf(w, "verdict: %s", a.Verdict)
	if a.Result != "" {
		fmt.Fprintf(w, " (counted as userproxy_flows_total{result=%q})", a.Result)
	}
	fmt.Fprintln(w)
}

// where is an endpoint's node and zone, for printing.
func where(e proxy.ExplainedEndpoint) string {
	s := "node " + e.Node
	if e.Node == "" {
		s = "node -"
	}
	if e.Zone != "" {
		s += ", zone " + e.Zone
	}
	return s
}

// parseSchedulerFlag reads a --scheduler value.
func parseSchedulerFlag(name string) (balancer.SchedulerConfig, error) {
	cfg, err := balancer.ParseScheduler(name, "")
	if err != nil {
		return cfg, usageErr(fmt.Errorf("--scheduler: %w", err))
	}
	return cfg, nil
}

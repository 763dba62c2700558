package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// defaultAdminAddr is where run serves /metrics and /debug, and where the
// conntrack, rules and ipvs commands find a running proxy.
const defaultAdminAddr = "127.0.0.1:10249"

const usage = `userproxy: a userspace Kubernetes Service proxy (kube-proxy iptables semantics on a TUN).

Usage:
  userproxy run [flags]               proxy ClusterIPs: --config FILE|DIR, or --kubeconfig, or in-cluster
  userproxy setup --user NAME         (root, once) a persistent TUN device so that run needs no privileges
  userproxy restart                   restart (or upgrade) a running proxy without resetting its connections
  userproxy conntrack list|flush      the connection tracking table of a running proxy
  userproxy rules [--config FILE]     the iptables-save lines kube-proxy would write for the same objects
  userproxy ipvs [--stats|--rate]     the service table of a running proxy, as ipvsadm -Ln lists it
  userproxy demo [flags]              the endpoint lottery and ClientIP affinity on simulated connections
  userproxy kube-proxy [flags]        kube-proxy's command line and KubeProxyConfiguration (also as a binary named kube-proxy)
  userproxy explain DESTINATION       why a connection to a ClusterIP, a service name or a NodePort goes where it goes
  userproxy cleanup                   (root) remove kube-proxy's leftover rules, tables and IPVS device
  userproxy version                   print the version

Run "userproxy <command> -h" for a command's flags.
`

func main() {
	// The first SIGINT or SIGTERM cancels ctx: run drains and cleans up.
	// A second one exits at once, without the drain.
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		cancel()
		<-signals
		fmt.Fprintln(os.Stderr, "userproxy: second signal: exiting without cleanup")
		os.Exit(1)
	}()
	args := os.Args[1:]
	if filepath.Base(os.Args[0]) == "kube-proxy" {
		// kube-proxy's DaemonSet runs /usr/local/bin/kube-proxy: the
		// image links it to this binary.
		args = append([]string{"kube-proxy"}, args...)
	}
	err := runMain(ctx, args, os.Stdout, os.Stderr)
	cancel()
	if err != nil {
		if !errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "userproxy:", err)
		}
		os.Exit(exitCode(err))
	}
}

// exitCode is 2 for a usage error (a flag, an argument, a missing
// command), 1 for any other failure.
func exitCode(err error) int {
	var u usageError
	if errors.Is(err, pflag.ErrHelp) || errors.As(err, &u) {
		return 2
	}
	return 1
}

// runMain dispatches a subcommand; it is main without the process exit, so
// tests can call it.
func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return pflag.ErrHelp
	}
	switch args[0] {
	case "run":
		return runRun(ctx, args[1:], stdout, stderr)
	case "setup":
		return runSetup(ctx, args[1:], stdout, stderr)
	case "restart":
		return runRestart(ctx, args[1:], stdout, stderr)
	case "conntrack":
		return runConntrack(ctx, args[1:], stdout, stderr)
	case "rules":
		return runRules(ctx, args[1:], stdout, stderr)
	case "ipvs":
		return runIPVS(ctx, args[1:], stdout, stderr)
	case "demo":
		return runDemo(ctx, args[1:], stdout, stderr)
	case "kube-proxy":
		return runKubeProxy(ctx, args[1:], stdout, stderr)
	case "explain":
		return runExplain(ctx, args[1:], stdout, stderr)
	case "cleanup":
		return runCleanup(ctx, args[1:], stdout, stderr)
	case "version", "--version", "-version":
		b := readBuildInfo()
		fmt.Fprintln(stdout, "userproxy", b.Version)
		if b.Revision != "" {
			fmt.Fprintf(stdout, "  commit %s %s (modified: %v)\n", b.Revision, b.Time, b.Modified)
		}
		fmt.Fprintf(stdout, "  %s, kube-proxy %s's command line and configuration\n", b.GoVersion, kubeProxyVersion)
		return nil
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageErr(fmt.Errorf("unknown command %q", args[0]))
	}
}

// logFlags are the logging flags every long-running command takes.
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&l.format, "log-format", "", "log format: json, console, or text (klog's, as kube-proxy writes it; default: console on a terminal, json otherwise)")
}

// newLogger builds the process logger, writing to w.
func (l *logFlags) newLogger(w io.Writer) (*zap.Logger, error) {
	level, err := zapcore.ParseLevel(l.level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	encCfg := zap.NewProductionEncoderConfig()
	encCfg.EncodeTime = zapcore.ISO8601TimeEncoder
	format := l.format
	if format == "" {
		format = "json"
		if f, ok := w.(*os.File); ok {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				format = "console"
			}
		}
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		enc = zapcore.NewJSONEncoder(encCfg)
	case "console":
		enc = zapcore.NewConsoleEncoder(encCfg)
	case "text":
		// klog's header names the caller's file and line.
		return zap.New(zapcore.NewCore(newKlogEncoder(), zapcore.AddSync(w), level), zap.AddCaller()), nil
	default:
		return nil, fmt.Errorf("--log-format %q: want json, console or text", l.format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), level)), nil
}

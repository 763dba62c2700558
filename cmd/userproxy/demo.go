package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/balancer"
)

// runDemo simulates new connections to one service port and prints how the
// balancer split them, next to the probabilities kube-proxy would print in its
// KUBE-SVC chain for the same endpoints.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("demo", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoints := fs.Int("endpoints", 3, "number of endpoints of the service port")
	conns := fs.Int("connections", 6000, "number of simulated new connections")
	clients := fs.Int("clients", 50, "number of distinct client addresses, used in rotation")
	affinity := fs.Duration("affinity", 0, "ClientIP session affinity timeout (0: sessionAffinity None)")
	listSize := fs.Int("affinity-list-size", balancer.DefaultListSize, "clients per endpoint affinity list (xt_recent ip_list_tot)")
	seed := fs.Uint64("seed", 0, "random seed (0: random; the seed used is logged)")
	var lf logFlags
	lf.register(fs)
	if help, err := parseArgs(fs, args, stdout, demoAbout); help || err != nil {
		return err
	}
	switch {
	case *endpoints < 1 || *endpoints > 100000:
		return fmt.Errorf("--endpoints %d: want 1..100000", *endpoints)
	case *conns < 1 || *conns > 100_000_000:
		return fmt.Errorf("--connections %d: want 1..100000000", *conns)
	case *clients < 1 || *clients > 1<<24:
		return fmt.Errorf("--clients %d: want 1..16777216", *clients)
	case *affinity < 0 || *affinity > 86400*time.Second:
		return fmt.Errorf("--affinity %v: want 0..86400s", *affinity)
	}
	logger, err := lf.newLogger(stderr)
	if err != nil {
		return err
	}
	defer func() { _ = logger.Sync() }()
	if *seed == 0 {
		*seed = rand.Uint64()
	}
	logger.Info("demo starting", zap.Int("endpoints", *endpoints), zap.Int("connections", *conns),
		zap.Int("clients", *clients), zap.Duration("affinity", *affinity), zap.Uint64("seed", *seed))

	keys := make([]string, *endpoints)
	for i := range keys {
		keys[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, byte((i + 1) >> 8), byte(i + 1)}), 8080).String()
	}
	// kube-proxy orders a service port's endpoints by their "ip:port" string.
	slices.Sort(keys)
	lottery := balancer.NewLottery(*endpoints)
	var aff *balancer.Affinity
	if *affinity > 0 {
		aff = balancer.NewAffinity(balancer.AffinityConfig{Timeout: *affinity, ListSize: *listSize})
	}
	picker := balancer.NewPicker(lottery, balancer.NewSeededSource(*seed), aff)

	counts := make([]int, *endpoints)
	hits := 0
	for c := range *conns {
		if c%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		n := c % *clients
		client := netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
		i, byAffinity := picker.Pick(keys, client)
		counts[i]++
		if byAffinity {
			hits++
		}
	}

	exact := lottery.Probabilities(*endpoints)
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "endpoint\tiptables --probability\texact share\tconnections\tshare\t")
	for i, k := range keys {
		prob := "(last rule)"
		if i < *endpoints-1 {
			prob = balancer.ProbabilityString(*endpoints - i)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.6f\t%d\t%.4f\t\n", k, prob, exact[i], counts[i], float64(counts[i])/float64(*conns))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the table: %w", err)
	}
	if aff != nil {
		fmt.Fprintf(stdout, "affinity decided %d of %d connections\n", hits, *conns)
	}
	return nil
}

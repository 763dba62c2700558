package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

const cleanupAbout = `userproxy cleanup: remove what kube-proxy left on this host (root), as its
--cleanup does: every KUBE-* iptables chain and the jumps to them (legacy and
nft backends, IPv4 and IPv6), the nftables tables ip and ip6 kube-proxy, the
IPVS device kube-ipvs0 with the ClusterIPs on it, and the IPVS virtual servers
(with ipvsadm). Each of these catches Service traffic before userproxy's TUN
(run reports them on /readyz). userproxy itself leaves no rules.

Examples:
  sudo userproxy cleanup
  kube-proxy --cleanup            # the same, as kube-proxy's flag
`

// runCleanup is `userproxy cleanup`.
func runCleanup(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("cleanup", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	if help, err := parseArgs(fs, args, stdout, cleanupAbout); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr(fmt.Errorf("cleanup: unexpected arguments %v", fs.Args()))
	}
	return cleanup(stdout)
}

// cleanup removes kube-proxy's leftovers and says what it removed.
func cleanup(stdout io.Writer) error {
	done, err := cleanupKubeProxy()
	for _, d := range done {
		fmt.Fprintln(stdout, "removed", d)
	}
	if len(done) == 0 && err == nil {
		fmt.Fprintln(stdout, "nothing of kube-proxy's found")
	}
	if err != nil {
		return fmt.Errorf("cleanup: encountered an error while tearing down rules: %w", err)
	}
	return nil
}

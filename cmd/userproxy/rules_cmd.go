package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/file"
)

// runRules prints the iptables-save lines kube-proxy would write for the
// same objects: offline from --config, or from a running proxy.
func runRules(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("rules", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "YAML/JSON file or directory of Services and EndpointSlices (offline; else ask the running proxy)")
	addr := fs.String("admin-addr", defaultAdminAddr, "admin address of the running proxy (without --config)")
	format := fs.String("format", "save", "save: as iptables-save prints them on a kube-proxy node; restore: as kube-proxy writes them")
	nodeName := fs.String("node-name", "", "node name, for internalTrafficPolicy Local (default: hostname)")
	jump := fs.Bool("jump-rules", false, "also print the hooks from PREROUTING/OUTPUT/FORWARD (for iptables-restore into a namespace)")
	var cidrs prefixList
	fs.Var(&cidrs, "cluster-cidr", "pod CIDR for kube-proxy's masquerade rule (repeatable)")
	var npAddrs nodePortCIDRs
	fs.Var(&npAddrs, "nodeport-addresses", "with --config, kube-proxy's --nodeport-addresses: comma-separated CIDRs whose addresses on this host NodePorts answer on (default: all local addresses; \"primary\" is refused)")
	noLocalhostNP := fs.Bool("no-localhost-nodeports", false, "with --config, as kube-proxy's --iptables-localhost-nodeports=false: no NodePorts on 127.0.0.0/8")
	nfacct := fs.Bool("nfacct", false, "with --config, as when kube-proxy's nfacct counters exist on the node: print its nfacct matches")
	if help, err := parseArgs(fs, args, stdout, rulesAbout); help || err != nil {
		return err
	}
	f, err := rules.ParseFormat(*format)
	if err != nil {
		return fmt.Errorf("--format: %w", err)
	}
	if *config == "" {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		out, err := admin.FetchRules(ctx, *addr, f, 0)
		if err != nil {
			return fmt.Errorf("rules: %w: %w (or give --config FILE)", errNoAdmin, err)
		}
		_, err = io.WriteString(stdout, out)
		return err
	}
	if *nodeName == "" {
		*nodeName, _ = os.Hostname()
	}
	t, err := loadTable(*config, *nodeName)
	if err != nil {
		return err
	}
	opts := rules.Options{Format: f, ClusterCIDRs: cidrs.values, JumpRules: *jump,
		NodePortAddresses: npAddrs.values, NoLocalhostNodePorts: *noLocalhostNP, NFAcct: *nfacct}
	if len(npAddrs.values) > 0 {
		// kube-proxy matches the CIDRs against the node's own addresses.
		if opts.LocalAddrs, err = interfaceAddrs(); err != nil {
			return fmt.Errorf("--nodeport-addresses: %w", err)
		}
	}
	return rules.Write(stdout, t, opts)
}

// nodePortCIDRs is --nodeport-addresses in kube-proxy's syntax: CIDRs,
// comma-separated, the flag repeatable; host bits are dropped, as
// kube-proxy's sloppy parsing does. kube-proxy's "primary" (the node's
// primary IPs) is refused: this command does not know them.
type nodePortCIDRs struct{ values []netip.Prefix }

// Type is the value's name in pflag's help.
func (n *nodePortCIDRs) Type() string { return "cidrs" }

func (n *nodePortCIDRs) String() string { return (&prefixList{values: n.values}).String() }

func (n *nodePortCIDRs) Set(v string) error {
	cidrs, primary, err := parseNodePortAddresses(v)
	switch {
	case err != nil:
		return err
	case primary:
		return errors.New(`"primary" is not supported here: give the node's CIDRs`)
	}
	n.values = append(n.values, cidrs...)
	return nil
}

// loadTable builds the service table of a file or directory, once.
func loadTable(path, nodeName string) (*service.Table, error) {
	tracker, err := service.NewTracker(service.Config{NodeName: nodeName})
	if err != nil {
		return nil, err
	}
	defer tracker.Close()
	if err := file.New(path, tracker, zap.NewNop(), file.WithFSNotify(false), file.WithPollInterval(0)).Load(); err != nil {
		return nil, err
	}
	t := tracker.Current()
	if t == nil {
		return nil, errors.New("rules: no service table was built")
	}
	return t, nil
}

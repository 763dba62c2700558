package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/userproxy/userproxy/admin"
)

// runIPVS prints a running proxy's service table as `ipvsadm -Ln` lists the
// virtual services of kube-proxy's IPVS mode, through its admin server.
func runIPVS(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("ipvs", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("admin-addr", defaultAdminAddr, "admin address of the running proxy")
	stats := fs.Bool("stats", false, "connections, packets and bytes, as ipvsadm -Ln --stats")
	rate := fs.Bool("rate", false, "the same per second, as ipvsadm -Ln --rate (--stats wins over it, as in ipvsadm)")
	if help, err := parseArgs(fs, args, stdout, ipvsAbout); help || err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("ipvs: unexpected argument %q", fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := admin.FetchIPVS(ctx, *addr, *stats, *rate)
	if err != nil {
		return fmt.Errorf("ipvs: %w: %w", errNoAdmin, err)
	}
	_, err = io.WriteString(stdout, out)
	return err
}

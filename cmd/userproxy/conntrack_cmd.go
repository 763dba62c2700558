package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/userproxy/userproxy/admin"
)

// runConntrack lists or flushes the conntrack table of a running proxy
// through its admin server.
func runConntrack(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "flush") {
		return usageErr(errors.New("usage: userproxy conntrack list|flush [--admin-addr ADDR] [--control-socket PATH] [--protocol tcp|udp] [--service NS/NAME[:PORT]]"))
	}
	verb := args[0]
	fs := pflag.NewFlagSet("conntrack "+verb, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("admin-addr", defaultAdminAddr, "admin address of the running proxy (list)")
	tun := fs.String("tun-name", "", "the running proxy's TUN device, which names its control socket (flush; default: the one proxy running, or userproxy0's)")
	control := fs.String("control-socket", "", "the running proxy's control socket (flush; default: its --control-socket default for --tun-name)")
	var q admin.ConntrackQuery
	fs.StringVar(&q.Protocol, "protocol", "", "only entries of this protocol (tcp or udp)")
	fs.StringVar(&q.Service, "service", "", "only entries of this service (ns/name) or service port (ns/name:port)")
	fs.StringVar(&q.Endpoint, "endpoint", "", "only entries bound to this endpoint address")
	if help, err := parseArgs(fs, args[1:], stdout, conntrackAbout); help || err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if verb == "list" {
		out, err := admin.FetchConntrack(ctx, *addr, q)
		if err != nil {
			return fmt.Errorf("conntrack list: %w: %w", errNoAdmin, err)
		}
		_, err = io.WriteString(stdout, out)
		return err
	}
	path := *control
	if path == "" {
		var err error
		if path, err = findControlSocket(*tun); err != nil {
			return fmt.Errorf("conntrack flush: %w", err)
		}
	}
	n, err := admin.FlushConntrack(ctx, "unix:"+path, q)
	if err != nil {
		return fmt.Errorf("conntrack flush: %w (the flush goes through the proxy's control socket, which only its user, root on a node, may use): %w", errNoAdmin, err)
	}
	fmt.Fprintf(stdout, "userproxy: %d flow entries have been deleted.\n", n)
	return nil
}

// findControlSocket is the flush's default socket: --tun-name's, or without
// it userproxy0's if it exists, else the one socket in the directory (one
// proxy running); several make the caller choose.
func findControlSocket(tun string) (string, error) {
	if tun != "" {
		return defaultControlSocket(tun), nil
	}
	def := defaultControlSocket("userproxy0")
	if _, err := os.Stat(def); err == nil {
		return def, nil
	}
	socks, _ := filepath.Glob(filepath.Join(filepath.Dir(def), "*.sock"))
	switch len(socks) {
	case 0:
		return def, nil // the error names it
	case 1:
		return socks[0], nil
	}
	return "", fmt.Errorf("%d proxies have control sockets (%s): choose one with --tun-name or --control-socket", len(socks), strings.Join(socks, ", "))
}

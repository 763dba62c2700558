package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/userproxy/userproxy/integration/kubeapi"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kube-up:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := flag.String("dir", "", "state directory (certificates, etcd data, logs, kubeconfig); a tmpfs is best")
	flag.Parse()
	if *dir == "" || flag.NArg() > 0 {
		return fmt.Errorf("usage: kube-up -dir DIR")
	}
	bins, err := kubeapi.FindBinaries()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	c, err := kubeapi.Start(ctx, kubeapi.Config{Binaries: bins, Dir: *dir})
	if err != nil {
		return err
	}
	defer c.Stop()
	ready := filepath.Join(*dir, "ready")
	etcd, api := c.PIDs()
	info := fmt.Sprintf("KUBECONFIG=%s\nAPISERVER=%s\nAPISERVER_PID=%d\nETCD=%s\nETCD_PID=%d\n", c.Kubeconfig(), c.URL(), api, c.EtcdURL(), etcd)
	if err := os.WriteFile(ready, []byte(info), 0o644); err != nil {
		return err
	}
	defer os.Remove(ready)
	fmt.Print(info)
	<-ctx.Done()
	return nil
}

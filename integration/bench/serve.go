package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
)

// serveMain is the backends: on every address, a TCP echo server (echoes
// whatever arrives until the client closes; this serves both the
// connection and the request/response cells) and a UDP echo server. It
// prints "ready" once every socket listens and exits when its standard
// input closes (the harness holds the other end).
func serveMain(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addrs := fs.String("addrs", "", "comma-separated addresses to serve on")
	tcpPort := fs.Int("tcp-port", 8080, "TCP echo port")
	udpPort := fs.Int("udp-port", 5353, "UDP echo port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			_ = c.Close()
		}
	}()
	for _, s := range strings.Split(*addrs, ",") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("serve: address %q: %w", s, err)
		}
		ln, err := net.Listen("tcp", netip.AddrPortFrom(a, uint16(*tcpPort)).String())
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		closers = append(closers, ln)
		pc, err := net.ListenPacket("udp", netip.AddrPortFrom(a, uint16(*udpPort)).String())
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		closers = append(closers, pc)
		go acceptEcho(ln) // TCP echo acceptor
		go udpEcho(pc)    // UDP echo pump
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func acceptEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		go func() { // one connection's echo
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func udpEcho(pc net.PacketConn) {
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The userspace peers: other programs that turn a client namespace's
// packets into sockets of another namespace, run on the same topology as
// userproxy (see topo_linux.go) and measured with the same cells.
//
//	pasta (Debian's passt): a tap device in PC, the sockets in P
//	tun2socks (gVisor over a TUN): the TUN in TC, the process and sockets in P
//
// A peer that is not installed or does not answer is not a failure of the
// harness: its row says why, and the rest runs.

// A peer is one running peer, or the reason it is not running.
type peer struct {
	name    string // the row's name
	ns      string // its client's namespace
	version string // what the machine line says of it
	proc    *proc
	why     string // not empty: it is not running, and this says why
}

// startPeers starts pasta and tun2socks and waits until a connection
// through each gets its echo.
func (h *harness) startPeers() {
	h.peers = []*peer{
		h.startPeer("pasta (passt, tap)", h.topo.pc, h.pastaArgv),
		h.startPeer("tun2socks (gVisor, TUN)", h.topo.tc, h.tun2socksArgv),
	}
}

// startPeer starts the peer whose command line argv builds, if it can.
func (h *harness) startPeer(name, ns string, argv func() (args []string, version string, err error)) *peer {
	pr := &peer{name: name, ns: ns}
	args, version, err := argv()
	if err != nil {
		pr.why = err.Error()
		return pr
	}
	pr.version = version
	if pr.proc, err = startProc(name, args[0], args[1:]...); err != nil {
		pr.why = err.Error()
		return pr
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := h.load(ns, 5*time.Second, "-mode", "lat", "-targets", tcpService, "-count", "1")
		if err == nil {
			return pr
		}
		select {
		case <-pr.proc.done:
			pr.why = fmt.Sprintf("exited at start: %v", pr.proc.err)
			return pr
		default:
		}
		if time.Now().After(deadline) {
			_ = pr.proc.stop(5 * time.Second)
			pr.why = fmt.Sprintf("no echo through it within 15 s: %v", err)
			return pr
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pastaArgv: pasta runs in P and joins PC, where it makes a tap device
// with P's veth's address and a default route through it (--config-net),
// forwarding no ports of either side (the client only dials out).
func (h *harness) pastaArgv() ([]string, string, error) {
	bin := h.o.pasta
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("pasta"); err != nil {
			return nil, "", fmt.Errorf("pasta not found (apt-get install passt): %w", err)
		}
	}
	version := "passt"
	if v, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "passt").Output(); err == nil {
		version = "passt " + string(v)
	}
	return []string{"ip", "netns", "exec", h.topo.p, bin, "--foreground", "--quiet",
		"--log-file", filepath.Join(h.dir, "pasta.log"), "--runas", "0", "--ipv4-only",
		"--netns", h.topo.pc, "--config-net", "--interface", pVeth, "--gateway", strings.Split(pGW, "/")[0],
		"--mtu", fmt.Sprint(peerMTU), "-t", "none", "-u", "none", "-T", "none", "-U", "none"}, version, nil
}

// tun2socksArgv: `bench tunexec` opens TC's TUN inside TC and becomes
// (exec, same PID) tun2socks inside P, the TUN on file descriptor 3, its
// "direct" proxy dialling from P.
func (h *harness) tun2socksArgv() ([]string, string, error) {
	bin := h.o.tun2socks
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("tun2socks"); err != nil {
			return nil, "", fmt.Errorf("tun2socks not found (.ci/run builds github.com/xjasonlyu/tun2socks/v2 from the Go module proxy): %w", err)
		}
	}
	version := "tun2socks"
	if out, err := exec.Command("go", "version", "-m", bin).Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "mod" {
				version = f[1] + " " + f[2]
			}
		}
	}
	return []string{"ip", "netns", "exec", h.topo.tc, h.self, "tunexec", t2sTUN,
		"ip", "netns", "exec", h.topo.p, bin, "--device", "fd://3", "--mtu", fmt.Sprint(peerMTU),
		"--proxy", "direct://", "--loglevel", "error"}, version, nil
}

func (h *harness) stopPeers() {
	for _, pr := range h.peers {
		if pr.proc != nil && pr.why == "" {
			if err := pr.proc.stop(10 * time.Second); err != nil {
				fmt.Fprintf(os.Stderr, "bench: %s exit: %v\n", pr.name, err)
			}
		}
	}
}

// tunExec attaches to the TUN device name of the current namespace, puts
// it on file descriptor 3 and executes argv (which inherits it).
func tunExec(name string, argv []string) error {
	if len(argv) == 0 {
		return fmt.Errorf("tunexec %s: no command", name)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("tunexec: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("tunexec: %w", err)
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("tunexec: TUNSETIFF %s: %w", name, err)
	}
	// Descriptor 3 without close-on-exec survives the exec.
	if fd == 3 {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0)
	} else {
		err = unix.Dup3(fd, 3, 0)
	}
	if err != nil {
		return fmt.Errorf("tunexec: %w", err)
	}
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("tunexec: %w", err)
	}
	return unix.Exec(bin, argv, os.Environ())
}

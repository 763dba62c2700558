//go:build linux

package integration

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// A client whose SYNs announce a tiny MSS (an iptables TCPMSS rule in its
// own namespace, as any pod with NET_ADMIN can add), with and without
// timestamps, over a TUN with and without offloads: every connection works,
// both ways, and no flow's code panics. MSS 12 with timestamps once
// stopped the whole proxy with a division by zero on the TUN's reader; the
// flow now floors the MSS at Linux's tcp_min_snd_mss (48).
func TestTUNTinyMSS(t *testing.T) {
	const size = 48 << 10
	for _, tc := range []struct {
		name      string
		noOffload bool
	}{{"offload", false}, {"no offload", true}} {
		t.Run(tc.name, func(t *testing.T) {
			h, cl, _ := podTUNEnv(t, tc.noOffload)
			for _, fam := range []struct{ name, host, svc, iptables string }{
				{"v4", "127.0.0.1", "10.96.0.31", "iptables"},
				{"v6", "::1", "fd00:96::31", "ip6tables"},
			} {
				// The endpoint reads the client's seed, then sends size bytes of
				// its pattern and the SHA-256 of what else it got.
				be := startTCPBackend(t, fam.host, func(c net.Conn) {
					var seed [8]byte
					if _, err := io.ReadFull(c, seed[:]); err != nil {
						return
					}
					if _, err := io.Copy(c, io.LimitReader(patternReader(binary.BigEndian.Uint64(seed[:])), size)); err != nil {
						return
					}
					hs := sha256.New()
					if _, err := io.CopyN(hs, c, size); err != nil {
						return
					}
					_, _ = c.Write(hs.Sum(nil))
				})
				h.addService("tiny-"+fam.name, fam.svc, v1.ProtocolTCP, 80, false, be.addr)
				for _, mss := range []int{0, 1, 12, 40, 88} {
					for _, ts := range []bool{true, false} {
						name := fmt.Sprintf("%s mss %d timestamps %v", fam.name, mss, ts)
						setClientSYN(t, cl, fam.iptables, mss, ts)
						tinyMSSExchange(t, cl, fam.svc, name, uint64(mss)+1, size)
					}
				}
			}
			if p := h.st.Stats().FlowPanics; p != 0 {
				t.Errorf("%d translated flows panicked", p)
			}
		})
	}
}

// setClientSYN makes the pod's SYNs announce MSS mss (one TCPMSS rule in
// its mangle table's OUTPUT, the last one replaced) and timestamps or not.
func setClientSYN(t *testing.T, cl *nsClient, iptables string, mss int, ts bool) {
	t.Helper()
	err := cl.run(func() error {
		// The command runs in the pod's namespace: it forks from this
		// thread, which is in it.
		for _, args := range [][]string{
			{"-t", "mangle", "-F", "OUTPUT"},
			{"-t", "mangle", "-A", "OUTPUT", "-p", "tcp", "--syn", "-j", "TCPMSS", "--set-mss", fmt.Sprint(mss)},
		} {
			if out, err := exec.Command(iptables, args...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s %v: %w: %s", iptables, args, err, out)
			}
		}
		v := "0"
		if ts {
			v = "1"
		}
		return os.WriteFile("/proc/sys/net/ipv4/tcp_timestamps", []byte(v), 0o644)
	})
	if err != nil {
		t.Fatalf("the pod's SYNs: %v", err)
	}
}

// tinyMSSExchange sends a seed, reads size bytes of the endpoint's pattern,
// sends size bytes and checks the endpoint's SHA-256 of them.
func tinyMSSExchange(t *testing.T, cl *nsClient, svc, name string, seed uint64, size int64) {
	t.Helper()
	c := dialBulk(t, cl, svc)
	defer c.Close()
	if _, err := c.Write(binary.BigEndian.AppendUint64(nil, seed)); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	want := sha256.New()
	_, _ = io.Copy(want, io.LimitReader(patternReader(seed), size))
	got := sha256.New()
	if n, err := io.CopyN(got, c, size); err != nil || !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatalf("%s: download %d of %d bytes (err %v), intact %v", name, n, size, err, bytes.Equal(got.Sum(nil), want.Sum(nil)))
	}
	up := sha256.New()
	if _, err := io.Copy(io.MultiWriter(c, up), io.LimitReader(patternReader(seed+100), size)); err != nil {
		t.Fatalf("%s: upload: %v", name, err)
	}
	sum := make([]byte, sha256.Size)
	if _, err := io.ReadFull(c, sum); err != nil || !bytes.Equal(sum, up.Sum(nil)) {
		t.Fatalf("%s: the endpoint's SHA-256 of the upload %x (err %v); sent %x", name, sum, err, up.Sum(nil))
	}
}

package rules_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// nfacctNames are the counters kube-proxy creates (pkg/proxy/metrics) and
// the rules of Options.NFAcct name.
var nfacctNames = []string{"ct_state_invalid_dropped_pkts", "localhost_nps_accepted_pkts"}

// nfacctSetup returns the shell command that creates the nfacct counters
// in the current network namespace, before iptables-restore runs there:
// this test binary, re-run as TestNFAcctHelper.
func nfacctSetup(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return "USERPROXY_NFACCT_HELPER=1 " + strconv.Quote(exe) + " -test.run='^TestNFAcctHelper$' >/dev/null && "
}

// TestNFAcctHelper is no test of its own: with USERPROXY_NFACCT_HELPER=1
// it adds the nfacct counters over nfnetlink (what `nfacct add` does) and
// fails when the kernel refuses.
func TestNFAcctHelper(t *testing.T) {
	if os.Getenv("USERPROXY_NFACCT_HELPER") != "1" {
		t.Skip("helper for TestWriteIptablesRoundTrip")
	}
	for _, name := range nfacctNames {
		if err := nfacctAdd(name); err != nil {
			t.Fatalf("nfacct add %s: %v", name, err)
		}
	}
}

// nfacctAdd sends NFNL_MSG_ACCT_NEW with NFACCT_NAME and waits for the ack.
func nfacctAdd(name string) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	const (
		msgAcctNew = 0 // NFNL_MSG_ACCT_NEW
		attrName   = 1 // NFACCT_NAME
	)
	attrLen := 4 + len(name) + 1
	msgLen := unix.NLMSG_HDRLEN + 4 + (attrLen+3)&^3
	b := make([]byte, msgLen)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(msgLen))
	ne.PutUint16(b[4:], unix.NFNL_SUBSYS_ACCT<<8|msgAcctNew)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_ACK)
	ne.PutUint32(b[8:], 1)
	b[16] = unix.AF_UNSPEC
	b[17] = unix.NFNETLINK_V0
	ne.PutUint16(b[20:], uint16(attrLen))
	ne.PutUint16(b[22:], attrName)
	copy(b[24:], name)
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	resp := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, resp, 0)
	if err != nil {
		return err
	}
	if n < unix.NLMSG_HDRLEN+4 || ne.Uint16(resp[4:]) != unix.NLMSG_ERROR {
		return fmt.Errorf("unexpected netlink answer of %d bytes", n)
	}
	if code := int32(ne.Uint32(resp[unix.NLMSG_HDRLEN:])); code != 0 {
		return unix.Errno(-code)
	}
	return nil
}

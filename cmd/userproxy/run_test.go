package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// --handshake-timeout runs from the client's SYN, the endpoint dial within
// it (netstack's admitSYN starts the timer at the SYN), and its help must
// say so: it once said the time started once the endpoint was dialled.
func TestHandshakeTimeoutHelpSaysSYN(t *testing.T) {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f runFlags
	f.register(fs)
	fl := fs.Lookup("handshake-timeout")
	if fl == nil {
		t.Fatal("no --handshake-timeout flag")
	}
	for _, want := range []string{"SYN", "dial"} {
		if !strings.Contains(fl.Usage, want) {
			t.Errorf("--handshake-timeout help %q does not mention %q", fl.Usage, want)
		}
	}
	if strings.Contains(fl.Usage, "once the endpoint was dialled") {
		t.Errorf("--handshake-timeout help %q says the time starts after the dial", fl.Usage)
	}
}

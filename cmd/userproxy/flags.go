package main

import (
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"
)

// prefixList is a repeatable flag of CIDRs.
type prefixList struct {
	values []netip.Prefix
	set    bool
}

// Type is the value's name in pflag's help.
func (p *prefixList) Type() string { return "cidrs" }

func (p *prefixList) String() string {
	s := make([]string, len(p.values))
	for i, v := range p.values {
		s[i] = v.String()
	}
	return strings.Join(s, ",")
}

// Set adds a CIDR; the first Set replaces the default. A comma-separated
// list is accepted too.
func (p *prefixList) Set(v string) error {
	if !p.set {
		p.values, p.set = nil, true
	}
	for _, part := range strings.Split(v, ",") {
		pf, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return fmt.Errorf("not a CIDR: %w", err)
		}
		if pf != pf.Masked() {
			return fmt.Errorf("%s has host bits set (did you mean %s?)", pf, pf.Masked())
		}
		p.values = append(p.values, pf)
	}
	return nil
}

// parseArgs parses a command's arguments into fs. -h, -help or --help
// prints about (what the command does and examples) and the flags to
// stdout, and reports help: the command then exits 0. A flag that does not
// parse is a usage error.
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer, about string) (help bool, err error) {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "-help" || a == "--help" || a == "--h" {
			fmt.Fprint(stdout, about)
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "\nFlags:")
			fs.PrintDefaults()
			return true, nil
		}
	}
	fs.Usage = func() {} // the error says what is wrong; --help says the rest
	if err := fs.Parse(args); err != nil {
		return false, usageErr(fmt.Errorf("%s: %w (%s --help lists the flags)", fs.Name(), err, "userproxy "+fs.Name()))
	}
	return false, nil
}

package main

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
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

// parseArgs parses a command's arguments into fs, pflag-style. -h or
// --help prints about (what the command does and examples) and the flags,
// grouped, to stdout, and reports help: the command then exits 0. A flag
// that does not parse is a usage error. The single-dash spelling of a long
// flag (-config, -tun-name=x), which userproxy took before its flags moved
// to pflag, still works.
func parseArgs(fs *pflag.FlagSet, args []string, stdout io.Writer, about string) (help bool, err error) {
	args = longSingleDash(fs, args)
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" {
			fmt.Fprint(stdout, about)
			fmt.Fprint(stdout, groupedUsages(fs))
			return true, nil
		}
	}
	fs.Usage = func() {} // the error says what is wrong; --help says the rest
	if err := fs.Parse(args); err != nil {
		return false, usageErr(fmt.Errorf("%s: %w (%s --help lists the flags)", fs.Name(), err, "userproxy "+fs.Name()))
	}
	return false, nil
}

// longSingleDash rewrites -name and -name=value into --name and
// --name=value where name is one of fs's long flags (or help), up to a
// "--"; pflag would read them as a run of one-letter flags.
func longSingleDash(fs *pflag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' {
			name, _, _ := strings.Cut(a[1:], "=")
			if name == "help" || fs.Lookup(name) != nil {
				a = "-" + a
			}
		}
		out = append(out, a)
	}
	return out
}

// usageColumns is the width --help wraps flag descriptions to.
const usageColumns = 100

// flagGroupAnnotation holds a flag's group in --help.
const flagGroupAnnotation = "userproxy/group"

// groupFlags puts the named flags of fs in group for --help; groups are
// listed in the order of their first groupFlags. A name fs does not have
// is a programming error.
func groupFlags(fs *pflag.FlagSet, group string, names ...string) {
	rank := -1
	groups := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if v := f.Annotations[flagGroupAnnotation]; len(v) == 2 {
			groups[v[1]] = true
			if v[1] == group {
				rank, _ = strconv.Atoi(v[0])
			}
		}
	})
	if rank < 0 {
		rank = len(groups)
	}
	for _, n := range names {
		if err := fs.SetAnnotation(n, flagGroupAnnotation, []string{strconv.Itoa(rank), group}); err != nil {
			panic(fmt.Sprintf("groupFlags: %v", err))
		}
	}
}

// groupedUsages is fs's flags under their groups' titles, then those
// without a group.
func groupedUsages(fs *pflag.FlagSet) string {
	type group struct {
		rank  int
		title string
		flags *pflag.FlagSet
	}
	var groups []*group
	byTitle := map[string]*group{}
	fs.VisitAll(func(f *pflag.Flag) {
		g := &group{rank: math.MaxInt, title: "Flags"}
		if v := f.Annotations[flagGroupAnnotation]; len(v) == 2 {
			g.rank, _ = strconv.Atoi(v[0])
			g.title = v[1]
		}
		if byTitle[g.title] == nil {
			g.flags = pflag.NewFlagSet(g.title, pflag.ContinueOnError)
			byTitle[g.title] = g
			groups = append(groups, g)
		}
		byTitle[g.title].flags.AddFlag(f)
	})
	sort.Slice(groups, func(i, j int) bool { return groups[i].rank < groups[j].rank })
	var b strings.Builder
	for _, g := range groups {
		title := g.title
		if title == "Flags" && len(groups) > 1 {
			title = "Other flags"
		}
		fmt.Fprintf(&b, "\n%s:\n%s", title, g.flags.FlagUsagesWrapped(usageColumns))
	}
	return b.String()
}

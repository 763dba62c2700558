package main

import (
	"fmt"
	"net/netip"
	"strings"
)

// prefixList is a repeatable flag of CIDRs.
type prefixList struct {
	values []netip.Prefix
	set    bool
}

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

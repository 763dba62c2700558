package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/userproxy/userproxy/admin"
	"github.com/userproxy/userproxy/clusterdns"
	"github.com/userproxy/userproxy/conntrack"
	"github.com/userproxy/userproxy/proxy"
	"github.com/userproxy/userproxy/service"
)

// The references in docs/ are held to the code: a flag or a metric
// without its row fails these tests.

// readDoc returns a page of docs/.
func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docSection is the text of the section of page headed title ("## title"),
// up to the next heading of that level.
func docSection(t *testing.T, page, title string) string {
	t.Helper()
	i := strings.Index(page, "\n## "+title+"\n")
	if i < 0 {
		t.Fatalf("no section %q", title)
	}
	rest := page[i+len(title)+5:]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

// helpFlag finds the long flags in --help's output: pflag starts a
// flag's line with "  -x, --" or six spaces and "--"; a wrapped
// description is indented further.
var helpFlag = regexp.MustCompile(`(?m)^(?:  -\w, |      )--([a-z0-9][a-z0-9-]*)`)

// TestFlagsReference: every flag each command's --help lists has a row,
// "| `--name` |", in that command's section of docs/configuration.md.
func TestFlagsReference(t *testing.T) {
	page := readDoc(t, "configuration.md")
	for _, c := range []struct {
		section string
		args    []string
	}{
		{"`userproxy run`", []string{"run"}},
		{"`userproxy setup`", []string{"setup"}},
		{"`userproxy restart`", []string{"restart"}},
		{"`userproxy conntrack list`", []string{"conntrack", "list"}},
		{"`userproxy conntrack flush`", []string{"conntrack", "flush"}},
		{"`userproxy rules`", []string{"rules"}},
		{"`userproxy ipvs`", []string{"ipvs"}},
		{"`userproxy demo`", []string{"demo"}},
		{"`userproxy cleanup`", []string{"cleanup"}},
		{"`userproxy explain`", []string{"explain"}},
		{"`kube-proxy`", []string{"kube-proxy"}},
	} {
		var out, errOut bytes.Buffer
		if err := runMain(context.Background(), append(c.args, "--help"), &out, &errOut); err != nil {
			t.Fatalf("%v --help: %v", c.args, err)
		}
		section := docSection(t, page, c.section)
		n := 0
		for _, m := range helpFlag.FindAllStringSubmatch(out.String(), -1) {
			n++
			if !strings.Contains(section, "| `--"+m[1]+"` |") {
				t.Errorf("docs/configuration.md, section %s: no row for --%s", c.section, m[1])
			}
		}
		if n == 0 && c.section != "`userproxy cleanup`" {
			t.Errorf("%v --help lists no flag:\n%s", c.args, out.String())
		}
	}
}

// describer is a prometheus.Registerer that keeps the names of what is
// registered on it.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *describer) Unregister(prometheus.Collector) bool { return false }

type (
	ctStats      struct{}
	defragStats  struct{}
	proxyStats   struct{}
	trackerStats struct{}
	dnsStats     struct{}
)

func (ctStats) Stats() conntrack.Stats               { return conntrack.Stats{} }
func (defragStats) Stats() conntrack.ReassemblyStats { return conntrack.ReassemblyStats{} }
func (proxyStats) Stats() proxy.Stats                { return proxy.Stats{} }
func (trackerStats) Stats() service.Stats            { return service.Stats{} }
func (dnsStats) Stats() clusterdns.Stats             { return clusterdns.Stats{} }
func (trackerStats) Health() service.Health          { return service.Health{} }

// TestMetricsReference: every metric family run registers (registerMetrics
// with every source there is) has a row, "| `name` |", in
// docs/metrics.md.
func TestMetricsReference(t *testing.T) {
	sources := admin.Sources{
		Conntrack:    ctStats{},
		Reassembler:  defragStats{},
		Proxy:        proxyStats{},
		Tracker:      trackerStats{},
		Families:     []service.Family{service.IPv4},
		Gate:         func() admin.GateStats { return admin.GateStats{} },
		ReloadErrors: func() uint64 { return 0 },
		DNS:          dnsStats{},
		NodePorts:    func() admin.NodePortStats { return admin.NodePortStats{} },
		Tunnels:      func() admin.TunnelStats { return admin.TunnelStats{} },
	}
	// A source added to admin.Sources must be given here, or its metrics
	// would go unchecked.
	v := reflect.ValueOf(sources)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("admin.Sources.%s is not set in this test", v.Type().Field(i).Name)
		}
	}
	d := adminDeps{
		conflicts:     newConflicts(nil, "upx0", nil, nil),
		proxierHealth: admin.NewProxierHealth(trackerStats{}, nil, false, 0, nil),
		rest:          newRESTClientMetrics(),
		handover:      &handoverStats{},
	}
	r := &describer{names: map[string]bool{}}
	if err := registerMetrics(r, d, sources); err != nil {
		t.Fatal(err)
	}
	page := readDoc(t, "metrics.md")
	for name := range r.names {
		if !strings.Contains(page, "| `"+name+"` |") {
			t.Errorf("docs/metrics.md: no row for %s", name)
		}
	}
	if len(r.names) < 50 {
		t.Errorf("only %d metric families registered: %v", len(r.names), r.names)
	}
}

// TestReadmeLinksEveryPage: README.md stays short (at most 200 lines) and
// links every page of docs/.
func TestReadmeLinksEveryPage(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	if n := strings.Count(readme, "\n"); n > 200 {
		t.Errorf("README.md has %d lines; the rest belongs in docs/", n)
	}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil || len(pages) == 0 {
		t.Fatalf("docs/: %v %v", pages, err)
	}
	for _, p := range pages {
		if link := "](docs/" + filepath.Base(p) + ")"; !strings.Contains(readme, link) {
			t.Errorf("README.md does not link docs/%s", filepath.Base(p))
		}
	}
}

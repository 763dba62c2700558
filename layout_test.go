package userproxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The package map and import directions of DESIGN.md section 1, as data.
// Keys are the top-level directory of a package ("source/file" counts as
// "source"); values are the userproxy top-level packages it may import.
var allowedInternal = map[string][]string{
	".":         {},
	"balancer":  {},
	"conntrack": {},
	"service":   {},
	"netstack":  {"conntrack", "internal", "translate"},
	// translate is the translated flows' TCP: plain Go over an endpoint
	// socket interface, no gVisor, nothing of ours.
	"translate": {},
	// handover moves descriptors and a snapshot to the next process; the
	// snapshot's sections are its callers' to encode.
	"handover":    {},
	"source":      {"service", "source"},
	"proxy":       {"netstack", "service", "balancer", "conntrack", "proxy", "internal"},
	"clusterdns":  {"service", "clusterdns"},
	"rules":       {"service", "balancer", "rules"},
	"admin":       {"proxy", "conntrack", "service", "balancer", "clusterdns", "rules", "admin"},
	"cmd":         {"*"},
	"examples":    {"*"},
	"integration": {"*"},
	// internal holds what is not API: helpers shared by tests (stats), the
	// binary's governor of Go's Ps (procs) and the packet path's raw system
	// calls (rawio, for netstack and proxy); it imports nothing of ours.
	"internal": {},
}

const module = "github.com/userproxy/userproxy"

// listedPackage is the part of `go list -json` output the checks read.
type listedPackage struct {
	ImportPath string
	Dir        string
	Standard   bool
	Module     *struct{ Path string }
	Imports    []string
	Deps       []string
}

// top returns the top-level directory of a userproxy package ("." for the
// module root) and whether the path is ours.
func top(importPath string) (string, bool) {
	if importPath == module {
		return ".", true
	}
	rest, ok := strings.CutPrefix(importPath, module+"/")
	if !ok {
		return "", false
	}
	first, _, _ := strings.Cut(rest, "/")
	return first, true
}

// checkImports applies the rules of DESIGN.md section 1 to packages: the
// userproxy import directions; gVisor imported only by netstack; balancer,
// conntrack and internal depending on nothing outside the standard library;
// service depending on no client-go, zap or gVisor and importing only
// k8s.io/api and k8s.io/apimachinery directly. std tells standard-library
// packages apart.
func checkImports(pkgs []listedPackage, std map[string]bool) []error {
	var errs []error
	for _, p := range pkgs {
		dir, ours := top(p.ImportPath)
		if !ours {
			continue
		}
		allowed, known := allowedInternal[dir]
		if !known {
			errs = append(errs, fmt.Errorf("%s: directory %q is not in DESIGN.md's layout", p.ImportPath, dir))
			continue
		}
		for _, imp := range p.Imports {
			if to, ok := top(imp); ok {
				if !slices.Contains(allowed, "*") && !slices.Contains(allowed, to) {
					errs = append(errs, fmt.Errorf("%s imports %s: %s may import only %v", p.ImportPath, imp, dir, allowed))
				}
				continue
			}
			if strings.HasPrefix(imp, "gvisor.dev/") && dir != "netstack" {
				errs = append(errs, fmt.Errorf("%s imports %s: only netstack may import gVisor", p.ImportPath, imp))
			}
			if dir == "service" && !std[imp] && !strings.HasPrefix(imp, "k8s.io/api/") && !strings.HasPrefix(imp, "k8s.io/apimachinery/") {
				errs = append(errs, fmt.Errorf("%s imports %s: service may import only k8s.io/api and k8s.io/apimachinery", p.ImportPath, imp))
			}
		}
		for _, dep := range p.Deps {
			if _, ok := top(dep); ok || std[dep] {
				continue
			}
			switch dir {
			case "balancer", "conntrack", "internal", "translate", ".":
				errs = append(errs, fmt.Errorf("%s depends on %s: %s may depend on the standard library only", p.ImportPath, dep, dir))
			case "service":
				for _, banned := range []string{"k8s.io/client-go/", "go.uber.org/zap", "gvisor.dev/"} {
					if strings.HasPrefix(dep, banned) {
						errs = append(errs, fmt.Errorf("%s depends on %s: service must not depend on %s", p.ImportPath, dep, banned))
					}
				}
			}
		}
	}
	return errs
}

func goList(t *testing.T, args ...string) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-e", "-json"}, args...)...)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(&out)
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportDirections runs `go list -deps -json ./...` and applies
// checkImports to every userproxy package, for the host and for darwin.
func TestImportDirections(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the whole module")
	}
	for _, goos := range []string{"", "darwin"} {
		t.Run("GOOS="+goos, func(t *testing.T) {
			if goos != "" {
				t.Setenv("GOOS", goos)
			}
			all := goList(t, "-deps", "./...")
			std := map[string]bool{}
			var ours []listedPackage
			for _, p := range all {
				if p.Standard {
					std[p.ImportPath] = true
				}
				if _, ok := top(p.ImportPath); ok {
					ours = append(ours, p)
				}
			}
			if len(ours) < 8 {
				t.Fatalf("go list found only %d userproxy packages", len(ours))
			}
			for _, err := range checkImports(ours, std) {
				t.Error(err)
			}
		})
	}
}

// The checker itself must be able to fail: each row is a violation it has to
// report, and the last row a layout it has to accept.
func TestCheckImportsCatchesViolations(t *testing.T) {
	std := map[string]bool{"fmt": true, "net/netip": true}
	p := func(path string, imports, deps []string) listedPackage {
		return listedPackage{ImportPath: module + path, Imports: imports, Deps: deps}
	}
	cases := []struct {
		name string
		pkg  listedPackage
		want int
	}{
		{"balancer imports zap", p("/balancer", []string{"go.uber.org/zap"}, []string{"go.uber.org/zap"}), 1},
		{"conntrack imports proxy", p("/conntrack", []string{module + "/proxy"}, []string{module + "/proxy"}), 1},
		{"service imports client-go", p("/service", []string{"k8s.io/client-go/kubernetes"}, []string{"k8s.io/client-go/kubernetes"}), 2},
		{"proxy imports gVisor", p("/proxy", []string{"gvisor.dev/gvisor/pkg/tcpip"}, nil), 1},
		{"netstack imports service", p("/netstack", []string{module + "/service"}, nil), 1},
		{"source/file imports proxy", p("/source/file", []string{module + "/proxy"}, nil), 1},
		{"unknown directory", p("/util", nil, nil), 1},
		{"allowed", p("/proxy", []string{"fmt", module + "/netstack", module + "/balancer"}, []string{"fmt", "gvisor.dev/gvisor/pkg/tcpip"}), 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := checkImports([]listedPackage{c.pkg}, std); len(got) != c.want {
				t.Errorf("got %d errors %v, want %d", len(got), got, c.want)
			}
		})
	}
}

// TestPackageDocs fails when a directory with Go files has no package doc
// comment, or more than one (STYLE.md 1: one doc.go per package).
func TestPackageDocs(t *testing.T) {
	dirs := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dirs[filepath.Dir(path)] = append(dirs[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 8 {
		t.Fatalf("found only %d package directories", len(dirs))
	}
	for dir, files := range dirs {
		if problem := docProblem(files); problem != "" {
			t.Errorf("%s: %s", dir, problem)
		}
	}
}

// docProblem returns what is wrong with the package docs of one directory's
// files, or "".
func docProblem(files []string) string {
	var withDoc []string
	fset := token.NewFileSet()
	for _, f := range files {
		parsed, err := parser.ParseFile(fset, f, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			return err.Error()
		}
		if parsed.Doc != nil && strings.TrimSpace(parsed.Doc.Text()) != "" {
			withDoc = append(withDoc, f)
		}
	}
	switch {
	case len(withDoc) == 0:
		return "no package doc comment (write a doc.go)"
	case len(withDoc) > 1:
		return fmt.Sprintf("package doc in %d files %v; keep exactly one, in doc.go", len(withDoc), withDoc)
	case filepath.Base(withDoc[0]) != "doc.go":
		return fmt.Sprintf("package doc is in %s, not doc.go", withDoc[0])
	}
	return ""
}

func TestDocProblemCatchesMissingDoc(t *testing.T) {
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	bare := write("a.go", "package a\n")
	doc := write("doc.go", "// Package a does a.\npackage a\n")
	other := write("b.go", "// Package a again.\npackage a\n")
	if docProblem([]string{bare}) == "" {
		t.Error("a package without a doc passed")
	}
	if docProblem([]string{bare, doc, other}) == "" {
		t.Error("a package with two docs passed")
	}
	if docProblem([]string{other}) == "" {
		t.Error("a doc outside doc.go passed")
	}
	if p := docProblem([]string{bare, doc}); p != "" {
		t.Errorf("a good package failed: %s", p)
	}
}

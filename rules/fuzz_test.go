package rules_test

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"

	"github.com/userproxy/userproxy/rules"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/file"
)

// FuzzRulesFromConfig feeds arbitrary config files through the file
// source and the tracker to the rules printer: whatever the objects, loading
// either fails with an error or yields a table that prints in both formats
// and both families without an error or a panic.
func FuzzRulesFromConfig(f *testing.F) {
	quickstart, err := os.ReadFile("../examples/quickstart.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(quickstart)
	f.Add([]byte(`apiVersion: v1
kind: Service
metadata: {name: s, namespace: n}
spec:
  clusterIPs: [10.96.0.1, fd00::1]
  clusterIP: 10.96.0.1
  ipFamilies: [IPv4, IPv6]
  sessionAffinity: ClientIP
  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}
  internalTrafficPolicy: Local
  ports: [{name: p, port: 80, protocol: TCP, targetPort: web}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s-1, namespace: n, labels: {kubernetes.io/service-name: s}}
addressType: IPv6
endpoints: [{addresses: ["fd00::10"], nodeName: node-a, conditions: {ready: false, serving: true, terminating: true}}]
ports: [{name: p, port: 8080, protocol: TCP}]
`))
	f.Add([]byte("{}"))
	f.Add([]byte("kind: List\napiVersion: v1\nitems: []\n"))

	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		tracker, err := service.NewTracker(service.Config{NodeName: "node-a"})
		if err != nil {
			t.Fatal(err)
		}
		defer tracker.Close()
		src := file.New(path, tracker, zap.NewNop(), file.WithFSNotify(false), file.WithPollInterval(0))
		if err := src.Load(); err != nil {
			return // refused with an error: fine
		}
		tbl := tracker.Current()
		for _, format := range []rules.Format{rules.FormatSave, rules.FormatRestore} {
			for _, fam := range []service.Family{0, service.IPv4, service.IPv6} {
				if err := rules.Write(io.Discard, tbl, rules.Options{Format: format, Family: fam, JumpRules: true}); err != nil {
					t.Fatalf("Write(format %v, family %v): %v", format, fam, err)
				}
			}
		}
	})
}

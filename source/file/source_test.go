package file_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/file"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a service.Handler that records each call as a line.
type recorder struct {
	mu     sync.Mutex
	events []string
	notify chan struct{}
}

func newRecorder() *recorder { return &recorder{notify: make(chan struct{}, 1000)} }

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
	r.notify <- struct{}{}
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.events
	r.events = nil
	return ev
}

// wait blocks until n events arrived since the last take, or the test's
// failsafe (never a timing assertion: a healthy run never gets near it).
func (r *recorder) wait(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.events)
		r.mu.Unlock()
		if got >= n {
			return r.take()
		}
		select {
		case <-r.notify:
		case <-deadline:
			t.Fatalf("waited for %d events, have %v", n, r.take())
		}
	}
}

func (r *recorder) OnServiceAdd(s *v1.Service) { r.add("add Service " + s.Namespace + "/" + s.Name) }
func (r *recorder) OnServiceUpdate(_, s *v1.Service) {
	r.add("update Service " + s.Namespace + "/" + s.Name)
}
func (r *recorder) OnServiceDelete(s *v1.Service) {
	r.add("delete Service " + s.Namespace + "/" + s.Name)
}
func (r *recorder) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) {
	r.add("add EndpointSlice " + s.Namespace + "/" + s.Name)
}
func (r *recorder) OnEndpointSliceUpdate(_, s *discoveryv1.EndpointSlice) {
	r.add("update EndpointSlice " + s.Namespace + "/" + s.Name)
}
func (r *recorder) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) {
	r.add("delete EndpointSlice " + s.Namespace + "/" + s.Name)
}
func (r *recorder) OnSynced() { r.add("synced") }

var _ service.Handler = (*recorder)(nil)

// tee forwards to several handlers.
type tee []service.Handler

func (t tee) OnServiceAdd(s *v1.Service) {
	for _, h := range t {
		h.OnServiceAdd(s)
	}
}
func (t tee) OnServiceUpdate(o, s *v1.Service) {
	for _, h := range t {
		h.OnServiceUpdate(o, s)
	}
}
func (t tee) OnServiceDelete(s *v1.Service) {
	for _, h := range t {
		h.OnServiceDelete(s)
	}
}
func (t tee) OnEndpointSliceAdd(s *discoveryv1.EndpointSlice) {
	for _, h := range t {
		h.OnEndpointSliceAdd(s)
	}
}
func (t tee) OnEndpointSliceUpdate(o, s *discoveryv1.EndpointSlice) {
	for _, h := range t {
		h.OnEndpointSliceUpdate(o, s)
	}
}
func (t tee) OnEndpointSliceDelete(s *discoveryv1.EndpointSlice) {
	for _, h := range t {
		h.OnEndpointSliceDelete(s)
	}
}
func (t tee) OnSynced() {
	for _, h := range t {
		h.OnSynced()
	}
}

const webYAML = `# the web service and its endpoints
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: ns1
spec:
  clusterIP: 10.96.0.10
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: ns1
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  port: 8080
  protocol: TCP
endpoints:
- addresses: ["10.0.0.2"]
- addresses: ["10.0.0.10"]
  conditions: {ready: true}
`

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func tracker(t *testing.T) *service.Tracker {
	t.Helper()
	tr, err := service.NewTracker(service.Config{Clock: service.NewManualClock(time.Unix(0, 0))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tr.Close)
	return tr
}

func endpoints(t *testing.T, tr *service.Tracker, dst string) []string {
	t.Helper()
	ap := netip.MustParseAddrPort(dst)
	p, v := tr.Current().Lookup(service.TCP, ap.Addr(), ap.Port())
	if p == nil {
		return []string{v.String()}
	}
	return p.EndpointKeys
}

func TestLoadMultiDocumentYAML(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yaml")
	write(t, path, webYAML)
	rec, tr := newRecorder(), tracker(t)
	src := file.New(path, tee{rec, tr}, zap.NewNop())
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	want := []string{"add EndpointSlice ns1/web-abc", "add Service ns1/web", "synced"}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.0.0.10:8080", "10.0.0.2:8080"}, endpoints(t, tr, "10.96.0.10:80")); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	st := src.Stats()
	if st.Loads != 1 || st.Files != 1 || st.Services != 1 || st.EndpointSlices != 1 || src.LastError() != nil {
		t.Errorf("stats %+v, LastError %v", st, src.LastError())
	}
}

// kubectlList is what `kubectl get svc,endpointslices -n ns1 -o yaml`
// prints: a v1 List with server-set metadata and status.
const kubectlList = `apiVersion: v1
items:
- apiVersion: v1
  kind: Service
  metadata:
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: |
        {"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"ns1"}}
    creationTimestamp: "2024-05-01T10:00:00Z"
    labels:
      app: web
    name: web
    namespace: ns1
    resourceVersion: "1234"
    uid: 6f1e2d3c-0000-4000-8000-000000000001
  spec:
    clusterIP: 10.96.0.10
    clusterIPs:
    - 10.96.0.10
    internalTrafficPolicy: Cluster
    ipFamilies:
    - IPv4
    ipFamilyPolicy: SingleStack
    ports:
    - name: http
      port: 80
      protocol: TCP
      targetPort: web
    selector:
      app: web
    sessionAffinity: ClientIP
    sessionAffinityConfig:
      clientIP:
        timeoutSeconds: 10800
    type: ClusterIP
  status:
    loadBalancer: {}
- addressType: IPv4
  apiVersion: discovery.k8s.io/v1
  endpoints:
  - addresses:
    - 10.244.1.5
    conditions:
      ready: true
      serving: true
      terminating: false
    nodeName: node-1
    targetRef:
      kind: Pod
      name: web-7d4b9c-x2x9q
      namespace: ns1
      uid: 6f1e2d3c-0000-4000-8000-000000000002
    zone: zone-a
  kind: EndpointSlice
  metadata:
    annotations:
      endpoints.kubernetes.io/last-change-trigger-time: "2024-05-01T10:00:05Z"
    creationTimestamp: "2024-05-01T10:00:00Z"
    generateName: web-
    generation: 3
    labels:
      endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io
      kubernetes.io/service-name: web
    name: web-x7k2p
    namespace: ns1
    ownerReferences:
    - apiVersion: v1
      blockOwnerDeletion: true
      controller: true
      kind: Service
      name: web
      uid: 6f1e2d3c-0000-4000-8000-000000000001
    resourceVersion: "1240"
    uid: 6f1e2d3c-0000-4000-8000-000000000003
  ports:
  - name: http
    port: 8080
    protocol: TCP
kind: List
metadata:
  resourceVersion: ""
`

func TestLoadKubectlList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dump.yaml")
	write(t, path, kubectlList)
	rec, tr := newRecorder(), tracker(t)
	if err := file.New(path, tee{rec, tr}, nil).Load(); err != nil {
		t.Fatal(err)
	}
	want := []string{"add EndpointSlice ns1/web-x7k2p", "add Service ns1/web", "synced"}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	ap := netip.MustParseAddrPort("10.96.0.10:80")
	p, v := tr.Current().Lookup(service.TCP, ap.Addr(), ap.Port())
	if v != service.Forward || !p.Affinity.ClientIP || p.Affinity.Timeout != 10800*time.Second ||
		cmp.Diff([]string{"10.244.1.5:8080"}, p.EndpointKeys) != "" {
		t.Errorf("lookup: %v %+v", v, p)
	}
}

func TestLoadJSON(t *testing.T) {
	dir := t.TempDir()
	// A stream of two JSON values: a Service, then a List holding a slice.
	write(t, filepath.Join(dir, "web.json"), `{
  "apiVersion": "v1", "kind": "Service",
  "metadata": {"name": "web", "namespace": "ns1"},
  "spec": {"clusterIP": "fd00::10", "ports": [{"name": "http", "port": 80}]}
}
{
  "apiVersion": "v1", "kind": "List", "metadata": {},
  "items": [{
    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
    "metadata": {"name": "web-1", "namespace": "ns1", "labels": {"kubernetes.io/service-name": "web"}},
    "addressType": "IPv6",
    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    "endpoints": [{"addresses": ["fd00:10::1"]}]
  }]
}`)
	tr := tracker(t)
	if err := file.New(dir, tr, nil).Load(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"[fd00:10::1]:8080"}, endpoints(t, tr, "[fd00::10]:80")); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
}

// kubectlJSONService and kubectlJSONSlice are what `kubectl get svc web -o
// json` and `kubectl get endpointslice web-abc -o json` print (trimmed of
// server-set fields the decoder ignores anyway).
const (
	kubectlJSONService = `{
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {
        "name": "web",
        "namespace": "ns1"
    },
    "spec": {
        "clusterIP": "10.96.0.10",
        "ports": [
            {
                "name": "http",
                "port": 80,
                "protocol": "TCP",
                "targetPort": 8080
            }
        ]
    }
}
`
	kubectlJSONSlice = `{
    "addressType": "IPv4",
    "apiVersion": "discovery.k8s.io/v1",
    "endpoints": [
        {
            "addresses": [
                "10.0.0.2"
            ]
        }
    ],
    "kind": "EndpointSlice",
    "metadata": {
        "labels": {
            "kubernetes.io/service-name": "web"
        },
        "name": "web-abc",
        "namespace": "ns1"
    },
    "ports": [
        {
            "name": "http",
            "port": 8080,
            "protocol": "TCP"
        }
    ]
}
`
)

// TestLoadJSONDocuments: JSON documents in YAML streams (a JSON value is a
// YAML flow node), and several JSON values in one file, however they are
// separated, all load as the objects they hold.
func TestLoadJSONDocuments(t *testing.T) {
	const yamlSlice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-abc, namespace: ns1, labels: {kubernetes.io/service-name: web}}\n" +
		"addressType: IPv4\nports: [{name: http, port: 8080, protocol: TCP}]\nendpoints: [{addresses: [10.0.0.2]}]\n"
	cases := []struct {
		name, file, content string
	}{
		{"concatenated kubectl -o json outputs, --- between, in .yaml", "dump.yaml",
			kubectlJSONService + "---\n" + kubectlJSONSlice},
		{"the same in .yml, with a --- first and a ... end marker", "dump.yml",
			"---\n" + kubectlJSONService + "---\n" + kubectlJSONSlice + "...\n"},
		{"the same in .json", "dump.json",
			kubectlJSONService + "---\n" + kubectlJSONSlice},
		{"a JSON value on the --- line", "dump.yaml",
			"--- " + strings.ReplaceAll(kubectlJSONService, "\n", " ") + "\n--- " + strings.ReplaceAll(kubectlJSONSlice, "\n", " ") + "\n"},
		{"comments before a JSON document", "dump.yaml",
			"# the service\n\n" + kubectlJSONService + "---\n# its slice\n" + kubectlJSONSlice},
		{"a JSON document, then a YAML one", "mixed.yaml",
			kubectlJSONService + "---\n" + yamlSlice},
		{"a YAML document, then a JSON one", "mixed.yaml",
			"apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}\n---\n" + kubectlJSONSlice},
		{"JSON indented with tabs, which YAML does not allow", "tabs.yaml",
			strings.ReplaceAll(kubectlJSONService, "    ", "\t") + "---\n" + strings.ReplaceAll(kubectlJSONSlice, "    ", "\t")},
		{"flow-style YAML that is not JSON", "flow.yaml",
			"{apiVersion: v1, kind: Service, metadata: {name: web, namespace: ns1},\n spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80, targetPort: 8080}]}}\n---\n" + yamlSlice},
		{"two JSON values without ---, in .yaml", "stream.yaml",
			kubectlJSONService + kubectlJSONSlice},
		{"two JSON values without ---, after a byte order mark", "stream.json",
			"\ufeff" + kubectlJSONService + kubectlJSONSlice},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), c.file)
			write(t, path, c.content)
			rec, tr := newRecorder(), tracker(t)
			if err := file.New(path, tee{rec, tr}, nil).Load(); err != nil {
				t.Fatal(err)
			}
			want := []string{"add EndpointSlice ns1/web-abc", "add Service ns1/web", "synced"}
			if diff := cmp.Diff(want, rec.take()); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"10.0.0.2:8080"}, endpoints(t, tr, "10.96.0.10:80")); diff != "" {
				t.Errorf("table (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadJSONDocumentErrors: a bad JSON document is refused with the
// file, the document and the line it starts on named; in a .json file as
// JSON, in a YAML file as YAML (a JSON-looking document that is not JSON
// may still be flow-style YAML).
func TestLoadJSONDocumentErrors(t *testing.T) {
	// kubectlJSONService takes lines 1-19, the --- line 20.
	const line = 21
	cases := []struct {
		name, file, second string
		document, line     int
		field              string
		message            []string
	}{
		{
			name: "broken JSON in .json", file: "bad.json",
			second:   "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Service\",,\n}\n",
			document: 2, line: line,
			message: []string{"invalid JSON", "invalid character ','"},
		},
		{
			name: "broken JSON in .yaml: a YAML error with its file line", file: "bad.yaml",
			second:   "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Service\",,\n}\n",
			document: 2, line: line,
			// go-yaml places it at the entry before the stray comma.
			message: []string{"invalid YAML", "yaml: line 22: did not find expected node content"},
		},
		{
			name: "flow-style YAML in .json", file: "bad.json",
			second:   "{apiVersion: v1, kind: Service}\n",
			document: 2, line: line,
			message: []string{"invalid JSON"},
		},
		{
			name: "a second value after a JSON document, in .json", file: "bad.json",
			second:   "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"x\"}, \"spec\": {\"clusterIP\": \"None\"}}\n\n{\"a\": [\n",
			document: 3, line: line + 2,
			message: []string{"invalid JSON"},
		},
		{
			name: "a valid JSON document with an unknown field", file: "bad.yaml",
			second:   "{\n  \"apiVersion\": \"v1\", \"kind\": \"Service\",\n  \"metadata\": {\"name\": \"web\", \"namespace\": \"ns1\"},\n  \"spec\": {\"clusterIP\": \"10.96.0.11\", \"ports\": [{\"port\": 80}], \"bogus\": 1}\n}\n",
			document: 2, line: line, field: "spec.bogus",
			message: []string{`unknown field "spec.bogus"`, "Service ns1/web"},
		},
		{
			name: "a duplicate key in a JSON document", file: "bad.json",
			second:   "{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"kind\": \"Service\", \"metadata\": {\"name\": \"web\"}}\n",
			document: 2, line: line, field: "kind",
			message: []string{`duplicate field "kind"`},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), c.file)
			write(t, path, kubectlJSONService+"---\n"+c.second)
			rec := newRecorder()
			err := file.New(path, rec, nil).Load()
			if err == nil {
				t.Fatal("Load accepted a bad document")
			}
			var de *file.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			if de.File != path || de.Document != c.document || de.Line != c.line || de.Field != c.field {
				t.Errorf("DecodeError{File %q, Document %d, Line %d, Field %q}, want {%q, %d, %d, %q}",
					de.File, de.Document, de.Line, de.Field, path, c.document, c.line, c.field)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, path+":") {
				t.Errorf("error %q does not start with the file", msg)
			}
			for _, want := range append([]string{fmt.Sprintf(": document %d (line %d)", c.document, c.line)}, c.message...) {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if ev := rec.take(); len(ev) != 0 {
				t.Errorf("a failed Load delivered %v", ev)
			}
		})
	}
}

func TestLoadTypedList(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svcs.yaml")
	write(t, path, `apiVersion: v1
kind: ServiceList
metadata: {resourceVersion: "7"}
items:
- metadata: {name: a, namespace: ns1}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: v1
  kind: Service
  metadata: {name: b, namespace: ns1}
  spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}
`)
	rec := newRecorder()
	if err := file.New(path, rec, nil).Load(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"add Service ns1/a", "add Service ns1/b", "synced"}, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	docs := strings.SplitN(webYAML, "---\n", 2)
	write(t, filepath.Join(dir, "10-service.yaml"), docs[0])
	write(t, filepath.Join(dir, "20-slices.yml"), docs[1])
	write(t, filepath.Join(dir, ".hidden.yaml"), "this: [is not read")
	write(t, filepath.Join(dir, "README.md"), "not: a config")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "sub", "x.yaml"), "not read: [")
	rec := newRecorder()
	src := file.New(dir, rec, nil)
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	want := []string{"add EndpointSlice ns1/web-abc", "add Service ns1/web", "synced"}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if n := src.Stats().Files; n != 2 {
		t.Errorf("read %d files, want 2", n)
	}
}

// TestLoadErrors: a bad document at start is refused with the file, the
// document (and its line) and the field named, and with the line of the
// field itself (file:line) where the document has it.
func TestLoadErrors(t *testing.T) {
	const goodSvc = "apiVersion: v1\nkind: Service\nmetadata: {name: ok, namespace: ns1}\nspec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}\n"
	cases := []struct {
		name    string
		doc     string // the second document of the file
		field   string // DecodeError.Field, when one field is at fault
		line    int    // the line the error names: the field's, else the document's (6)
		message []string
	}{
		{
			name:    "unknown field",
			line:    11,
			doc:     "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec:\n  clusterIP: 10.96.0.10\n  clusterIp: 10.96.0.11\n  ports: [{port: 80}]\n",
			field:   "spec.clusterIp",
			message: []string{`unknown field "spec.clusterIp"`, "Service ns1/web"},
		},
		{
			name:    "unknown field in an EndpointSlice endpoint",
			line:    10,
			doc:     "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: ns1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.1], ready: true}]\n",
			field:   "endpoints[0].ready",
			message: []string{`unknown field "endpoints[0].ready"`},
		},
		{
			name:    "bad ClusterIP",
			line:    9,
			doc:     "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.300, ports: [{port: 80}]}\n",
			field:   "spec.clusterIP",
			message: []string{"spec.clusterIP", "10.96.0.300"},
		},
		{
			name:    "missing name",
			line:    8,
			doc:     "apiVersion: v1\nkind: Service\nmetadata: {namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
			field:   "metadata.name",
			message: []string{"metadata.name: Required value"},
		},
		{
			name:    "port out of range",
			line:    9,
			doc:     "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 70000}]}\n",
			field:   "spec.ports[0].port",
			message: []string{"spec.ports[0].port"},
		},
		{
			name:    "wrong type",
			line:    6,
			doc:     "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{port: eighty}]}\n",
			message: []string{"port"},
		},
		{
			name:    "slice without service label",
			line:    8,
			doc:     "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: ns1}\naddressType: IPv4\nendpoints: [{addresses: [10.0.0.1]}]\n",
			field:   "metadata.labels[kubernetes.io/service-name]",
			message: []string{"kubernetes.io/service-name"},
		},
		{
			name:    "endpoint address of the wrong family",
			line:    10,
			doc:     "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: ns1, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: ['fd00::1']}]\n",
			field:   "endpoints[0].addresses[0]",
			message: []string{"endpoints[0].addresses[0]"},
		},
		{
			name:    "unsupported kind",
			line:    6,
			doc:     "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
			message: []string{`unsupported apiVersion "apps/v1" kind "Deployment"`},
		},
		{
			name:    "missing kind",
			line:    6,
			doc:     "apiVersion: v1\nmetadata: {name: web}\n",
			field:   "kind",
			message: []string{"kind: Required value"},
		},
		{
			name:    "YAML syntax",
			line:    8,
			doc:     "apiVersion: v1\nkind: Service\nmetadata: {name: web\n",
			message: []string{"invalid YAML", "yaml: line 8:"},
		},
		{
			name:    "unterminated string at the end of the document",
			line:    7,
			doc:     "apiVersion: v1\nkind: \"Service\n",
			message: []string{"invalid YAML"},
		},
		{
			name:    "duplicate key",
			line:    8,
			doc:     "apiVersion: v1\nkind: Service\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n",
			message: []string{"invalid YAML", `line 8: key "kind" already set`},
		},
		{
			name:    "bad item in a List",
			line:    12,
			doc:     "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: web, namespace: ns1}\n  spec: {clusterIP: None, ports: [{port: 80}], bogus: 1}\n",
			field:   "spec.bogus",
			message: []string{"items[0]", `unknown field "spec.bogus"`},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bad.yaml")
			write(t, path, goodSvc+"---\n"+c.doc)
			rec := newRecorder()
			src := file.New(path, rec, nil)
			err := src.Load()
			if err == nil {
				t.Fatal("Load accepted a bad document")
			}
			var de *file.DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %v is not a *DecodeError", err)
			}
			if de.File != path || de.Document != 2 || de.Line != 6 || de.Field != c.field {
				t.Errorf("DecodeError{File %q, Document %d, Line %d, Field %q}, want {%q, 2, 6, %q}",
					de.File, de.Document, de.Line, de.Field, path, c.field)
			}
			msg := err.Error()
			for _, want := range append([]string{fmt.Sprintf("%s:%d: document 2 (line 6)", path, c.line)}, c.message...) {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if ev := rec.take(); len(ev) != 0 {
				t.Errorf("a failed Load delivered %v", ev)
			}
			if src.LastError() == nil {
				t.Error("LastError is nil after a failed Load")
			}
		})
	}
}

func TestLoadDuplicateObject(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), webYAML)
	write(t, filepath.Join(dir, "b.yaml"), webYAML)
	err := file.New(dir, newRecorder(), nil).Load()
	if err == nil || !strings.Contains(err.Error(), "defined twice") || !strings.Contains(err.Error(), "a.yaml") {
		t.Fatalf("duplicate not reported with both places: %v", err)
	}
}

func TestReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "web.yaml")
	write(t, path, webYAML)
	rec, tr := newRecorder(), tracker(t)
	src := file.New(path, tee{rec, tr}, nil)
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	rec.take()

	// Unchanged content: nothing delivered.
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if ev := rec.take(); len(ev) != 0 {
		t.Fatalf("unchanged reload delivered %v", ev)
	}

	// Change: one endpoint replaced; add a service; the only slice of web is
	// renamed (delete + add).
	changed := strings.Replace(webYAML, `["10.0.0.2"]`, `["10.0.0.3"]`, 1)
	changed = strings.Replace(changed, "name: web-abc", "name: web-def", 1)
	changed += `---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: ns1}
spec: {clusterIP: 10.96.0.11, ports: [{port: 9000}]}
`
	write(t, path, changed)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	want := []string{"delete EndpointSlice ns1/web-abc", "add EndpointSlice ns1/web-def", "add Service ns1/api"}
	if diff := cmp.Diff(want, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"10.0.0.10:8080", "10.0.0.3:8080"}, endpoints(t, tr, "10.96.0.10:80")); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}

	// Update in place, then delete the api service.
	changed2 := strings.Replace(changed, "port: 9000", "port: 9001", 1)
	write(t, path, changed2)
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"update Service ns1/api"}, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	write(t, path, strings.SplitAfter(changed2, "10.0.0.10\"]\n  conditions: {ready: true}\n")[0])
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"delete Service ns1/api"}, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if got := endpoints(t, tr, "10.96.0.11:9001"); got[0] != "NotService" {
		t.Errorf("deleted service still in the table: %v", got)
	}
	if n := src.Stats().Loads; n != 4 {
		t.Errorf("Loads = %d, want 4", n)
	}
}

func TestReloadMalformedKeepsLastGood(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.yaml")
	write(t, path, webYAML)
	core, logs := observer.New(zapcore.InfoLevel)
	rec, tr := newRecorder(), tracker(t)
	src := file.New(path, tee{rec, tr}, zap.New(core))
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	rec.take()
	before := tr.Current()

	bad := strings.Replace(webYAML, "targetPort: 8080", "targetPort: 8080\n    nodePortt: 30000", 1)
	write(t, path, bad)
	for range 3 { // a bad state read again is not reported again
		err := src.Reload()
		if err == nil || !strings.Contains(err.Error(), `unknown field "spec.ports[0].nodePortt"`) ||
			!strings.Contains(err.Error(), "document 1 (line 2)") {
			t.Fatalf("Reload: %v", err)
		}
	}
	if ev := rec.take(); len(ev) != 0 {
		t.Errorf("a bad reload delivered %v", ev)
	}
	if tr.Current() != before {
		t.Error("a bad reload changed the table")
	}
	if diff := cmp.Diff([]string{"10.0.0.10:8080", "10.0.0.2:8080"}, endpoints(t, tr, "10.96.0.10:80")); diff != "" {
		t.Errorf("table (-want +got):\n%s", diff)
	}
	st := src.Stats()
	if st.Errors != 1 || st.LastError == "" || src.LastError() == nil {
		t.Errorf("after bad reload: %+v, LastError %v", st, src.LastError())
	}
	if n := logs.FilterMessage("configuration reload failed; keeping the last good state").Len(); n != 1 {
		t.Errorf("bad reload logged %d times, want once", n)
	}

	// An empty file on reload is taken for a write in progress.
	write(t, path, "")
	if err := src.Reload(); err == nil || !strings.Contains(err.Error(), "empty file") {
		t.Errorf("empty file on reload: %v", err)
	}
	if ev := rec.take(); len(ev) != 0 {
		t.Errorf("an empty file delivered %v", ev)
	}

	// Fixed: applied, error cleared.
	write(t, path, strings.Replace(webYAML, `["10.0.0.2"]`, `["10.0.0.4"]`, 1))
	if err := src.Reload(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"update EndpointSlice ns1/web-abc"}, rec.take()); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if src.LastError() != nil || src.Stats().LastError != "" {
		t.Errorf("error not cleared: %v", src.LastError())
	}
}

// TestRunPolls drives the poll timer with a manual clock (notifications
// off), so no real time passes.
func TestRunPolls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "web.yaml")
	write(t, path, webYAML)
	clk := service.NewManualClock(time.Unix(0, 0))
	rec := newRecorder()
	src := file.New(path, rec, nil, file.WithClock(clk), file.WithFSNotify(false), file.WithPollInterval(5*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	rec.wait(t, 3) // the initial load
	waitFor(t, func() bool { return clk.Pending() == 1 })
	if src.Stats().Watching {
		t.Error("Watching with notifications off")
	}

	write(t, path, strings.Replace(webYAML, "port: 80\n", "port: 81\n", 1))
	clk.Advance(5 * time.Second)
	if diff := cmp.Diff([]string{"update Service ns1/web"}, rec.wait(t, 1)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRunWatches uses real file-system notifications; polling is off, so
// only fsnotify can deliver the change. The path is a directory, or a file
// that an editor replaces by renaming a new one over it.
func TestRunWatches(t *testing.T) {
	for _, mode := range []string{"directory", "file"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			cfg := filepath.Join(dir, "web.yaml")
			write(t, cfg, webYAML)
			path := dir
			if mode == "file" {
				path = cfg
			}
			rec := newRecorder()
			src := file.New(path, rec, nil, file.WithPollInterval(0), file.WithDebounce(10*time.Millisecond))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- src.Run(ctx) }()
			rec.wait(t, 3)
			waitFor(t, func() bool { return src.Stats().Watching })

			tmp := filepath.Join(dir, ".web.yaml.swp")
			write(t, tmp, strings.Replace(webYAML, "clusterIP: 10.96.0.10", "clusterIP: 10.96.0.20", 1))
			if err := os.Rename(tmp, cfg); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]string{"update Service ns1/web"}, rec.wait(t, 1)); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			if mode == "directory" {
				write(t, filepath.Join(dir, "api.yaml"), "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: ns1}\nspec: {clusterIP: 10.96.0.11, ports: [{port: 9000}]}\n")
				if diff := cmp.Diff([]string{"add Service ns1/api"}, rec.wait(t, 1)); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
			} else {
				// In-place write.
				write(t, cfg, strings.Replace(webYAML, "clusterIP: 10.96.0.10", "clusterIP: 10.96.0.30", 1))
				if diff := cmp.Diff([]string{"update Service ns1/web"}, rec.wait(t, 1)); diff != "" {
					t.Errorf("events (-want +got):\n%s", diff)
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestRunFailsOnBadStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.yaml")
	err := file.New(path, newRecorder(), nil).Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("Run on a missing file: %v", err)
	}
}

// waitFor waits until cond holds (a failsafe ends a hung test; no timing is
// asserted).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition never held")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoadEmpty: an empty directory loads with nothing and says so (a
// warning: nothing is served); an empty file is refused at start as on a
// reload, with the same message and the fix; a file with only a comment
// means no objects.
func TestLoadEmpty(t *testing.T) {
	dir := t.TempDir()
	rec := newRecorder()
	core, logs := observer.New(zapcore.InfoLevel)
	if err := file.New(dir, rec, zap.New(core)).Load(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"synced"}, rec.take()); diff != "" {
		t.Errorf("an empty directory must sync with nothing (-want +got):\n%s", diff)
	}
	if w := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("has no files").Len(); w != 1 {
		t.Errorf("%d warnings about the empty directory, want 1", w)
	}
	path := filepath.Join(dir, "empty.yaml")
	write(t, path, "")
	err := file.New(path, newRecorder(), nil).Load()
	if err == nil || !strings.Contains(err.Error(), path+": empty file") || !strings.Contains(err.Error(), "leave a comment in it") {
		t.Errorf("an empty file at start: %v", err)
	}
	write(t, path, "# none yet\n")
	rec2 := newRecorder()
	if err := file.New(path, rec2, nil).Load(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"synced"}, rec2.take()); diff != "" {
		t.Errorf("a file with a comment must sync with nothing (-want +got):\n%s", diff)
	}
}

// TestServiceCheckRefusesLoad: a Service that WithServiceCheck refuses
// fails the load, naming the file, the document and the Service; on a
// reload, the last good state stays.
func TestServiceCheckRefusesLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "svc.yaml")
	check := func(s *v1.Service) error {
		if v := s.Annotations["userproxy.io/scheduler"]; v != "" && v != "rr" {
			return fmt.Errorf("scheduler %q: unknown", v)
		}
		return nil
	}
	annotated := func(sched string) string {
		return strings.Replace(kubectlList, "    annotations:\n", "    annotations:\n      userproxy.io/scheduler: "+sched+"\n", 1)
	}
	write(t, path, annotated("rr"))
	if !strings.Contains(annotated("rr"), "userproxy.io/scheduler: rr") {
		t.Fatal("the fixture did not take the annotation")
	}
	rec, tr := newRecorder(), tracker(t)
	src := file.New(path, tee{rec, tr}, nil, file.WithServiceCheck(check))
	if err := src.Load(); err != nil {
		t.Fatal(err)
	}
	rec.take()
	write(t, path, annotated("fastest"))
	err := src.Load()
	if err == nil || !strings.Contains(err.Error(), path+": document 1") || !strings.Contains(err.Error(), "Service ns1/web") ||
		!strings.Contains(err.Error(), `scheduler "fastest": unknown`) {
		t.Fatalf("reload error: %v", err)
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("a refused reload delivered %v", got)
	}
	if _, v := tr.Current().Lookup(service.TCP, netip.MustParseAddr("10.96.0.10"), 80); v != service.Forward {
		t.Errorf("the last good table is gone: %v", v)
	}
}

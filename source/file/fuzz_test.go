package file

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// FuzzDecodeFile feeds arbitrary bytes to the configuration decoder, as a
// .yaml and as a .json file: it must return objects or an error naming the
// file and a line of it (file:line:), and never panic.
func FuzzDecodeFile(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n"))
	f.Add([]byte("---\n# c\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {name: s, labels: {kubernetes.io/service-name: web}}\n  addressType: IPv6\n  endpoints: [{addresses: ['fd00::1']}]\n...\n"))
	f.Add([]byte(`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}} {"a": [`))
	f.Add([]byte("--- {apiVersion: v1, kind: ServiceList, items: [1]}\n"))
	f.Add([]byte("\ufeff# c\n{\"apiVersion\": \"v1\", \"kind\": \"Service\", \"metadata\": {\"name\": \"x\"}, \"spec\": {\"clusterIP\": \"None\"}}\n" +
		"---\n[1]\n--- {\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": []}\n...\n{\"a\":\n"))
	f.Add([]byte("a: \"x\n---\nb: 1\n")) // an error at a document's end, before another
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range []string{"fuzz.yaml", "fuzz.json"} {
			objs, err := decodeFile(name, data)
			if err != nil {
				// file:line: with a line of the file.
				var line int
				if _, serr := fmt.Sscanf(strings.TrimPrefix(err.Error(), name+":"), "%d:", &line); serr != nil ||
					!strings.HasPrefix(err.Error(), name+":") || line < 1 || line > bytes.Count(data, []byte("\n"))+1 {
					t.Fatalf("error does not name the file and a line of it: %v", err)
				}
				continue
			}
			for _, o := range objs {
				if (o.svc == nil) == (o.slice == nil) || o.key == "" {
					t.Fatalf("bad object %+v", o)
				}
			}
		}
	})
}

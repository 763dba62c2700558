package file

import (
	"strings"
	"testing"
)

// FuzzDecodeFile feeds arbitrary bytes to the configuration decoder: it must
// return objects or an error naming the file, and never panic.
func FuzzDecodeFile(f *testing.F) {
	f.Add([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: ns1}\nspec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}\n"))
	f.Add([]byte("---\n# c\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {name: s, labels: {kubernetes.io/service-name: web}}\n  addressType: IPv6\n  endpoints: [{addresses: ['fd00::1']}]\n...\n"))
	f.Add([]byte(`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}} {"a": [`))
	f.Add([]byte("--- {apiVersion: v1, kind: ServiceList, items: [1]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := decodeFile("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for _, o := range objs {
			if (o.svc == nil) == (o.slice == nil) || o.key == "" {
				t.Fatalf("bad object %+v", o)
			}
		}
	})
}

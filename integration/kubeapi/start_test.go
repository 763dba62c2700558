package kubeapi_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/userproxy/userproxy/integration/kubeapi"
)

// TestStartRetriesTakenPort: a port picked free can be taken before the
// process binds it (seen in CI: kube-apiserver's "bind: address already in
// use"). Start tries again on fresh ports. A wrapper makes the first start
// of etcd and of kube-apiserver fail as a taken port does; Start must
// succeed on the second, and each log must show both runs.
func TestStartRetriesTakenPort(t *testing.T) {
	bins := requireBinaries(t)
	dir := tmpfsDir(t)
	wrap := filepath.Join(dir, "wrap.sh")
	script := `#!/bin/sh
marker="` + dir + `/first-$(basename "$1")"
if [ ! -e "$marker" ]; then
	: > "$marker"
	echo "listen tcp 127.0.0.1:1: bind: address already in use" >&2
	exit 1
fi
exec "$@"
`
	if err := os.WriteFile(wrap, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := kubeapi.Start(context.Background(), kubeapi.Config{Binaries: bins, Dir: filepath.Join(dir, "cluster"), Wrap: []string{wrap}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	for _, name := range []string{"etcd", "kube-apiserver"} {
		log := c.LogTail(name, 1000)
		if n := strings.Count(log, "=== "); n != 2 {
			t.Errorf("%s started %d times, want 2 (a taken port, then fresh ones); its log:\n%s", name, n, log)
		}
	}
	cs, err := c.Client()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		t.Fatalf("the API server started on the second try does not answer: %v", err)
	}
}

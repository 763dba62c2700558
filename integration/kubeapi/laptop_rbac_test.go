package kubeapi_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// TestRBACLaptop applies examples/kubernetes/laptop.yaml's roles, bound to a
// ServiceAccount in place of the file's user: its copy of the read role is
// the DaemonSet's, and with userproxy-portforward the PortForwarder reaches
// a pod through the real API server and the fake kubelet; each verb of
// userproxy-portforward is needed (without it the dial ends in Forbidden),
// and the DaemonSet's role alone cannot port-forward.
func TestRBACLaptop(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	var read, pf *rbacv1.ClusterRole
	var bindings []*rbacv1.ClusterRoleBinding
	for _, d := range readManifest(t, "laptop.yaml") {
		switch o := d.typed.(type) {
		case *rbacv1.ClusterRole:
			if o.Name == "userproxy-portforward" {
				pf = o
			} else {
				read = o
			}
		case *rbacv1.ClusterRoleBinding:
			bindings = append(bindings, o)
		}
	}
	if read == nil || pf == nil || len(bindings) != 2 {
		t.Fatal("laptop.yaml: want the userproxy and userproxy-portforward ClusterRoles and two bindings")
	}
	if d := cmp.Diff(readManifestRBAC(t).role.Rules, read.Rules); d != "" {
		t.Errorf("laptop.yaml's userproxy role differs from daemonset.yaml's (-daemonset +laptop):\n%s", d)
	}
	for _, b := range bindings {
		if len(b.Subjects) != 1 || b.Subjects[0].Kind != rbacv1.UserKind {
			t.Errorf("binding %s: want one User subject, got %+v", b.Name, b.Subjects)
		}
	}

	// A pod behind the fake kubelet.
	ns := newNamespace(t, cs)
	be := newEchoServer(t, "pod-a")
	podsBehindKubelet(t, cs, "rbac-pf-node", ns, 8080, map[string]string{"pod-a": be.addr}, netip.MustParseAddr("198.51.100.30"), kubeapi.KubeletConfig{})

	// reach dials pod-a with the token of a ServiceAccount bound to roles.
	reach := func(name string, roles ...*rbacv1.ClusterRole) error {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for i, r := range roles {
			r = r.DeepCopy()
			r.ObjectMeta = metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", name, i)}
			if _, err := cs.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			b := &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: r.Name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: r.Name},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
			}
			if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		token := tokenFor(t, cs, ns, name)
		// RBAC takes a moment to see new bindings: retry a Forbidden for
		// a few seconds before believing it.
		var last error
		for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(200 * time.Millisecond) {
			fwd, err := kube.NewPortForwarder(kube.PortForwardConfig{REST: c.RESTConfig(token)})
			if err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			conn, err := fwd.DialPod(dctx, service.PodRef{Namespace: ns, Name: "pod-a"}, 8080)
			cancel()
			if err == nil {
				buf := make([]byte, 6)
				_, err = conn.Read(buf)
				conn.Close()
				if err == nil && string(buf) != "pod-a\n" {
					err = fmt.Errorf("read %q", buf)
				}
			}
			fwd.Close()
			if last = err; err == nil {
				return nil
			}
		}
		return last
	}
	if err := reach("laptop", read, pf); err != nil {
		t.Fatalf("with laptop.yaml's roles: %v", err)
	}
	t.Logf("with laptop.yaml's roles (%s; %s): pod-a reached", rulesString(read.Rules), rulesString(pf.Rules))
	if err := reach("node-agent", read); err == nil || !strings.Contains(strings.ToLower(err.Error()), "forbidden") {
		t.Errorf("with the DaemonSet's role alone: %v, want Forbidden", err)
	}
	for _, verb := range pf.Rules[0].Verbs {
		role := pf.DeepCopy()
		role.Rules[0].Verbs = slices.DeleteFunc(slices.Clone(role.Rules[0].Verbs), func(v string) bool { return v == verb })
		if len(role.Rules[0].Verbs) == 0 {
			role.Rules = nil // a rule needs a verb
		}
		err := reach("without-"+verb, read, role)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "forbidden") {
			t.Errorf("without %s on pods/portforward: %v, want Forbidden", verb, err)
			continue
		}
		t.Logf("without %s on pods/portforward: %v", verb, err)
	}
}

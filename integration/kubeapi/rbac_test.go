package kubeapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/userproxy/userproxy/integration/kubeapi"
	"github.com/userproxy/userproxy/service"
	"github.com/userproxy/userproxy/source/kube"
)

// manifestRBAC is the RBAC of the shipped DaemonSet manifest.
type manifestRBAC struct {
	sa      *v1.ServiceAccount
	role    *rbacv1.ClusterRole
	binding *rbacv1.ClusterRoleBinding
	// daemonSet runs as sa.
	daemonSet *appsv1.DaemonSet
}

// readManifestRBAC decodes examples/kubernetes/daemonset.yaml, as kubectl
// apply would, and returns its ServiceAccount, ClusterRole and binding.
func readManifestRBAC(t *testing.T) manifestRBAC {
	t.Helper()
	var m manifestRBAC
	for _, d := range readManifest(t, "daemonset.yaml") {
		switch o := d.typed.(type) {
		case *v1.ServiceAccount:
			m.sa = o
		case *rbacv1.ClusterRole:
			m.role = o
		case *rbacv1.ClusterRoleBinding:
			m.binding = o
		case *appsv1.DaemonSet:
			m.daemonSet = o
		}
	}
	if m.sa == nil || m.role == nil || m.binding == nil {
		t.Fatal("daemonset.yaml: want a ServiceAccount, a ClusterRole and a ClusterRoleBinding")
	}
	return m
}

// tokenFor returns a bearer token of a ServiceAccount (TokenRequest).
func tokenFor(t *testing.T, cs kubernetes.Interface, ns, name string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctxT(t), name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// TestRBAC applies the RBAC of examples/kubernetes/daemonset.yaml to the API
// server and runs a Source with its ServiceAccount's token: list and watch
// on services and endpointslices are enough to sync and follow changes, the
// token can do nothing more (RBAC is enforced), the cluster's ServiceCIDRs
// are followed, and each grant is needed: a role without it ends in
// Forbidden.
func TestRBAC(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	m := readManifestRBAC(t)
	if _, err := cs.CoreV1().ServiceAccounts(m.sa.Namespace).Create(ctx, m.sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, m.role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, m.binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := tokenFor(t, cs, m.sa.Namespace, m.sa.Name)
	t.Logf("ClusterRole %s: %s", m.role.Name, rulesString(m.role.Rules))

	ns := newNamespace(t, cs)
	p := startSource(t, sourceClient(t, c, token), service.DefaultMinSyncPeriod, nil)
	svc, err := cs.CoreV1().Services(ns).Create(ctx, newService(ns, "web"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(ctx, newSlice(ns, "web-1", "web", discoveryv1.AddressTypeIPv4, eps("10.1.0.1")...), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	http, dns := portKeys("web", svc.Spec.ClusterIP, 80)
	if _, err := p.waitView(ns, view{http: keys(8080, "10.1.0.1"), dns: keys(5353, "10.1.0.1")}, followWithin+10*time.Second); err != nil {
		t.Fatalf("with the manifest's role: %v (LastError %v)", err, p.src.LastError())
	}
	if err := p.src.LastError(); err != nil {
		t.Errorf("LastError with the manifest's role: %v", err)
	}

	// The Node grants: this node's Node can be read and followed.
	limited, err := kubernetes.NewForConfig(c.RESTConfig(token))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Nodes().Create(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: rbacNode}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"get", "list", "watch"} {
		if err := nodeCall(ctx, limited, verb); err != nil {
			t.Errorf("%s on this Node with the userproxy token: %v", verb, err)
		}
	}

	// The ServiceCIDR grants: the cluster's service CIDRs are read and
	// followed (kube.WatchServiceCIDRs).
	cidrCtx, stopCIDRs := context.WithCancel(ctx)
	cidrs := make(chan []netip.Prefix, 1)
	cidrDone := make(chan error, 1)
	go func() {
		cidrDone <- kube.WatchServiceCIDRs(cidrCtx, limited, nil, func(p []netip.Prefix) {
			select {
			case cidrs <- p:
			default:
			}
		})
	}()
	select {
	case got := <-cidrs:
		if want := kubeapi.ServiceCIDRs; !slices.Equal(got, want) {
			t.Errorf("the cluster's service CIDRs with the userproxy token: %v, want %v", got, want)
		}
	case err := <-cidrDone:
		t.Errorf("WatchServiceCIDRs with the userproxy token: %v", err)
	case <-time.After(30 * time.Second):
		t.Errorf("WatchServiceCIDRs with the userproxy token: no CIDRs within 30 s")
	}
	stopCIDRs()

	// The token is good for nothing else.
	for what, call := range map[string]func() error{
		"get a Service": func() error {
			_, err := limited.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
			return err
		},
		"create a Service": func() error {
			_, err := limited.CoreV1().Services(ns).Create(ctx, newService(ns, "other"), metav1.CreateOptions{})
			return err
		},
		"list Pods": func() error {
			_, err := limited.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			return err
		},
		"update a Node": func() error {
			n, err := cs.CoreV1().Nodes().Get(ctx, rbacNode, metav1.GetOptions{})
			if err != nil {
				return err
			}
			_, err = limited.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		},
		"list Secrets": func() error {
			_, err := limited.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
			return err
		},
	} {
		if err := call(); !apierrors.IsForbidden(err) {
			t.Errorf("%s with the userproxy token: %v, want Forbidden", what, err)
		}
	}

	// Each grant is needed.
	for ri, rule := range m.role.Rules {
		for _, verb := range rule.Verbs {
			name := fmt.Sprintf("userproxy-without-%s-%s", verb, strings.Join(rule.Resources, "-"))
			role := m.role.DeepCopy()
			role.ObjectMeta = metav1.ObjectMeta{Name: name}
			role.Rules[ri].Verbs = slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == verb })
			if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			binding := &rbacv1.ClusterRoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
			}
			if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if slices.Contains(rule.Resources, "servicecidrs") {
				// Read by kube.WatchServiceCIDRs: without list it
				// reports them unavailable at once; without watch
				// its informer's watch is refused.
				cidrLimited, err := kubernetes.NewForConfig(c.RESTConfig(tokenFor(t, cs, ns, name)))
				if err != nil {
					t.Fatal(err)
				}
				if verb == "list" {
					if err := kube.WatchServiceCIDRs(ctx, cidrLimited, nil, func([]netip.Prefix) {}); !errors.Is(err, kube.ErrServiceCIDRsUnavailable) {
						t.Errorf("without list on servicecidrs: %v, want ErrServiceCIDRsUnavailable", err)
					}
				} else if _, err := cidrLimited.NetworkingV1().ServiceCIDRs().Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
					t.Errorf("without %s on servicecidrs: %v, want Forbidden", verb, err)
				}
				continue
			}
			if slices.Contains(rule.Resources, "nodes") {
				// The Node is read by run (a get at start, then
				// kube.WatchNode): the call the verb allows is refused.
				nodeLimited, err := kubernetes.NewForConfig(c.RESTConfig(tokenFor(t, cs, ns, name)))
				if err != nil {
					t.Fatal(err)
				}
				if err := nodeCall(ctx, nodeLimited, verb); !apierrors.IsForbidden(err) {
					t.Errorf("without %s on nodes: %v, want Forbidden", verb, err)
				}
				continue
			}
			q := startSource(t, sourceClient(t, c, tokenFor(t, cs, ns, name)), service.DefaultMinSyncPeriod, nil)
			took, ok := waitFor(30*time.Second, func() bool { return apierrors.IsForbidden(q.src.LastError()) })
			if !ok {
				t.Errorf("without %s on %v: no Forbidden within 30 s (LastError %v, synced %v)", verb, rule.Resources, q.src.LastError(), q.src.Synced())
				continue
			}
			t.Logf("without %-5s on %-14s: Forbidden after %v", verb, strings.Join(rule.Resources, ","), took.Round(time.Millisecond))
		}
	}
}

// rbacNode is the Node TestRBAC reads.
const rbacNode = "node-rbac"

// nodeCall makes the call verb allows on rbacNode as run makes it: get by
// name, list and watch with a field selector on the name.
func nodeCall(ctx context.Context, cs kubernetes.Interface, verb string) error {
	sel := metav1.ListOptions{FieldSelector: "metadata.name=" + rbacNode}
	switch verb {
	case "get":
		_, err := cs.CoreV1().Nodes().Get(ctx, rbacNode, metav1.GetOptions{})
		return err
	case "list":
		_, err := cs.CoreV1().Nodes().List(ctx, sel)
		return err
	case "watch":
		w, err := cs.CoreV1().Nodes().Watch(ctx, sel)
		if err == nil {
			w.Stop()
		}
		return err
	}
	return fmt.Errorf("no call for verb %q", verb)
}

func rulesString(rules []rbacv1.PolicyRule) string {
	var parts []string
	for _, r := range rules {
		parts = append(parts, fmt.Sprintf("%v %v in %q", r.Verbs, r.Resources, r.APIGroups))
	}
	return strings.Join(parts, "; ")
}

// TestManifestRBACIsMinimal checks the shipped role without a cluster: it
// grants exactly list and watch on services and endpointslices, get, list
// and watch on nodes (this node's, by name: kube.WatchNode), and list and
// watch on servicecidrs (kube.WatchServiceCIDRs).
func TestManifestRBACIsMinimal(t *testing.T) {
	m := readManifestRBAC(t)
	got := rulesString(m.role.Rules)
	want := `[list watch] [services] in [""]; [list watch] [endpointslices] in ["discovery.k8s.io"]; [get list watch] [nodes] in [""]; [list watch] [servicecidrs] in ["networking.k8s.io"]`
	if got != want {
		t.Errorf("ClusterRole rules:\n got %s\nwant %s", got, want)
	}
	if b := m.binding; b.RoleRef.Name != m.role.Name || len(b.Subjects) != 1 || b.Subjects[0].Kind != rbacv1.ServiceAccountKind ||
		b.Subjects[0].Name != m.sa.Name || b.Subjects[0].Namespace != m.sa.Namespace {
		t.Errorf("the binding does not bind the role to the ServiceAccount: %+v", b)
	}
	if ds := m.daemonSet; ds == nil || ds.Spec.Template.Spec.ServiceAccountName != m.sa.Name || ds.Namespace != m.sa.Namespace {
		t.Errorf("the DaemonSet does not run as the ServiceAccount %s/%s", m.sa.Namespace, m.sa.Name)
	}
}

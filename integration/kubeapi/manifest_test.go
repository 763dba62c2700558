package kubeapi_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
)

// manifestFiles are the shipped manifests, in the order a user applies them
// (sidecar.yaml binds the ClusterRole of daemonset.yaml; laptop.yaml repeats
// it for a laptop that applies no DaemonSet).
var manifestFiles = []string{"daemonset.yaml", "sidecar.yaml", "laptop.yaml"}

// manifestDoc is one document of a manifest: as the server gets it, and
// typed, for the references between objects.
type manifestDoc struct {
	where string // file:document
	obj   *unstructured.Unstructured
	typed runtime.Object
}

// readManifest decodes every document of examples/kubernetes/name.
func readManifest(t *testing.T, name string) []manifestDoc {
	t.Helper()
	path := filepath.Join("..", "..", "examples", "kubernetes", name)
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []manifestDoc
	rd := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	for i := 1; ; i++ {
		doc, err := rd.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		where := fmt.Sprintf("%s:%d", name, i)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		js, err := utilyaml.ToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		typed, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		docs = append(docs, manifestDoc{where: where + " " + u.GetKind() + " " + u.GetName(), obj: u, typed: typed})
	}
	if len(docs) == 0 {
		t.Fatalf("%s: no objects", path)
	}
	return docs
}

// TestManifestsDryRun applies every object of examples/kubernetes to a real
// API server with server-side apply, dry run and strict field validation —
// kubectl apply --server-side --dry-run=server — so that a typo, an unknown
// field or a schema error in a manifest fails here. Namespaces the
// manifests use but do not create are created first; so are (for real) the
// ServiceAccounts of Pods, which admission wants to exist. What a dry run
// cannot see is checked across the files: each pod's ServiceAccount and each
// binding's role and subjects are objects of the manifests.
func TestManifestsDryRun(t *testing.T) {
	c, cs := startCluster(t)
	ctx := ctxT(t)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(""))
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))
	apply := func(d manifestDoc, dryRun bool) error {
		gvk := d.obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		js, err := d.obj.MarshalJSON()
		if err != nil {
			return err
		}
		opts := metav1.PatchOptions{FieldManager: "userproxy-manifest-test", FieldValidation: "Strict", Force: ptr(true)}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			r = dyn.Resource(m.Resource).Namespace(d.obj.GetNamespace())
		}
		_, err = r.Patch(ctx, d.obj.GetName(), types.ApplyPatchType, js, opts)
		return err
	}

	var all []manifestDoc
	byFile := map[string][]manifestDoc{}
	for _, name := range manifestFiles {
		byFile[name] = readManifest(t, name)
		all = append(all, byFile[name]...)
	}
	checkManifestRefs(t, all)
	for _, d := range byFile["daemonset.yaml"] {
		if ds, ok := d.typed.(*appsv1.DaemonSet); ok {
			checkRollingHandover(t, d.where, ds)
		}
	}

	for _, name := range manifestFiles {
		t.Run(name, func(t *testing.T) {
			docs := byFile[name]
			for _, d := range docs {
				if ns := d.obj.GetNamespace(); ns != "" {
					ensureNamespace(t, cs, ns)
				}
			}
			for _, d := range docs {
				if sa, ok := d.typed.(*v1.ServiceAccount); ok && podsNameSA(docs, sa) {
					if err := apply(d, false); err != nil {
						t.Fatalf("%s (for real, for the Pod's admission): %v", d.where, err)
					}
				}
			}
			for _, d := range docs {
				if err := apply(d, true); err != nil {
					t.Errorf("%s: %v", d.where, err)
					continue
				}
				t.Logf("%s: accepted (dry run)", d.where)
			}
		})
	}

	// The check can fail: an unknown field in a copy of the DaemonSet.
	for _, d := range all {
		if _, ok := d.typed.(*appsv1.DaemonSet); !ok {
			continue
		}
		bad := manifestDoc{where: d.where, obj: d.obj.DeepCopy()}
		if err := unstructured.SetNestedField(bad.obj.Object, int64(1), "spec", "template", "spec", "containers0"); err != nil {
			t.Fatal(err)
		}
		if err := apply(bad, true); err == nil || !strings.Contains(err.Error(), "containers0") {
			t.Errorf("%s with an unknown field: %v, want it refused", d.where, err)
		}
	}
}

// ensureNamespace creates namespace ns unless it exists (the API server
// makes default and kube-system itself).
func ensureNamespace(t *testing.T, cs kubernetes.Interface, ns string) {
	t.Helper()
	_, err := cs.CoreV1().Namespaces().Create(ctxT(t), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("namespace %s: %v", ns, err)
	}
}

// podsNameSA reports whether a Pod of docs runs as sa.
func podsNameSA(docs []manifestDoc, sa *v1.ServiceAccount) bool {
	for _, d := range docs {
		if p, ok := d.typed.(*v1.Pod); ok && p.Namespace == sa.Namespace && p.Spec.ServiceAccountName == sa.Name {
			return true
		}
	}
	return false
}

// checkManifestRefs checks the references a dry run lets through: the
// ServiceAccount of every pod (template), and the ClusterRole and
// ServiceAccounts of every ClusterRoleBinding, are objects of the manifests.
func checkManifestRefs(t *testing.T, docs []manifestDoc) {
	t.Helper()
	sas, roles := map[string]bool{}, map[string]bool{}
	for _, d := range docs {
		switch o := d.typed.(type) {
		case *v1.ServiceAccount:
			sas[o.Namespace+"/"+o.Name] = true
		case *rbacv1.ClusterRole:
			roles[o.Name] = true
		}
	}
	needSA := func(where, ns, name string) {
		if !sas[ns+"/"+name] {
			t.Errorf("%s: ServiceAccount %s/%s is in no manifest", where, ns, name)
		}
	}
	for _, d := range docs {
		switch o := d.typed.(type) {
		case *v1.Pod:
			needSA(d.where, o.Namespace, o.Spec.ServiceAccountName)
		case *appsv1.DaemonSet:
			needSA(d.where, o.Namespace, o.Spec.Template.Spec.ServiceAccountName)
		case *rbacv1.ClusterRoleBinding:
			if o.RoleRef.Kind != "ClusterRole" || !roles[o.RoleRef.Name] {
				t.Errorf("%s: role %s %s is in no manifest", d.where, o.RoleRef.Kind, o.RoleRef.Name)
			}
			for _, s := range o.Subjects {
				if s.Kind == rbacv1.UserKind && strings.HasPrefix(d.where, "laptop.yaml:") {
					continue // a laptop's user, named by whoever applies it
				}
				if s.Kind != rbacv1.ServiceAccountKind {
					t.Errorf("%s: subject %s %s: want ServiceAccounts only", d.where, s.Kind, s.Name)
					continue
				}
				needSA(d.where, s.Namespace, s.Name)
			}
		}
	}
}

// checkRollingHandover checks what makes the DaemonSet's rolling update a
// handover (docs/handover.md, TestBinaryRollingUpdate runs the flags):
// the new pod starts before the old one stops (maxSurge, maxUnavailable
// 0), with no host port for the two to fight over (with hostNetwork a
// container port is one); the proxy takes over (--take-over), waits once
// handed over (--after-handover=wait: its kubelet would restart an exit)
// and, on SIGTERM, waits for the new pod (--handover-on-term); its
// handover socket is in a hostPath both pods mount, readied for its user by
// an init container (setup --run-dir).
func checkRollingHandover(t *testing.T, where string, ds *appsv1.DaemonSet) {
	t.Helper()
	u := ds.Spec.UpdateStrategy
	if u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil || u.RollingUpdate.MaxSurge == nil ||
		u.RollingUpdate.MaxSurge.IntValue() < 1 || u.RollingUpdate.MaxUnavailable == nil || u.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("%s: update strategy %+v, want RollingUpdate with maxSurge 1 or more and maxUnavailable 0", where, u)
	}
	spec := ds.Spec.Template.Spec
	var proxy *v1.Container
	for i, c := range spec.Containers {
		if len(c.Args) > 0 && c.Args[0] == "run" {
			proxy = &spec.Containers[i]
		}
		if spec.HostNetwork && len(c.Ports) > 0 {
			t.Errorf("%s: container %s has ports: with hostNetwork each is a host port, which keeps the surge pod off the node", where, c.Name)
		}
	}
	if proxy == nil {
		t.Fatalf("%s: no container runs `userproxy run`", where)
	}
	flags := map[string]string{}
	for _, a := range proxy.Args[1:] {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	for flag, want := range map[string]string{"--take-over": "", "--after-handover": "wait"} {
		if got, ok := flags[flag]; !ok || got != want {
			t.Errorf("%s: %s is %q (given: %v), want %q", where, flag, got, ok, want)
		}
	}
	if flags["--handover-on-term"] == "" {
		t.Errorf("%s: no --handover-on-term", where)
	}
	sock := flags["--handover-socket"]
	if sock == "" {
		t.Fatalf("%s: no --handover-socket", where)
	}
	dir := path.Dir(sock)
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	mountsDir := func(c v1.Container) bool {
		for _, m := range c.VolumeMounts {
			if m.MountPath == dir && hostPaths[m.Name] != "" {
				return true
			}
		}
		return false
	}
	if !mountsDir(*proxy) {
		t.Errorf("%s: the handover socket's directory %s is no hostPath mount of the proxy", where, dir)
	}
	readied := false
	for _, c := range spec.InitContainers {
		if mountsDir(c) && slices.Contains(c.Args, "--run-dir="+dir) && len(c.Args) > 0 && c.Args[0] == "setup" {
			readied = true
		}
	}
	if !readied {
		t.Errorf("%s: no init container readies %s (setup --run-dir)", where, dir)
	}
	if g := spec.TerminationGracePeriodSeconds; g != nil {
		wait, err := time.ParseDuration(flags["--handover-on-term"])
		if err != nil || wait+5*time.Second > time.Duration(*g)*time.Second {
			t.Errorf("%s: --handover-on-term %s and a drain do not fit in terminationGracePeriodSeconds %d", where, flags["--handover-on-term"], *g)
		}
	}
}

// Command kube-apiserver is the Kubernetes API server of k8s.io/kubernetes,
// built as a module of its own so the integration tests of source/kube can
// run against a real one: build.sh builds it (or reuses the cached binary),
// integration/kubeapi starts it, cluster.sh runs it for a person. It adds
// nothing to the upstream command.
//
// The module requires k8s.io/kubernetes and replaces each of its staging
// modules (k8s.io/api, k8s.io/apiserver, ...) with the release of the same
// number, since the ./staging paths of its go.mod exist only in its own
// repository. It is not part of the userproxy module.
package main

// Package kubeapi runs a real Kubernetes control plane for tests: etcd and
// kube-apiserver as child processes on random loopback ports (optionally
// inside a network namespace, through a command prefix such as `ip netns
// exec NAME`), with certificates, a service-account key and a static admin
// token made here, and a kubeconfig written for clients. There is no
// controller-manager: tests write EndpointSlices themselves, labelled as the
// EndpointSlice controller labels them. Nor is there a kubelet: StartKubelet
// runs a fake node agent that serves the kubelet's port-forward API (SPDY,
// as the API server speaks it to nodes) and forwards each stream to a
// backend the test names; RegisterNode and CreatePod write the Node and
// Pod objects the API server reads to reach it.
//
// Its tests drive source/kube through that API server: objects written ->
// service table, a headless Service -> cluster DNS answers, dual-stack
// ClusterIPs the API server allocates, 1,000
// services x 10 endpoints with the network-programming latency, API server
// restarts and outages, the RBAC of examples/kubernetes, and `pods/portforward`
// through the API server to the fake node agent. They need the
// etcd and kube-apiserver binaries (FindBinaries says where it looks and how
// to get them); without them they skip, or fail when CI is set. Root is not
// needed.
//
// Callers: these tests, the end-to-end test of the binary in integration,
// and cmd/kube-up behind integration/kubeapiserver/cluster.sh. The
// kube-apiserver binary itself is built by integration/kubeapiserver, a
// separate Go module.
//
// It may import anything; nothing but tests and kube-up imports it.
package kubeapi

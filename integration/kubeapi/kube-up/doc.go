// Command kube-up runs etcd and kube-apiserver on loopback for a person (or a
// script) rather than a test: integration/kubeapiserver/cluster.sh starts it
// in the background and stops it by PID. It writes DIR/kubeconfig (the
// admin's, in system:masters) and DIR/ready once /readyz answers, and stops
// both processes on SIGTERM or SIGINT.
//
// Usage: kube-up -dir DIR
package main

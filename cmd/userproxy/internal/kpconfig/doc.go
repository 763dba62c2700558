// Package kpconfig reads kube-proxy v1.37's KubeProxyConfiguration
// (kubeproxy.config.k8s.io/v1alpha1) as `kube-proxy --config` does: a
// strict decode, kube-proxy's defaults and its validation, each refusal
// naming the field, and the fields userproxy cannot honour refused with the
// reason. It is pure: no I/O but Load's read of the file, no logging. Its
// caller is cmd/userproxy's kube-proxy command, which maps the result onto
// run's options; it imports nothing of userproxy's but balancer, whose
// scheduler names ipvs.scheduler must be one of.
package kpconfig

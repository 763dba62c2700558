// Package integration holds the privileged tests: the real binary on a real
// TUN device inside network namespaces the tests create and delete, backends
// and clients in sibling namespaces, and the kernel's own iptables path beside
// ours for comparison. Its tests need root; CI runs them as root.
//
// It may import any userproxy package; nothing imports it.
package integration

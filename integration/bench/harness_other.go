//go:build !linux

package main

import "errors"

func harnessMain([]string) error {
	return errors.New("the harness needs Linux (network namespaces, a TUN device, iptables)")
}

func tunExec(string, []string) error {
	return errors.New("tunexec needs Linux (a TUN device)")
}

//go:build !linux

package kubeapi

import "syscall"

// procAttr: no parent-death signal outside Linux; Stop must be called.
func procAttr() *syscall.SysProcAttr { return nil }

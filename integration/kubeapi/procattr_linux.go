package kubeapi

import "syscall"

// procAttr makes the kernel kill a child when its parent thread exits.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

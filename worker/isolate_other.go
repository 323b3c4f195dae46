//go:build !linux

package worker

import "syscall"

// childAttr: outside Linux a child does not die with its worker; a worker
// stopped by a signal still stops its children through the grace.
func childAttr() *syscall.SysProcAttr { return nil }

// endGroup: outside Linux a child has no process group of its own to
// end; what it leaves behind is waited for Isolation.OutputWait at most.
func endGroup(pid int) {}

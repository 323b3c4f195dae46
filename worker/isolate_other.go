//go:build !linux

package worker

import "syscall"

// childAttr: outside Linux a child does not die with its worker; a worker
// stopped by a signal still stops its children through the grace.
func childAttr() *syscall.SysProcAttr { return nil }

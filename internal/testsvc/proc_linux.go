package testsvc

import "syscall"

// sysProcAttr makes the kernel kill a server when the test process dies, so
// that an interrupted `go test` leaves no redis-server or versitygw behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

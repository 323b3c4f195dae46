package worker

import "syscall"

// childAttr puts a task's process in a process group of its own, so that
// a terminal's Ctrl-C reaches the worker alone, which forwards it as
// SIGTERM and grants the grace; and has the kernel kill the child when the
// worker dies, so that no orphan keeps training, holding the device and
// the run's lock, while asynq gives the task to another worker.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

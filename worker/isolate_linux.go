package worker

import (
	"errors"
	"syscall"

	"golang.org/x/sys/unix"
)

// childAttr puts a task's process in a process group of its own, so that
// a terminal's Ctrl-C reaches the worker alone, which forwards it as
// SIGTERM and grants the grace, and so that what it leaves behind can be
// killed with it (endGroup); and has the kernel kill the child when the
// worker dies, so that no orphan keeps training, holding the device and
// the run's lock, while asynq gives the task to another worker.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// endGroup waits until child process pid has ended, and kills what is
// left of its process group: processes it started and left behind. The
// child is not reaped yet (its caller's Wait does that), so the group's
// id is still its own, and no other process's.
func endGroup(pid int) {
	var err error
	for {
		if err = unix.Waitid(unix.P_PID, pid, &unix.Siginfo{}, unix.WEXITED|unix.WNOWAIT, nil); !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err == nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

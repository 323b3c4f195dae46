package testsvc

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Freeze stops the server (SIGSTOP: it accepts connections and answers
// none, as a hung store does) and returns once every thread of it has
// stopped, with the func that lets it go on (SIGCONT; a second call does
// nothing, and the test's cleanup calls it before the server is stopped).
// kill(2) returns before the stop takes hold: a thread the kernel did not
// pick for the signal runs on until the picked one is scheduled, and on a
// loaded machine it answered a request sent after the kill.
func (s *S3Server) Freeze() (thaw func()) {
	t := s.p.t
	t.Helper()
	pid := s.Pid()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("testsvc: stop versitygw: %v", err)
	}
	frozen := true
	thaw = func() {
		if frozen {
			frozen = false
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("testsvc: resume versitygw: %v", err)
			}
		}
	}
	t.Cleanup(thaw)
	// A thread that never stops is a kernel's fault, not a slow
	// machine's: the bound only keeps the test from hanging on it.
	deadline := time.Now().Add(time.Minute)
	for !AllThreadsStopped(pid) {
		if time.Now().After(deadline) {
			thaw()
			t.Fatalf("testsvc: versitygw (pid %d) did not stop on SIGSTOP", pid)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return thaw
}

// AllThreadsStopped reports whether every thread of process pid is
// stopped (or gone), by their states in /proc.
func AllThreadsStopped(pid int) bool {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return true
	}
	for _, e := range ents {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, e.Name()))
		if err != nil {
			continue // the thread ended
		}
		// The state letter follows the command name, which is in
		// parentheses and may hold spaces.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			return false
		}
		switch b[i+2] {
		case 'T', 't', 'Z', 'X':
		default:
			return false
		}
	}
	return true
}

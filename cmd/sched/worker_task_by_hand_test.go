//go:build linux

package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// sched worker-task typed by hand, with no outcome pipe on descriptor 3
// (none, or a terminal there), says at once that sched worker starts it
// and exits 2, where it failed with "write outcome: bad file descriptor"
// or waited on its standard input without a word.
func TestWorkerTaskByHandSaysWhatStartsIt(t *testing.T) {
	t.Parallel()
	want := "sched: sched worker-task is started by 'sched worker'"
	_, errOut, code := sched(t, nil, taskCommand)
	if code != exitBadInput || !strings.HasPrefix(errOut, want) || !strings.Contains(errOut, "not to be run by hand") {
		t.Errorf("sched %s: exit %d, %q; want exit 2 and %q", taskCommand, code, errOut, want)
	}

	// Descriptor 3 on a terminal, and standard input one that nothing
	// writes to: refused before it reads a task.
	_, tty := openTerminal(t)
	r, w := openPipe(t)
	cmd := exec.Command(os.Args[0], taskCommand)
	cmd.Env = baseEnv(t)
	cmd.Stdin = r
	cmd.ExtraFiles = []*os.File{tty}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(hangBound):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("sched %s with a terminal on descriptor 3 waits on its standard input: %q", taskCommand, stderr.String())
	}
	w.Close()
	if code := cmd.ProcessState.ExitCode(); code != exitBadInput || !strings.HasPrefix(stderr.String(), want) {
		t.Errorf("sched %s with a terminal on descriptor 3: exit %d, %q; want exit 2 and %q", taskCommand, code, stderr.String(), want)
	}
}

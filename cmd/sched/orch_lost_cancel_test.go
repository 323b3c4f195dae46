package main

import (
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
)

// A lost task that sched cancel was given says it is archived, not run,
// when a worker recovers it (the worker tests run that), where any other
// lost task says it runs again.
func TestALostTaskThatWasCancelledSaysItWillNotRunAgain(t *testing.T) {
	t.Parallel()
	ts := scheduler.TaskStatus{ID: "train:segment:ab", Queue: scheduler.QueueGPU, State: "active", Lost: true, HasProgress: true,
		Progress: scheduler.Progress{Worker: "vm:42"}}
	if got := lostDetail(ts); !strings.Contains(got, "runs again once a worker on queue gpu recovers it") {
		t.Errorf("lost task: %q", got)
	}
	ts.Cancelled = true
	if got := lostDetail(ts); got != "worker vm:42 stopped heartbeating; cancelled: a worker on queue gpu that recovers it archives it without running it" {
		t.Errorf("lost task that was cancelled: %q", got)
	}
	ts.Cancelled, ts.WorkerLive = false, true
	if got := lostDetail(ts); got != "worker vm:42 lost the task's lease (cut off from Redis for longer than it) and stops it; the task runs again once a worker on queue gpu recovers it" {
		t.Errorf("lost task whose worker heartbeats: %q", got)
	}
}

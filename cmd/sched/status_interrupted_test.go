package main

import (
	"context"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// `sched status <task-id>` of a task that its worker's shutdown stopped
// says it was interrupted, and that it runs again once a worker takes it:
// it said asynq's state, "retry", which a user reads as a failed attempt,
// where none failed and no retry is used. `sched runs` says the same word.
// Once a worker takes it again it reads active.
func TestStatusOfAnInterruptedTaskSaysItWasInterrupted(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  active  .*"run eta step [1-9]`), time.Minute)
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker on SIGTERM: %v", err)
	}
	ts, err := q.Task(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if (ts.State != "retry" && ts.State != "pending") || ts.Progress.State != "interrupted" {
		t.Fatalf("segment after SIGTERM: %s, progress %+v; want it set back, interrupted", ts.State, ts.Progress)
	}

	want := regexp.MustCompile(`^` + id + `  interrupted  .*"interrupted by worker shutdown: .*"  ` +
		`it runs again once a worker on queue gpu takes it \(no retry used\)\n$`)
	out, errOut, code := sched(t, env, "status", id)
	if code != 0 || !want.MatchString(out) || strings.Contains(out, "last error") {
		t.Errorf("status %s after its worker's shutdown: exit %d %q %q\nwant it interrupted, running again once a worker takes it, with no error", id, code, out, errOut)
	}
	out, _, _ = sched(t, env, "runs")
	if task := lineWith(out, "  "+id+"  "); !strings.Contains(task, id+"  interrupted  by a worker's shutdown and re-queued (no retry used)") {
		t.Errorf("sched runs shows the interrupted segment as %q", task)
	}

	// Typed again, the enqueue says the same, not "waiting to retry".
	again := "run eta is already queued again after its worker's shutdown (no retry used) as " + id + "; nothing queued"
	if out, errOut, code := sched(t, env, "enqueue", "train", "eta"); code != 0 || !strings.HasPrefix(out, again) {
		t.Errorf("enqueue train eta after its worker's shutdown: exit %d %q %q\nwant %q", code, out, errOut, again)
	}
	// sched retry runs it now, and says why it waited as status does: it
	// said "was waiting to retry after", an attempt that never failed.
	now := id + " was queued again after its worker's shutdown (no retry used); running it now"
	if out, errOut, code := sched(t, env, "retry", id); code != 0 || !strings.HasPrefix(out, now) {
		t.Errorf("retry %s after its worker's shutdown: exit %d %q %q\nwant %q", id, code, out, errOut, now)
	}

	startWorker(t, env, "--queues", "gpu=1")
	waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  active  .*"run eta step \d+`), time.Minute)
}

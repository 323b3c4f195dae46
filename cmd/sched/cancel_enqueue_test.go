package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// `sched cancel` of a training segment, then at once `sched enqueue train`
// of its run (or `sched retry` of the segment), while the segment still
// stops: asynq lets go of a cancelled task as its context ends, and its
// process still finishes its step and writes that step's checkpoint. The
// enqueue queued the same segment again at once, from the checkpoint
// before (the same id), which ran beside the one stopping, and the
// stopping one's end was logged as the new task's failure ("task failed
// ... context canceled"). It waits for the stop, saying so, then queues
// the run from the checkpoint the stop wrote. The segment's process is
// held stopped (SIGSTOP) while the cancel and the enqueue are made: a
// step longer than those commands holds it so.
func TestAnEnqueueAfterACancelWaitsForTheSegmentToStop(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	for _, how := range []string{"enqueue", "retry"} {
		if out, errOut, code := sched(t, env, "enqueue", "train", "eta", "--engine", "cpu"); code != 0 {
			t.Fatalf("enqueue train eta: exit %d %q %q", code, out, errOut)
		}
		id := waitRunningSegment(t, q)
		before := 0
		if st, ok, err := scheduler.ReadRunState(ctx, rdb, "eta"); err == nil && ok {
			before = st.Step
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			st, _, err := scheduler.ReadRunState(ctx, rdb, "eta")
			if err != nil {
				t.Fatal(err)
			}
			if st.Step > before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the segment trained no step in a minute")
			}
		}
		resume := freezeChildren(t, w.Process.Pid)
		if out, errOut, code := sched(t, env, "cancel", id); code != 0 || !strings.HasPrefix(out, id+" cancelled: archived") {
			resume()
			t.Fatalf("cancel %s: exit %d %q %q", id, code, out, errOut)
		}

		args := []string{"enqueue", "train", "eta", "--engine", "cpu"}
		if how == "retry" {
			args = []string{"retry", id}
		}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(baseEnv(t), env...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errOut strings.Builder
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(stdout)
		waiting := id + " was cancelled and is still stopping ("
		if !sc.Scan() || !strings.HasPrefix(sc.Text(), waiting) {
			resume()
			_ = cmd.Wait()
			t.Fatalf("%s after the cancel, the segment still stopping: first line %q (%s); want %q...", how, sc.Text(), errOut.String(), waiting)
		}
		// Nothing is queued while it waits.
		if ts, err := q.Task(ctx, id); err != nil || ts.State != "archived" || !ts.Cancelled {
			resume()
			t.Fatalf("%s waiting for the stop: the cancelled segment reads %s (cancelled %v), %v", how, ts.State, ts.Cancelled, err)
		}
		resume()
		var rest []string
		for sc.Scan() {
			rest = append(rest, sc.Text())
		}
		if err := cmd.Wait(); err != nil || len(rest) == 0 {
			t.Fatalf("%s once the segment stopped: %v, %q (%s)", how, err, rest, errOut.String())
		}
		queued := regexp.MustCompile(`^queued (train:segment:[0-9a-f]+) on gpu`).FindStringSubmatch(rest[0])
		if queued == nil {
			t.Fatalf("%s once the segment stopped: %q; want it queued", how, rest)
		}
		// The stopped segment's end was the cancel's, not a failure of
		// the task queued after it.
		waitUntil(t, "the run training again after "+how, func() bool {
			live, err := q.LiveSegment(ctx, "eta")
			return err == nil && live != nil && live.State.String() == "active"
		})
		for _, l := range strings.Split(workerLog(t, w), "\n") {
			if strings.Contains(l, `"task failed"`) && strings.Contains(l, id) {
				t.Errorf("%s after a cancel: the worker logged a failure of %s: %s", how, id, l)
			}
		}
		live, err := q.LiveSegment(ctx, "eta")
		if err != nil || live == nil {
			t.Fatal(err)
		}
		if _, err := q.Cancel(ctx, live.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := q.WaitStopped(ctx, live.ID, nil); err != nil {
			t.Fatal(err)
		}
	}
}

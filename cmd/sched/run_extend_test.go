package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
)

// A done run given a longer total in the runs file of the machine that
// enqueues it, and not in the GPU worker's (compose's KILN_WORKER_RUNS
// left as it was), reads queued to the longer total, where it read done
// at its old one, and waits on the worker, saying which entry lacks the
// length it was queued for, where the worker ended the run at once as
// done, the longer total dropped without a word. Given the entry, the
// worker trains the run on to it.
func TestAnExtensionTheWorkersRunsFileLacksWaitsForIt(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	ctx := context.Background()
	appendRuns(t, env, "ext:\n  from: eta\n  total_steps: 40\n")
	trainToTheEnd(t, env, rdb, q, "ext")

	// The worker's runs file, as the run was; this machine's, longer.
	workerRuns := filepath.Join(t.TempDir(), "worker-runs.yaml")
	b, err := os.ReadFile(envValue(env, "KILN_RUNS"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(workerRuns, b, 0o644); err != nil {
		t.Fatal(err)
	}
	editRuns(t, env, "ext:\n  from: eta\n  total_steps: 40\n", "ext:\n  from: eta\n  total_steps: 60\n")
	out, errOut, code := sched(t, env, "enqueue", "train", "ext")
	id := regexp.MustCompile(`train:segment:[0-9a-f]+`).FindString(out)
	if code != 0 || id == "" || !strings.Contains(out, "the run resumes from its last checkpoint (step 40)") {
		t.Fatalf("enqueue train ext with total_steps 60: exit %d: %s%s", code, out, errOut)
	}
	for _, cmd := range []string{"status", "runs"} {
		out, errOut, code := sched(t, env, cmd)
		if l := lineOf(out, "ext  "); code != 0 || !strings.HasPrefix(l, "ext  queued  step 40/60 (66.7%)") {
			t.Errorf("sched %s, the run queued to go on to 60: exit %d, its line %q (%s); want it queued at step 40 of 60", cmd, code, l, errOut)
		}
	}

	w := startWorker(t, append(env[:len(env):len(env)], "KILN_RUNS="+workerRuns), "--queues", "gpu=1")
	var ts scheduler.TaskStatus
	waitUntil(t, "run ext's segment waiting for the worker's entry", func() bool {
		ts, err = q.Task(ctx, id)
		return err == nil && (ts.HasProgress && ts.Progress.State == "waiting" || ts.State == "completed" || ts.State == "archived")
	})
	want := "this worker's runs entry of run ext to give the length it was queued for (step 60; it gives 40, and the run is done at step 40; this worker's KILN_RUNS is " + workerRuns + "); give it that length and the run goes on from step 40, or 'sched cancel' its segment"
	if ts.State == "completed" || ts.State == "archived" || ts.Retried != 0 || !strings.Contains(ts.Progress.Message, want) {
		t.Fatalf("the segment queued past the worker's total: %s, retried %d, %q (%q); want it waiting, saying %q", ts.State, ts.Retried, ts.Progress.Message, ts.LastErr, want)
	}
	out, errOut, code = sched(t, env, "status")
	if l := lineOf(out, "ext  "); code != 0 || !strings.HasPrefix(l, "ext  waiting  step 40/60 (66.7%)") || !strings.Contains(l, "; give it that length and the run goes on from step 40, or 'sched cancel' its segment") {
		t.Errorf("sched status, the segment waiting for the worker's entry: exit %d, the run's line %q (%s)", code, l, errOut)
	}
	if st, _, err := scheduler.ReadRunState(ctx, rdb, "ext"); err != nil || !st.Done || st.Step != 40 {
		t.Fatalf("run ext's state while it waits: %+v, %v; want it done at 40, untouched", st, err)
	}

	// Given the entry, the run goes on (sched retry: at once, rather than
	// at the wait's next look).
	if err := os.WriteFile(workerRuns, []byte(strings.Replace(string(b), "total_steps: 40", "total_steps: 60", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := sched(t, env, "retry", id); code != 0 {
		t.Fatalf("sched retry %s: exit %d: %s%s", id, code, out, errOut)
	}
	waitUntil(t, "run ext done at 60", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "ext")
		live, lerr := q.LiveSegment(ctx, "ext")
		return err == nil && ok && st.Done && st.Step == 60 && lerr == nil && live == nil
	})
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	out, errOut, code = sched(t, env, "status")
	if l := lineOf(out, "ext  "); code != 0 || !strings.HasPrefix(l, "ext  done  step 60/60 (100.0%)") {
		t.Errorf("sched status once the worker's entry gave the length: exit %d, its line %q (%s)", code, l, errOut)
	}

	// The worker's entry longer than the run's step, and shorter than the
	// length it is queued for: the run trained to the worker's length and
	// read done there, the queued length dropped without a word.
	editRuns(t, env, "ext:\n  from: eta\n  total_steps: 60\n", "ext:\n  from: eta\n  total_steps: 100\n")
	if err := os.WriteFile(workerRuns, []byte(strings.Replace(string(b), "total_steps: 40", "total_steps: 80", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = sched(t, env, "enqueue", "train", "ext")
	id = regexp.MustCompile(`train:segment:[0-9a-f]+`).FindString(out)
	if code != 0 || id == "" {
		t.Fatalf("enqueue train ext with total_steps 100: exit %d: %s%s", code, out, errOut)
	}
	startWorker(t, append(env[:len(env):len(env)], "KILN_RUNS="+workerRuns), "--queues", "gpu=1")
	waitUntil(t, "run ext's segment waiting for the worker's longer entry", func() bool {
		ts, err = q.Task(ctx, id)
		return err == nil && (ts.HasProgress && ts.Progress.State == "waiting" || ts.State == "completed" || ts.State == "archived")
	})
	want = "(step 100; it gives 80, and the run is done at step 60; this worker's KILN_RUNS is " + workerRuns + ")"
	if ts.State == "completed" || ts.State == "archived" || !strings.Contains(ts.Progress.Message, want) {
		t.Fatalf("the segment queued past the worker's longer total: %s, %q (%q); want it waiting, saying %q", ts.State, ts.Progress.Message, ts.LastErr, want)
	}
	if st, _, err := scheduler.ReadRunState(ctx, rdb, "ext"); err != nil || !st.Done || st.Step != 60 {
		t.Fatalf("run ext's state while it waits: %+v, %v; want it done at 60, untouched", st, err)
	}
}

// A done run is said done at its step of its total, and one whose total
// was lowered below the step it reached, past it: "done at step 1000 of
// 500" read as a fault.
func TestADoneRunIsSaidDoneAtOrPastItsTotal(t *testing.T) {
	for _, c := range []struct {
		at, total int
		want      string
	}{
		{400, 400, "run r is done at step 400 of 400; nothing queued ("},
		{1000, 500, "run r is done at step 1000, past its total of 500; nothing queued ("},
	} {
		var b strings.Builder
		sayDone(&b, "r", c.at, c.total)
		if !strings.HasPrefix(b.String(), c.want) {
			t.Errorf("done at %d of %d: %q; want it to begin %q", c.at, c.total, b.String(), c.want)
		}
	}
}

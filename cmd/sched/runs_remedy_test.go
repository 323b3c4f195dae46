package main

import (
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
)

// `sched runs` cuts a long error as FAILURES does, keeping its last
// clause, what to do: it cut it at 200 characters, and the one line a user
// reads of a segment archived on a GPU worker without the run lost the
// remedy ("define the run there, then 'sched enqueue train ...'"). The
// run's own line keeps it too.
func TestRunsKeepsTheRemedyOfALongError(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetup(t)
	const run = "a-run-this-worker-lacks"
	appendRuns(t, env, run+":\n  from: eta\n")
	out, errOut, code := sched(t, env, "enqueue", "train", run)
	m := regexp.MustCompile(`queued (train:segment:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue train %s: exit %d, %q %q", run, code, out, errOut)
	}
	id := m[1]
	// A GPU worker whose host has no runs file: it knows the presets alone.
	startWorker(t, append(env[:len(env):len(env)], "KILN_RUNS="), "--queues", "gpu=1")
	var ts scheduler.TaskStatus
	waitUntil(t, "the segment archived", func() bool {
		var err error
		ts, err = q.Task(context.Background(), id)
		return err == nil && ts.State == "archived"
	})
	const remedy = "this worker has no KILN_RUNS: define the run there, then 'sched enqueue train " + run + "'"
	if whole := scheduler.OneLine(ts.LastErr, taskErrRunes); len(whole) <= 200 || !strings.HasSuffix(whole, "; "+remedy) {
		t.Fatalf("the segment's error %q; want one longer than a line that ends with %q", whole, remedy)
	}

	out, errOut, code = sched(t, env, "runs")
	if code != 0 {
		t.Fatalf("sched runs: exit %d: %s%s", code, out, errOut)
	}
	if task := lineWith(out, "  "+id+"  "); !strings.Contains(task, "failed for good after 1 attempt: train:segment: unknown run") ||
		!strings.Contains(task, "…; "+remedy+"  ") {
		t.Errorf("sched runs shows the archived segment as %q; want its error's start, cut, then %q", task, remedy)
	}
	if line := lineWith(out, run+"  "); !strings.Contains(line, "…; "+remedy) {
		t.Errorf("sched runs shows run %s as %q; want its error cut before %q", run, line, remedy)
	}
}

package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// A run whose training diverged reads at the step of its last good
// checkpoint, with that step's loss: it read the step after it, which was
// trained and never logged or kept, beside the loss of the step before
// (`failed  step 41/100  loss <step 40's>  last checkpoint step 40`).
func TestADivergedRunReadsAtItsLastGoodCheckpoint(t *testing.T) {
	t.Parallel()
	env, _, _ := trainingSetup(t)
	appendRuns(t, env, "dv:\n  from: eta\n  total_steps: 40\n")
	startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "dv"); code != 0 {
		t.Fatalf("enqueue train dv: exit %d: %s%s", code, out, errOut)
	}
	out := waitOutput(t, env, regexp.MustCompile(`(?m)^dv  done  `), 2*time.Minute, "status")
	done := regexp.MustCompile(`^dv  done  step 40/40 \(100\.0%\)  loss (\S+)  last checkpoint step 40 `).FindStringSubmatch(lineOf(out, "dv  "))
	if done == nil {
		t.Fatalf("run line %q; want it done at step 40 with its loss", lineOf(out, "dv  "))
	}

	// Given a longer total and an lr that makes its first step's update
	// diverge: step 41 trains (its loss is of the weights before it), and
	// step 42 finds the divergence.
	editRuns(t, env, "dv:\n  from: eta\n  total_steps: 40\n", "dv:\n  from: eta\n  total_steps: 100\n  lr: 1.0e+6\n")
	if out, errOut, code := sched(t, env, "enqueue", "train", "dv"); code != 0 {
		t.Fatalf("enqueue train dv again: exit %d: %s%s", code, out, errOut)
	}
	out = waitOutput(t, env, regexp.MustCompile(`(?m)^dv  failed  `), 2*time.Minute, "status")
	line := lineOf(out, "dv  ")
	want := fmt.Sprintf("dv  failed  step 40/100 (40.0%%)  loss %s  last checkpoint step 40 ", done[1])
	if !strings.HasPrefix(line, want) || !strings.Contains(line, "training diverged") {
		t.Errorf("run line %q; want it to begin %q and say the training diverged", line, want)
	}
}

package main

import (
	"os"
	"path/filepath"
	"testing"
)

// sched config refuses a run of KILN_RUNS whose step no card kiln supports
// could hold, as sched enqueue train does, naming the run and what to
// change: the README says config refuses a run that could never train,
// and it said nothing of one that sched enqueue train then refused.
func TestConfigRefusesARunTooBigForAnyCard(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(file, []byte("huge:\n  from: pilot-cpu\n  model: small\n  batch: 4000\n  seq: 1024\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"KILN_RUNS=" + file}
	const want = "run huge: batch 4000 x seq 1024 of a 32.0M-parameter model"
	wantRefused(t, env, want, "config")
	wantRefused(t, env, "the largest card kiln supports (an H200, 141 GB)", "config")
	wantRefused(t, env, "give run huge a smaller batch and a larger accumulate", "config")
}

package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A new run whose warmup is as long as the run or longer is refused
// before it trains, naming both and what to give: its learning rate
// would rise for the whole run and never decay. A flag that shortens the
// warmup, or lengthens the run, lets it through; --resume goes on as the
// run began.
func TestTrainRefusesAWarmupAsLongAsTheRun(t *testing.T) {
	t.Parallel()
	missing := filepath.Join(t.TempDir(), "no-store")
	wantRefused(t, nil, "warmup 50 is not shorter than the run's 50 steps: the learning rate would rise for the whole run and never decay; give a warmup under 50 steps",
		"train", "--model", "tiny", "--tokens", missing, "--steps", "50", "--warmup", "50")
	rc := filepath.Join(t.TempDir(), "rc.yaml")
	if err := os.WriteFile(rc, []byte("model: tiny\nseq: 32\nbatch: 2\nwarmup: 2000\ntotal_steps: 100\nmixture: [{store: "+missing+"}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, nil, "run config "+rc+": warmup 2000 is not shorter than the run's 100 steps", "train", "--run-config", rc)
	wantRefused(t, nil, "warmup 2000 is not shorter than the run's 20 steps", "train", "--run-config", rc, "--steps", "20")
	for _, args := range [][]string{
		{"--warmup", "10"},
		{"--steps", "4000"},
		{"--resume", "--out", t.TempDir()},
	} {
		_, errOut, code := sched(t, nil, append([]string{"train", "--run-config", rc}, args...)...)
		if code == 0 || strings.Contains(errOut, "warmup") {
			t.Errorf("sched train --run-config %v: exit %d, %q; want it past the warmup check (to fail on the missing store or checkpoint)", args, code, errOut)
		}
	}
}

// sched enqueue train refuses a new run of such a warmup, naming the run
// and its runs entry, and queues nothing; a run already under way, its
// entry given such a warmup since, resumes as it began.
func TestEnqueueTrainRefusesANewRunsWarmupAsLongAsTheRun(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	ctx := context.Background()
	appendRuns(t, env, "hot:\n  from: eta\n  warmup: 40\n  total_steps: 40\n")
	wantRefused(t, env, "run hot: warmup 40 is not shorter than the run's 40 steps: the learning rate would rise for the whole run and never decay; give a warmup under 40 steps (a few percent of the run is usual): edit its runs entry",
		"enqueue", "train", "hot")
	if live, err := q.LiveSegment(ctx, "hot"); err != nil || live != nil {
		t.Fatalf("a refused run queued %v (%v)", live, err)
	}

	short, long := "warm:\n  from: eta\n  total_steps: 40\n", "warm:\n  from: eta\n  warmup: 60\n  total_steps: 60\n"
	appendRuns(t, env, short)
	trainToTheEnd(t, env, rdb, q, "warm")
	runsFile := envValue(env, "KILN_RUNS")
	b, err := os.ReadFile(runsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(runsFile, []byte(strings.Replace(string(b), short, long, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := sched(t, env, "enqueue", "train", "warm")
	if code != 0 || !regexp.MustCompile(`^queued train:segment:\S+ on gpu; the run resumes from its last checkpoint \(step 40\)\n$`).MatchString(out) {
		t.Fatalf("enqueue train warm under way, its warmup now 60 of 60 steps: exit %d, %q %q; want it resumed from step 40", code, out, errOut)
	}
}

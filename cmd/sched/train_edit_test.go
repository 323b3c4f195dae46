package main

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
)

// A run whose length is total_tokens, stopped part-way, then given another
// batch in its runs entry: its total_steps counted in steps of the new size
// made it read as done at enqueue (a larger batch), or the worker train it
// to another length than its tokens, with nothing said. Enqueue refuses it
// naming the step size to keep, and so does the worker for the segment
// already queued; the same tokens a step in smaller micro-batches are
// accepted.
func TestATokenLengthRunGivenAnotherBatchIsRefused(t *testing.T) {
	t.Parallel()
	env, rdb, q, _ := s3TrainingSetup(t, "")
	ctx := context.Background()
	// 64 tokens a step (seq 32 x batch 2 x accumulate 1): 1000 steps.
	entry := "tt:\n  from: eta\n  total_tokens: 64000\n  checkpoint_every: 5\n  log_every: 1\n"
	appendRuns(t, env, entry)
	w := startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "tt"); code != 0 {
		t.Fatalf("enqueue train tt: exit %d: %s%s", code, out, errOut)
	}
	waitUntil(t, "run tt checkpointed in object storage", func() bool {
		st, ok, err := scheduler.ReadRunState(ctx, rdb, "tt")
		return err == nil && ok && st.Checkpoint >= 5
	})
	// A stop: the segment checkpoints and is queued again.
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()

	runsFile := envValue(env, "KILN_RUNS")
	edit := func(extra string) {
		t.Helper()
		b, err := os.ReadFile(runsFile)
		if err != nil {
			t.Fatal(err)
		}
		i := strings.Index(string(b), entry)
		if i < 0 {
			t.Fatalf("%s lost the entry of tt", runsFile)
		}
		if err := os.WriteFile(runsFile, []byte(string(b[:i+len(entry)])+extra), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit("  batch: 4\n")
	wantBadInput(t, env, `^sched: run tt trained 64 tokens a step \(\d+ tokens by step \d+\), and its runs entry now gives 128 \(seq 32 x batch 4 x accumulate 1\); `+
		`its length is total_tokens 64000, which in steps of the new size ends at step 500: keep seq x batch x accumulate at 64 .*or give the run's length as total_steps`,
		"enqueue", "train", "tt")

	// The segment queued by the stop meets the edit on the worker.
	w = startWorker(t, env, "--queues", "gpu=1")
	defer func() { w.Process.Signal(syscall.SIGTERM); w.Wait() }()
	var refused string
	waitUntil(t, "the queued segment of tt archived", func() bool {
		snap, err := q.Snapshot(ctx)
		if err != nil {
			return false
		}
		for _, ts := range snap.Tasks {
			if ts.Kind == scheduler.KindTrainSegment && ts.State == "archived" {
				refused = ts.LastErr
				return true
			}
		}
		return false
	})
	if !strings.Contains(refused, "trained 64 tokens a step") || !strings.Contains(refused, "keep seq x batch x accumulate at 64") {
		t.Fatalf("the archived segment says %q; want the step size to keep", refused)
	}

	// The same 64 tokens a step, in micro-batches of one.
	edit("  batch: 1\n  accumulate: 2\n")
	out, errOut, code := sched(t, env, "enqueue", "train", "tt")
	if code != 0 || !strings.HasPrefix(out, "queued ") {
		t.Fatalf("enqueue train tt with batch 1 x accumulate 2: exit %d, %q %q; want it queued", code, out, errOut)
	}
}

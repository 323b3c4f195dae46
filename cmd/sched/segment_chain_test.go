package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
)

// A segment queues the next before the queue records it done; where its
// worker stops answering in between (a SIGKILL), asynq runs it again. Run
// again, it trained on from the run's newest checkpoint and queued a next
// of its own, so that two chains of segments took turns on the run, and
// `sched cancel` of one left the other training. It now finds the segment
// queued after it and trains nothing, saying so. Its second run is stood
// for here by a segment of the run queued from step 0 while the chain is
// under way: it starts after the segment it finds, and takes the same
// path.
func TestASegmentRunAgainAfterItQueuedTheNextTrainsNothing(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	appendRuns(t, env, "chain:\n  from: eta\n  segment:\n    max_steps: 20\n")
	startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "chain"); code != 0 {
		t.Fatalf("enqueue train chain: exit %d: %s%s", code, out, errOut)
	}
	// The chain's second segment running: the first is done.
	waitUntil(t, "the chain's second segment running", func() bool {
		snap, err := q.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range snap.Running() {
			if a, err := scheduler.Decode[scheduler.TrainSegment](ts.Payload); err == nil && ts.Kind == scheduler.KindTrainSegment && a.Run == "chain" && a.FromStep > 0 {
				return true
			}
		}
		return false
	})
	again, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "chain", Tokenizer: "tk"})
	if err != nil {
		t.Fatal(err)
	}
	var ts scheduler.TaskStatus
	waitUntil(t, "the segment run again ended", func() bool {
		ts, err = q.Task(ctx, again.ID)
		return err == nil && (ts.State == "completed" || ts.State == "archived" || ts.State == "retry")
	})
	if ts.State != "completed" || !strings.HasPrefix(ts.Progress.Message, "superseded: run chain goes on with segment ") ||
		!strings.HasSuffix(ts.Progress.Message, "; this segment, run again after its worker stopped answering once it had queued the next, trains nothing") {
		t.Fatalf("the segment run again while its chain went on: %s, %q; want it completed, saying it was superseded and trained nothing", ts.State, ts.Progress.Message)
	}
	// The chain goes on.
	st, _, err := scheduler.ReadRunState(ctx, rdb, "chain")
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the run trained on past the superseded segment", func() bool {
		now, _, err := scheduler.ReadRunState(ctx, rdb, "chain")
		return err == nil && now.Step > st.Step
	})
}

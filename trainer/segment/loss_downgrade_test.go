package segment

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
)

// A segment records beside the loss's step the loss it is the step of
// (scheduler.LossFields): a kiln older than loss_step that goes on with the
// run (a worker downgraded by mistake) writes the loss and the step alone,
// and the state then reads the loss as of the step recorded, not of the
// loss step the newer segment left behind, another loss's.
func TestALossAnOlderKilnWroteIsNotReadAsOfTheNewerSegmentsLossStep(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	run := testRun("downgraded", 100)
	run.LogEvery, run.EvalEvery, run.CheckpointEvery = 3, 3, 6
	run.Segment.MaxSteps = 6
	dir := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: dir, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != 6 {
		t.Fatalf("segment: %+v, %v", out, err)
	}
	if _, err := trainer.CheckCheckpoint(filepath.Join(RunDir(dir, run.Name), trainer.StepDir(6))); err != nil {
		t.Fatal(err)
	}
	st := runState(t, rdb, run.Name)
	if st.Step != 6 || st.LossAt() != 6 || st.Loss == 3.25 {
		t.Fatalf("after the segment: step %d, loss %.4f of step %d; want step 6, its loss", st.Step, st.Loss, st.LossAt())
	}

	// An older kiln trains on to step 12 and writes its loss and step.
	if err := rdb.HSet(ctx, scheduler.RunStateKey(run.Name), "step", "12", "loss", "3.2500").Err(); err != nil {
		t.Fatal(err)
	}
	st = runState(t, rdb, run.Name)
	if st.Step != 12 || st.LossAt() != 12 {
		t.Errorf("after an older kiln's write: step %d, loss %.4f read as of step %d; want it read as of step 12, not the newer segment's loss step 6", st.Step, st.Loss, st.LossAt())
	}
}

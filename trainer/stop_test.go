package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// stopData is sliceData that cancels the run's context from inside one of
// its calls, the way SIGTERM or `sched cancel` lands at an arbitrary point
// of a step: during the nth training read, just after it (while the
// micro-batch computes), during the nth evaluation read, or during the nth
// cursor read (a checkpoint being written reads the cursor).
type stopData struct {
	*sliceData
	cancel                           context.CancelFunc
	onNext, afterNext, onEval, onCur int
	next, eval, cur                  int
}

func (d *stopData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	if d.next++; d.next == d.onNext {
		d.cancel()
	}
	// A read that honours the context as the token-store sampler does.
	if err := ctx.Err(); err != nil {
		return model.Batch{}, err
	}
	batch, err := d.sliceData.Next(ctx, b, t)
	if d.next == d.afterNext {
		d.cancel()
	}
	return batch, err
}

func (d *stopData) Eval(ctx context.Context, i, b, t int) (model.Batch, error) {
	if d.eval++; d.eval == d.onEval {
		d.cancel()
	}
	if err := ctx.Err(); err != nil {
		return model.Batch{}, err
	}
	return d.sliceData.Eval(ctx, i, b, t)
}

func (d *stopData) Cursor() (json.RawMessage, error) {
	if d.cur++; d.cur == d.onCur {
		d.cancel()
	}
	return d.sliceData.Cursor()
}

// A stop, wherever in a step it lands, loses no completed step: the run
// writes the checkpoint of the last completed step and returns the
// cancellation, and resuming from that checkpoint logs exactly the
// uninterrupted run's losses. A step stopped before its last micro-batch's
// data was read is abandoned whole (its data is read again after the
// resume); one whose last micro-batch was computing, whose evaluation was
// running, or whose periodic checkpoint was being written is finished.
func TestAStopAnywhereLosesNoCompletedStep(t *testing.T) {
	requireCPU(t)
	const total = 7
	vocab := model.Presets["tiny"].VocabSize
	run := func() RunConfig { rc := testRun(total); rc.CheckpointEvery = 3; return rc }
	want := map[int]Metrics{}
	if res, got, err := runCollect(t, context.Background(), Config{Run: run(), Out: t.TempDir(), Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil || !res.Done {
		t.Fatalf("uninterrupted run: %+v %v", res, err)
	} else {
		want = got
	}
	// Accumulate is 2: step s reads training batches 2s-1 and 2s. Each
	// step reads the cursor once as it begins, and a checkpoint (every 3
	// steps) once more: steps 1-3 read it 3 times, the checkpoint of step 3
	// is the 4th. Evaluation runs at steps 3 and 6, two batches each, after
	// the one read that checks, before the first step, that the data holds
	// held-out windows.
	cases := []struct {
		name                             string
		onNext, afterNext, onEval, onCur int
		stoppedAt                        int
	}{
		{name: "during the first read of step 5", onNext: 9, stoppedAt: 4},
		{name: "during the first micro-batch of step 5", afterNext: 9, stoppedAt: 4},
		{name: "during the last read of step 5", onNext: 10, stoppedAt: 4},
		{name: "during the last micro-batch of step 5", afterNext: 10, stoppedAt: 5},
		{name: "during the evaluation at step 3", onEval: 2, stoppedAt: 3},
		{name: "during the checkpoint write of step 3", onCur: 4, stoppedAt: 3},
		{name: "as step 2 begins", onCur: 2, stoppedAt: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			d := &stopData{sliceData: newSliceData(vocab, 20000), cancel: cancel, onNext: c.onNext, afterNext: c.afterNext, onEval: c.onEval, onCur: c.onCur}
			res, got, err := runCollect(t, ctx, Config{Run: run(), Out: out, Data: d}, Hooks{})
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("stopped run returned %v; want the cancellation", err)
			}
			if res.Step != c.stoppedAt || filepath.Base(res.Checkpoint) != StepDir(c.stoppedAt) {
				t.Fatalf("stopped at step %d with checkpoint %q; want step %d and its checkpoint", res.Step, res.Checkpoint, c.stoppedAt)
			}
			if _, err := CheckCheckpoint(res.Checkpoint); err != nil {
				t.Fatalf("the stop checkpoint is not complete: %v", err)
			}
			for step := 1; step <= c.stoppedAt; step++ {
				if got[step].LossOr(-1) != want[step].LossOr(-1) {
					t.Errorf("step %d before the stop: loss %v, uninterrupted %v", step, got[step].LossOr(-1), want[step].LossOr(-1))
				}
			}
			res, got, err = runCollect(t, context.Background(), Config{Run: run(), Out: out, Data: newSliceData(vocab, 20000), Resume: true}, Hooks{})
			if err != nil || !res.Done {
				t.Fatalf("resumed run: %+v %v", res, err)
			}
			for step := c.stoppedAt + 1; step <= total; step++ {
				if got[step].LossOr(-1) != want[step].LossOr(-1) || got[step].GradNorm != want[step].GradNorm {
					t.Errorf("step %d after the resume: loss %v, uninterrupted %v", step, got[step].LossOr(-1), want[step].LossOr(-1))
				}
			}
			if len(got) != total-c.stoppedAt {
				t.Errorf("the resumed run logged %d steps, want %d", len(got), total-c.stoppedAt)
			}
		})
	}
}

// A stop during an evaluation gives it up at its next batch, where the
// stop waited for every batch: an evaluation of many batches (eval_batches
// far above the held-out windows, scored again and again) held a stop for
// minutes, past the worker's grace, and the segment was killed with its
// steps since the last checkpoint. The step stands and its checkpoint is
// written; only its held-out loss is not recorded. The last step's
// evaluation, the run's result, is made whole.
func TestAStopDuringAnEvaluationGivesItUp(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	run := testRun(7)
	run.EvalBatches = 1000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Reads: one to check for held-out windows, then step 3's first.
	d := &stopData{sliceData: newSliceData(vocab, 20000), cancel: cancel, onEval: 2}
	res, got, err := runCollect(t, ctx, Config{Run: run, Out: t.TempDir(), Data: d}, Hooks{})
	if !errors.Is(err, context.Canceled) || res.Step != 3 || filepath.Base(res.Checkpoint) != StepDir(3) {
		t.Fatalf("stopped during step 3's evaluation: step %d, checkpoint %q, %v; want step 3, its checkpoint and the cancellation", res.Step, res.Checkpoint, err)
	}
	if d.eval != 2 {
		t.Errorf("the evaluation read %d of its 1000 batches after the stop; want none after the one under way", d.eval-2)
	}
	if m, ok := got[3]; !ok || m.Loss == nil || m.EvalLoss != nil {
		t.Errorf("step 3's line: %+v (logged %v); want its loss, without the held-out loss cut short", m, ok)
	}

	// A stop during the last step's evaluation waits for it.
	last := testRun(3)
	last.EvalBatches = 5
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	d = &stopData{sliceData: newSliceData(vocab, 20000), cancel: cancel, onEval: 2}
	res, got, err = runCollect(t, ctx, Config{Run: last, Out: t.TempDir(), Data: d}, Hooks{})
	if err != nil || !res.Done || d.eval != 6 || got[3].EvalLoss == nil {
		t.Fatalf("stopped during the last step's evaluation: %+v, %v, %d evaluation reads, step 3's line %+v; want the run done with its held-out loss of 5 batches", res, err, d.eval, got[3])
	}
}

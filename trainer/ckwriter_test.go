package trainer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// heldWrite holds the checkpoint write of one step in the writer until the
// run has finished the step after it, and records whether it had.
type heldWrite struct {
	step            int
	entered, freed  chan struct{}
	overlapped      bool
	onNextStep      func()
	hookIncomplete  []string
	hookCalls       []int
	checkpointsSeen map[int]bool
}

func newHeldWrite(step int) *heldWrite {
	return &heldWrite{step: step, entered: make(chan struct{}), freed: make(chan struct{}), checkpointsSeen: map[int]bool{}}
}

// beforeWrite is the trainer's test hook: it runs in the writer. Were the
// write done in line with training, it would hold the loop itself, and the
// step it waits for would never come (go test's timeout reports that).
func (h *heldWrite) beforeWrite(step int) {
	if step == h.step {
		close(h.entered)
		<-h.freed
	}
}

func (h *heldWrite) hooks() Hooks {
	return Hooks{
		Step: func(step, _ int) {
			if step != h.step+1 {
				return
			}
			select {
			case <-h.entered:
				// The write of h.step has begun and is held: this step ran
				// beside it.
				h.overlapped = true
			default:
			}
			if h.onNextStep != nil {
				h.onNextStep()
			}
			close(h.freed)
		},
		Checkpoint: func(_ context.Context, dir string, step int) error {
			h.hookCalls = append(h.hookCalls, step)
			if _, err := ReadCheckpoint(dir, nil); err != nil {
				h.hookIncomplete = append(h.hookIncomplete, err.Error())
			}
			return nil
		},
	}
}

// checkpointFiles is what a checkpoint holds that training decides: the
// weights, the Adam moments and the state, without the run configuration
// (which names the checkpoint interval) and the wall-clock.
func checkpointFiles(t *testing.T, dir string) (State, []byte, []byte) {
	t.Helper()
	st, err := CheckCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(dir, ModelFile))
	if err != nil {
		t.Fatal(err)
	}
	o, err := os.ReadFile(filepath.Join(dir, OptimizerFile))
	if err != nil {
		t.Fatal(err)
	}
	st.Run, st.Files, st.WallClock = RunConfig{}, nil, 0
	return st, w, o
}

func sameCheckpoint(t *testing.T, what, want, have string) {
	t.Helper()
	ws, ww, wo := checkpointFiles(t, want)
	hs, hw, ho := checkpointFiles(t, have)
	if !reflect.DeepEqual(ws, hs) {
		t.Errorf("%s: state %+v, want %+v", what, hs, ws)
	}
	if string(ww) != string(hw) || string(wo) != string(ho) {
		t.Errorf("%s: weights equal %v, Adam moments equal %v; want both bit for bit", what, string(ww) == string(hw), string(wo) == string(ho))
	}
}

// A checkpoint is written while training goes on: the step after it runs
// while its write is held in the writer. What is written is the state of
// the step it was taken after, bit for bit what a run writes when it ends
// there and waits for the write, and training is unchanged by it: the last
// step's checkpoint equals a run's without periodic checkpoints. The hook
// sees every directory complete, in step order, and the Result names a
// complete one.
func TestCheckpointWriteOverlapsTraining(t *testing.T) {
	requireCPU(t)
	const total = 6
	vocab := model.Presets["tiny"].VocabSize
	run := func(every int) RunConfig { rc := testRun(total); rc.CheckpointEvery = every; return rc }

	held := newHeldWrite(2)
	out := t.TempDir()
	cfg := Config{Run: run(2), Out: out, Data: newSliceData(vocab, 20000), beforeWrite: held.beforeWrite}
	res, err := Run(context.Background(), cfg, held.hooks())
	if err != nil || !res.Done {
		t.Fatalf("run: %+v %v", res, err)
	}
	if !held.overlapped {
		t.Fatal("step 3 did not run while the checkpoint of step 2 was being written")
	}
	if !reflect.DeepEqual(held.hookCalls, []int{2, 4, 6}) || len(held.hookIncomplete) > 0 {
		t.Fatalf("hook called for steps %v, with incomplete directories %v; want 2, 4, 6, all complete", held.hookCalls, held.hookIncomplete)
	}
	if _, err := CheckCheckpoint(res.Checkpoint); err != nil || res.Checkpoint != filepath.Join(out, StepDir(total)) {
		t.Fatalf("Result.Checkpoint %s: %v", res.Checkpoint, err)
	}

	// Ended at step 2, waiting for the write, as before writes went beside
	// the steps.
	at2 := t.TempDir()
	if res, err := Run(context.Background(), Config{Run: run(0), Out: at2, Data: newSliceData(vocab, 20000), MaxSteps: 2}, Hooks{}); err != nil || res.Step != 2 {
		t.Fatalf("run to step 2: %+v %v", res, err)
	}
	sameCheckpoint(t, "step 2", filepath.Join(at2, StepDir(2)), filepath.Join(out, StepDir(2)))
	plain := t.TempDir()
	if res, err := Run(context.Background(), Config{Run: run(0), Out: plain, Data: newSliceData(vocab, 20000)}, Hooks{}); err != nil || !res.Done {
		t.Fatalf("run without periodic checkpoints: %+v %v", res, err)
	}
	sameCheckpoint(t, "step 6", filepath.Join(plain, StepDir(total)), filepath.Join(out, StepDir(total)))
}

// A stop that lands while a checkpoint is being written still ends with
// the checkpoint of the last completed step complete before Run returns,
// and the one being written complete too.
func TestStopDuringACheckpointWrite(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(6)
	rc.CheckpointEvery = 2
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := newHeldWrite(2)
	held.onNextStep = cancel
	out := t.TempDir()
	res, err := Run(ctx, Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), beforeWrite: held.beforeWrite}, held.hooks())
	if !errors.Is(err, context.Canceled) || res.Step != 3 || res.Done {
		t.Fatalf("stopped run: %+v %v; want step 3 and the cancellation", res, err)
	}
	if !held.overlapped {
		t.Fatal("step 3 did not run while the checkpoint of step 2 was being written")
	}
	for _, s := range []int{2, 3} {
		if _, err := ReadCheckpoint(filepath.Join(out, StepDir(s)), nil); err != nil {
			t.Errorf("step %d: %v", s, err)
		}
	}
	if res.Checkpoint != filepath.Join(out, StepDir(3)) || !reflect.DeepEqual(held.hookCalls, []int{2, 3}) {
		t.Fatalf("Result.Checkpoint %s, hook calls %v; want step 3's and 2, 3", res.Checkpoint, held.hookCalls)
	}
}

// A failed Checkpoint hook stops the run, as it did when checkpoints were
// written in line: at a step boundary before the next checkpoint, with the
// hook's error, and the Result naming the complete directory it was given.
func TestFailedCheckpointHookStopsTheRun(t *testing.T) {
	requireCPU(t)
	vocab := model.Presets["tiny"].VocabSize
	rc := testRun(8)
	rc.CheckpointEvery = 2
	refused := errors.New("upload refused")
	var calls []int
	out := t.TempDir()
	res, err := Run(context.Background(), Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000)}, Hooks{
		Checkpoint: func(_ context.Context, _ string, step int) error {
			calls = append(calls, step)
			return refused
		},
	})
	if !errors.Is(err, refused) || res.Done || res.Step < 2 || res.Step > 4 {
		t.Fatalf("run: %+v %v; want the hook's error between steps 2 and 4", res, err)
	}
	if !reflect.DeepEqual(calls, []int{2}) || res.Checkpoint != filepath.Join(out, StepDir(2)) {
		t.Fatalf("hook calls %v, Result.Checkpoint %s; want step 2's only", calls, res.Checkpoint)
	}
	if _, err := ReadCheckpoint(res.Checkpoint, nil); err != nil {
		t.Fatal(err)
	}
}

package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/model"
)

// Each checkpoint records the run's wall-clock so far in
// trainer_state.json, its caller's sum over the run's segments where it
// gives one, so that a run whose record in Redis is lost carries the sum on
// from its checkpoint. A call given none carries on from the resumed
// checkpoint's, and a checkpoint written before the wall-clock was
// recorded (no wall_clock_s) resumes as before, from 0.
func TestACheckpointRecordsTheRunsWallClock(t *testing.T) {
	requireCPU(t)
	ctx := context.Background()
	vocab := model.Presets["tiny"].VocabSize
	out := t.TempDir()
	rc := testRun(6)
	rc.CheckpointEvery = 2

	// The run's earlier segments took an hour, as the caller counts them.
	began := time.Now()
	sum := func() time.Duration { return time.Hour + time.Since(began) }
	first := Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), MaxSteps: 2, Wall: sum}
	if res, err := Run(ctx, first, Hooks{}); err != nil || res.Step != 2 {
		t.Fatalf("first call: %+v, %v", res, err)
	}
	at2 := readState(t, filepath.Join(out, StepDir(2)))
	if at2.Wall() < time.Hour || at2.Wall() > sum() {
		t.Fatalf("the checkpoint of step 2 records a wall-clock of %v; want the caller's sum, at least an hour and at most %v", at2.Wall(), sum())
	}

	// Without a sum of its caller's (sched train --resume).
	second := Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), Resume: true, MaxSteps: 2}
	if res, err := Run(ctx, second, Hooks{}); err != nil || res.Step != 4 {
		t.Fatalf("second call: %+v, %v", res, err)
	}
	if at4 := readState(t, filepath.Join(out, StepDir(4))); at4.Wall() <= at2.Wall() {
		t.Fatalf("the checkpoint of step 4 records a wall-clock of %v; want more than the %v the checkpoint it resumed from recorded", at4.Wall(), at2.Wall())
	}

	// A checkpoint of a kiln that recorded no wall-clock.
	dir4 := filepath.Join(out, StepDir(4))
	b, err := os.ReadFile(filepath.Join(dir4, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	if _, ok := fields["wall_clock_s"]; !ok {
		t.Fatalf("%s has no wall_clock_s: %s", StateFile, b)
	}
	delete(fields, "wall_clock_s")
	if b, err = json.Marshal(fields); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir4, StateFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	third := Config{Run: rc, Out: out, Data: newSliceData(vocab, 20000), Resume: true}
	res, err := Run(ctx, third, Hooks{})
	if err != nil || !res.Done || res.Step != 6 {
		t.Fatalf("resume from a checkpoint without a wall-clock: %+v, %v", res, err)
	}
	if at6 := readState(t, filepath.Join(out, StepDir(6))); at6.Wall() >= at2.Wall() {
		t.Fatalf("the checkpoint of step 6 records a wall-clock of %v; want this call's alone, from the 0 of a checkpoint that recorded none", at6.Wall())
	}

	// A negative one no run writes: damaged, as a negative step is.
	editState(t, dir4, "wall_clock_s", -5)
	if _, err := CheckCheckpoint(dir4); !errors.Is(err, ErrDamaged) || !strings.Contains(err.Error(), "a wall-clock of -5s") {
		t.Fatalf("a checkpoint that records a wall-clock of -5s: %v; want it damaged, saying so", err)
	}
}

func readState(t *testing.T, dir string) State {
	t.Helper()
	st, err := VerifyCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

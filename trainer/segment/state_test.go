package segment

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
)

func TestReadRunStatesAfterASegment(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("st", 6)
	run.Segment.MaxSteps = 4
	run.EvalEvery, run.EvalBatches = 0, 0 // no evaluation writes the state at step 4
	var seen losses
	if _, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", Progress: seen.hook}); err != nil {
		t.Fatal(err)
	}
	states, err := scheduler.ReadRunStates(ctx, rdb)
	if err != nil || len(states) != 1 {
		t.Fatalf("states %+v %v", states, err)
	}
	s := states[0]
	if s.Run != "st" || s.Step != 4 || s.Total != 6 || s.Checkpoint != 4 || s.Done || s.Worker != "gpu-a" || s.CheckpointAt.IsZero() || s.Wall <= 0 {
		t.Fatalf("state %+v", s)
	}
	// The loss beside the last step is that step's, though the state's
	// writes are spaced a second apart and the segment took less.
	if want := math.Round(seen.m[4]*1e4) / 1e4; s.Loss != want {
		t.Errorf("state's loss %v at step 4, the step's logged loss %v", s.Loss, want)
	}
	line := s.String()
	for _, want := range []string{"st: step 4/6", "last checkpoint step 4", "(worker gpu-a)"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
}

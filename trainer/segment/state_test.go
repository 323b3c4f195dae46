package segment

import (
	"context"
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
	if _, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil {
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
	line := s.String()
	for _, want := range []string{"st: step 4/6", "last checkpoint step 4", "(worker gpu-a)"} {
		if !strings.Contains(line, want) {
			t.Errorf("%q lacks %q", line, want)
		}
	}
}

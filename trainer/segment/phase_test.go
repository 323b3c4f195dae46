package segment

import (
	"context"
	"testing"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
)

// A segment that begins after one stopped in the run's last phase (its
// worker killed as the run's last checkpoint uploaded) clears that phase
// from the run's state at its start: `sched status` would say of it that
// its training is over for as long as its restore took (a checkpoint's
// pull) and until its first step's record. Its own end clears the phase
// it records.
func TestASegmentClearsTheLastPhaseOfOneThatStoppedInIt(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	const name = "stale"
	if err := rdb.HSet(ctx, scheduler.RunStateKey(name), "step", "4", "total", "4", "phase", scheduler.PhaseUpload).Err(); err != nil {
		t.Fatal(err)
	}
	var before string
	var read error
	out, err := Run(ctx, Params{Run: testRun(name, 4), Dir: t.TempDir(), Redis: rdb, Owner: "gpu-a",
		OpenData: func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error) {
			// Its restore is over, and no step is taken yet.
			before, read = rdb.HGet(ctx, scheduler.RunStateKey(name), "phase").Result()
			return openStream(rc, mc)
		}})
	if err != nil || !out.Done {
		t.Fatalf("the segment: %+v, %v; want the run done", out, err)
	}
	if read != nil || before != "" {
		t.Errorf("the run's phase before the segment's first step: %q, %v; want none", before, read)
	}
	if st, _, err := scheduler.ReadRunState(ctx, rdb, name); err != nil || !st.Done || st.Phase != "" {
		t.Errorf("the run's state at its end: %+v, %v; want it done, with no phase", st, err)
	}
}

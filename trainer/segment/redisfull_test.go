package segment

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/redismem"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
)

// Redis that refuses writes because it is full (maxmemory reached, under
// noeviction) as a checkpoint's marker is written takes no record of the
// checkpoint in the run's state; object storage took it all the same.
// The words say so: the checkpoint uploaded and its state not recorded,
// saying what Redis answered, never that the upload failed or that object
// storage did not take the segment's uploads. The checkpoint counts as
// uploaded, and the next segment, once Redis has room, records it at its
// start.
func TestACheckpointWhoseStateRedisRefusesIsUploadedAndSaysSo(t *testing.T) {
	ctx := context.Background()
	through, faults, direct := faultyS3(t)
	rdb := newRedis(t)
	const name = "full"
	run := testRun(name, 1_000_000)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	// Redis is full from the moment step 4's marker goes to object storage:
	// the lease was checked before it, and the state write after it is
	// refused.
	marker := faults.Add(testsvc.Fault{Method: "PUT", Path: checkpointKey(name, 4) + MarkerFile, Action: testsvc.Hold, Count: 1})
	full := make(chan error, 1)
	go func() {
		<-marker.Held
		full <- rdb.ConfigSet(ctx, "maxmemory", "1").Err()
		close(marker.Release)
	}()
	core, logs := observer.New(zap.InfoLevel)
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a", Log: zap.New(core)})
	if err := <-full; err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err != nil || out.Step != 4 || out.Uploaded != 4 {
		t.Fatalf("segment with Redis full at its last checkpoint: %+v, %v; want step 4 uploaded and the run going on", out, err)
	}
	if steps, err := RemoteSteps(ctx, direct, name); err != nil || len(steps) == 0 || steps[len(steps)-1] != 4 {
		t.Fatalf("checkpoints in object storage: %v, %v; want step 4 the newest", steps, err)
	}
	for _, wrong := range []string{"checkpoint upload failed", "object storage did not take"} {
		if l := logs.FilterMessageSnippet(wrong).All(); len(l) > 0 {
			t.Errorf("logged %q: %+v; object storage took every upload", wrong, l)
		}
	}
	refused := func(what, msg string) {
		t.Helper()
		l := logs.FilterMessageSnippet(msg).All()
		if len(l) != 1 {
			t.Errorf("%s: logged %d times, want once: %q; the log: %+v", what, len(l), msg, logs.All())
			return
		}
		fields := l[0].ContextMap()
		why, _ := fields["redis"].(string)
		if fields["step"] != int64(4) || !redismem.Refused(errors.New(why)) {
			t.Errorf("%s: %+v; want step 4 and Redis's refusal", what, fields)
		}
	}
	refused("the checkpoint's line", "checkpoint uploaded, but the run's state in Redis could not record it")
	refused("the segment's last word", "this segment's last checkpoint is in object storage, but the run's state in Redis could not record it")

	// Redis has room again: the next segment records step 4 at its start.
	var at5 scheduler.RunState
	var read error
	run.Segment.MaxSteps = 2
	out, err = Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: direct, OpenData: openStream, Owner: "gpu-a",
		Progress: func(step, total int, m *trainer.Metrics) {
			if step == 5 && m == nil {
				at5, _, read = scheduler.ReadRunState(ctx, rdb, name)
			}
		}})
	if err != nil || out.ResumedFrom != 4 || read != nil || at5.Checkpoint != 4 {
		t.Fatalf("the next segment: %+v, %v; the run's state at its first step: %+v, %v; want checkpoint 4 recorded", out, err, at5, read)
	}
}

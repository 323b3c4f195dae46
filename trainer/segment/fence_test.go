package segment

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
)

// Redis that lost its data (restarted without its append-only file, or
// flushed) counts the run's fencing tokens from 1 again, below the tokens
// the run's checkpoints in object storage were marked complete with. A
// segment that trains again a step object storage holds (its copy there
// damaged) marks it complete all the same, its lease holding: the upload
// was refused as "run lock lost: the holder of fencing token 3 marked it
// complete, this one holds 1", though no other worker held the run, and
// the damaged copy stayed the only one.
func TestAfterRedisLostItsDataAStepTrainedAgainIsUploaded(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("fence", 8)
	run.Segment.MaxSteps = 2
	disk := t.TempDir()
	for want := 2; want <= 6; want += 2 {
		if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != want || out.Uploaded != want {
			t.Fatalf("segment to step %d: %+v %v", want, out, err)
		}
	}
	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	spoilObject(t, ctx, obj, checkpointKey("fence", 6)+trainer.ModelFile)
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
	if err != nil || out.ResumedFrom != 4 || out.Step != 6 || out.Uploaded != 6 {
		t.Fatalf("the segment after Redis lost its data: %+v %v; want it resumed from step 4 and step 6 uploaded", out, err)
	}
	passed := 0
	if _, step, err := PullNewest(ctx, obj, "fence", -1, t.TempDir(), func(int, error) { passed++ }); err != nil || step != 6 || passed != 0 {
		t.Fatalf("object storage's newest: step %d (%v, %d passed over); want step 6, whole again", step, err, passed)
	}
}

// A holder whose lease another worker took over (it froze past it) does
// not mark complete a checkpoint the newer holder marked: its push is
// refused as the run lock lost, and the newer holder's marker stays.
func TestAStaleHolderDoesNotMarkOverTheNewerOnes(t *testing.T) {
	ctx, rdb, obj, _ := uploadedToStep4(t, "stale", 8)
	dir, step, err := PullNewest(ctx, obj, "stale", -1, t.TempDir(), func(int, error) {})
	if err != nil || step != 4 {
		t.Fatalf("pull: step %d, %v", step, err)
	}
	stale, err := scheduler.AcquireRun(ctx, rdb, "stale", "gpu-a", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Release(ctx)
	// Its lease lapsed (the key gone as if expired) and gpu-b took the run.
	if err := rdb.Del(ctx, scheduler.RunLockKey("stale")).Err(); err != nil {
		t.Fatal(err)
	}
	newer, err := scheduler.AcquireRun(ctx, rdb, "stale", "gpu-b", time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer newer.Release(ctx)
	if m, err := Push(ctx, obj, newer, "stale", dir); err != nil || m.Token != newer.Token() {
		t.Fatalf("the newer holder's push: %+v %v", m, err)
	}
	if _, err := Push(ctx, obj, stale, "stale", dir); !errors.Is(err, scheduler.ErrRunLockLost) {
		t.Fatalf("the stale holder's push: %v; want it refused as the run lock lost", err)
	}
	var m Marker
	if err := getJSON(ctx, obj, checkpointKey("stale", 4)+MarkerFile, &m); err != nil || m.Token != newer.Token() {
		t.Fatalf("the marker after the stale push: %+v %v; want the newer holder's token %d", m, err, newer.Token())
	}
}

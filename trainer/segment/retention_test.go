package segment

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/redis/go-redis/v9"
)

// uploadedToStep4 trains a first segment of a run of total steps to step
// 4, checkpointed and uploaded at steps 2 and 4, with real Redis and S3.
func uploadedToStep4(t *testing.T, name string, total int) (context.Context, *redis.Client, Objects, runs.Run) {
	t.Helper()
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun(name, total)
	run.Segment.MaxSteps = 4
	if out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	return ctx, rdb, obj, run
}

// A run whose every checkpoint in object storage is damaged, on a worker
// whose disk holds none (a new machine), is not trained from step 0 over
// its history: the segment stops for good saying how to go on, and
// nothing in object storage changes. Once the damaged checkpoints are
// deleted, as the error says, the run starts over.
func TestEveryCheckpointDamagedInObjectStorageStopsTheSegment(t *testing.T) {
	ctx, rdb, obj, run := uploadedToStep4(t, "spoilt", 8)
	steps, _ := RemoteSteps(ctx, obj, "spoilt")
	if !reflect.DeepEqual(steps, []int{2, 4}) {
		t.Fatalf("object storage holds %v, want steps 2 and 4", steps)
	}
	for _, s := range steps {
		spoilObject(t, ctx, obj, checkpointKey("spoilt", s)+trainer.ModelFile)
	}
	metrics := readObject(t, ctx, obj, ResultsPrefix("spoilt")+results.MetricsFile)
	before, _, _ := scheduler.ReadRunState(ctx, rdb, "spoilt")

	disk := t.TempDir()
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() ||
		!strings.Contains(err.Error(), "no checkpoint of it in object storage downloaded intact (steps [2 4]") ||
		!strings.Contains(err.Error(), "Before deleting anything, check the stored copies") ||
		!strings.Contains(err.Error(), "delete "+CheckpointPrefix("spoilt")+" in object storage") {
		t.Fatalf("a segment on a new disk: %+v, %v; want it stopped for good, saying how to go on", out, err)
	}
	if got := readObject(t, ctx, obj, ResultsPrefix("spoilt")+results.MetricsFile); !bytes.Equal(got, metrics) {
		t.Errorf("the run's metrics in object storage changed: %d bytes, were %d", len(got), len(metrics))
	}
	if after, _ := RemoteSteps(ctx, obj, "spoilt"); !reflect.DeepEqual(after, steps) {
		t.Errorf("object storage holds %v after the refusal, held %v", after, steps)
	}
	if st, _, _ := scheduler.ReadRunState(ctx, rdb, "spoilt"); st.Checkpoint != before.Checkpoint || st.Step != before.Step {
		t.Errorf("the run's state went from checkpoint %d step %d to %d, %d", before.Checkpoint, before.Step, st.Checkpoint, st.Step)
	}

	// As the error says: delete them, and the run starts over.
	objs, err := obj.List(ctx, CheckpointPrefix("spoilt"))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if err := obj.Delete(ctx, o.Key); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"}); err != nil || out.ResumeSource != "" || out.Step != 4 {
		t.Fatalf("after the damaged checkpoints were deleted: %+v %v; want the run started over", out, err)
	}
}

// A damaged checkpoint newer than the one a segment resumed from counts
// for nothing in retention: with keep_last 1, the segment's own upload is
// the one kept, not the damaged one, and object storage still holds a
// checkpoint a lost disk resumes from. The run's state records the
// upload.
func TestRetentionNeverKeepsADamagedCheckpointInPlaceOfAGoodOne(t *testing.T) {
	ctx, rdb, obj, run := uploadedToStep4(t, "kept", 100)
	spoilObject(t, ctx, obj, checkpointKey("kept", 4)+trainer.ModelFile)
	run.Retention = runs.Retention{KeepLast: 1}
	run.Segment.MaxSteps = 1 // from step 2 to step 3, off the checkpoint grid
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
	if err != nil || out.ResumedFrom != 2 || out.Step != 3 || out.Uploaded != 3 {
		t.Fatalf("second segment: %+v %v; want it resumed from step 2 and step 3 uploaded", out, err)
	}
	if steps, _ := RemoteSteps(ctx, obj, "kept"); !reflect.DeepEqual(steps, []int{3, 4}) {
		t.Errorf("object storage holds %v; want step 3 kept and the damaged step 4 left alone", steps)
	}
	if _, step, err := PullNewest(ctx, obj, "kept", -1, t.TempDir(), func(int, error) {}); err != nil || step != 3 {
		t.Errorf("a lost disk resumes from step %d (%v); want 3", step, err)
	}
	if st, _, _ := scheduler.ReadRunState(ctx, rdb, "kept"); st.Checkpoint != 3 {
		t.Errorf("the run's state records checkpoint %d; want 3", st.Checkpoint)
	}
}

// A checkpoint whose marker is damaged (cut short where it was written)
// is left in object storage by retention, which cannot tell whether it is
// kept for good, and the others are pruned as ever: retention stopped at
// it, and object storage grew from then on.
func TestRetentionPassesOverACheckpointWhoseMarkerIsDamaged(t *testing.T) {
	ctx, _, obj, _ := uploadedToStep4(t, "cut", 100)
	key := checkpointKey("cut", 2) + MarkerFile
	marker := readObject(t, ctx, obj, key)
	putObject(t, ctx, obj, key, marker[:len(marker)/2])
	if deleted, err := Prune(ctx, obj, "cut", 4, 2, 1, 0); err != nil || len(deleted) != 0 {
		t.Fatalf("prune: deleted %v, %v; want nothing deleted and no error", deleted, err)
	}
	if got := readObject(t, ctx, obj, key); !bytes.Equal(got, marker[:len(marker)/2]) {
		t.Fatalf("the damaged marker was changed: %q", got)
	}
	if _, err := obj.Stat(ctx, checkpointKey("cut", 2)+trainer.ModelFile); err != nil {
		t.Fatalf("the checkpoint of the damaged marker lost its weights: %v", err)
	}
}

// A checkpoint retention keeps for good that reached object storage only
// after a newer one (the earlier segment ended before its upload) leaves
// the run's state at the newest: a worker that resumes during an outage
// is held to that one, and the results stay the newest's.
func TestAnOlderCheckpointUploadedLateLeavesTheRunStateAtTheNewest(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	disk := t.TempDir()
	run := testRun("late", 4)
	run.Retention = runs.Retention{KeepLast: 2, KeepEvery: 1}
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || !out.Done {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	// Step 2 never reached object storage: its upload was cut off before
	// the marker.
	if err := obj.Delete(ctx, checkpointKey("late", 2)+MarkerFile); err != nil {
		t.Fatal(err)
	}
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	if err != nil {
		t.Fatalf("second segment: %+v %v", out, err)
	}
	if steps, _ := RemoteSteps(ctx, obj, "late"); !reflect.DeepEqual(steps, []int{2, 4}) {
		t.Fatalf("object storage holds %v; want step 2 uploaded late beside 4", steps)
	}
	if st, _, _ := scheduler.ReadRunState(ctx, rdb, "late"); st.Checkpoint != 4 {
		t.Errorf("the run's state records checkpoint %d after step 2's late upload; want 4, the newest", st.Checkpoint)
	}
}

// A checkpoint's marker says whether retention keeps it for good, as
// decided when it was written: a checkpoint_every changed since then does
// not make it prunable.
func TestPruneKeepsWhatItsMarkerSaysIsKept(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	root := t.TempDir()
	for _, s := range []int{10, 20, 30, 40} {
		if _, err := push(ctx, obj, nil, "r", writeTestCheckpoint(t, root, s), s == 20); err != nil {
			t.Fatal(err)
		}
	}
	// keep_every 2 at checkpoint_every 10 kept step 20; at 20 it would not.
	deleted, err := Prune(ctx, obj, "r", 40, 20, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(deleted, []int{10, 30}) {
		t.Errorf("deleted %v, want 10 and 30", deleted)
	}
	if steps, _ := RemoteSteps(ctx, obj, "r"); !reflect.DeepEqual(steps, []int{20, 40}) {
		t.Errorf("kept %v, want 20 (its marker says kept) and 40 (the last)", steps)
	}
}

// A local checkpoint damaged after it was written, its sizes intact, is
// never marked complete in object storage, where it would count as the
// newest and push a good one out.
func TestPushRefusesACheckpointDamagedOnThisDisk(t *testing.T) {
	ctx := context.Background()
	obj, _ := newS3(t)
	dir := writeTestCheckpoint(t, t.TempDir(), 10)
	flip(t, filepath.Join(dir, trainer.ModelFile))
	_, err := Push(ctx, obj, nil, "r", dir)
	if !errors.Is(err, trainer.ErrDamaged) || !strings.Contains(err.Error(), "not marking it complete") || !strings.Contains(err.Error(), trainer.ModelFile) {
		t.Fatalf("push of a damaged checkpoint: %v; want it refused, naming the file", err)
	}
	if steps, _ := RemoteSteps(ctx, obj, "r"); len(steps) != 0 {
		t.Errorf("object storage marks %v complete", steps)
	}
}

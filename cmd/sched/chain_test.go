package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// A run whose later segment was cancelled and that is enqueued again is
// one chain, shown as training: the new segment starts from the run's
// checkpoint (its own task, not the first segment's, long completed), so
// `sched status` reads the run as training, not as the cancelled segment;
// and `sched retry` of an old segment while the run trains queues nothing.
func TestARunEnqueuedAgainIsOneChainShownAsTraining(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	// A run of short segments, so that the chain moves past its first.
	appendRuns(t, env, "chain:\n  from: eta\n  segment: {max_steps: 20}\n")
	startWorker(t, env, "--queues", "gpu=1")

	out, errOut, code := sched(t, env, "enqueue", "train", "chain")
	first := regexp.MustCompile(`queued (train:segment:\S+)`).FindStringSubmatch(out)
	if code != 0 || first == nil {
		t.Fatalf("enqueue train chain: exit %d: %s%s", code, out, errOut)
	}

	// Cancel a running segment past the first; one that completes between
	// being found and the cancel is passed over for the next.
	var cancelled string
	for deadline := time.Now().Add(3 * time.Minute); cancelled == ""; {
		if time.Now().After(deadline) {
			t.Fatal("no segment of run chain past its first was found running to cancel")
		}
		snap, err := q.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, ts := range snap.Running() {
			a, err := scheduler.DecodeTask[scheduler.TrainSegment](ts.Payload)
			if ts.Kind != scheduler.KindTrainSegment || err != nil || a.FromStep == 0 {
				continue
			}
			if state, err := q.Cancel(ctx, ts.ID); err == nil && (state == "cancelled" || state == "cancelling") {
				cancelled = ts.ID
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	waitOutput(t, env, regexp.MustCompile(`(?m)^chain  cancelled  `), time.Minute, "status")
	st, ok, err := scheduler.ReadRunState(ctx, rdb, "chain")
	if err != nil || !ok || st.Checkpoint <= 0 {
		t.Fatalf("run state after the cancel: %+v, %v, %v; want a checkpoint", st, ok, err)
	}

	out, errOut, code = sched(t, env, "enqueue", "train", "chain")
	if code != 0 || !strings.Contains(out, "queued train:segment:") || strings.Contains(out, "it had completed") {
		t.Fatalf("enqueue train chain again: exit %d: %s%s; want a segment queued from the checkpoint", code, out, errOut)
	}
	waitOutput(t, env, regexp.MustCompile(`(?m)^chain  training  `), time.Minute, "status")
	runTask := func() scheduler.RunTask {
		snap, err := q.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return snap.RunTasks()["chain"]
	}
	if rt := runTask(); rt.Task.ID == first[1] {
		t.Errorf("run chain's newest segment is its first, %s: the enqueue queued it again instead of one from step %d", rt.Task.ID, st.Checkpoint)
	}

	// The first segment, completed long ago, retried: nothing queued.
	out, errOut, code = sched(t, env, "retry", first[1])
	if code != 0 || !strings.Contains(out, "run chain is already") || !strings.Contains(out, "nothing queued") {
		t.Fatalf("retry %s while the run trains: exit %d: %s%s", first[1], code, out, errOut)
	}
	snap, err := q.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	live := 0
	for _, ts := range snap.Tasks {
		a, err := scheduler.DecodeTask[scheduler.TrainSegment](ts.Payload)
		if ts.Kind == scheduler.KindTrainSegment && err == nil && a.Run == "chain" && ts.State != "completed" && ts.State != "archived" {
			live++
		}
	}
	if live != 1 {
		t.Errorf("%d live segments of run chain after the retry; a run is one chain", live)
	}
}

// After Redis lost its data (the run's state with it), enqueuing the run
// again names the newest checkpoint in object storage as its starting
// step, as operations.md says, not step 0 and the first segment's id.
func TestARunEnqueuedAfterRedisLostItsDataStartsFromObjectStorage(t *testing.T) {
	t.Parallel()
	env, rdb, _ := trainingSetup(t)
	ctx := context.Background()
	appendRuns(t, env, "lost:\n  from: eta\n  segment: {max_steps: 20}\n")
	w := startWorker(t, env, "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "lost"); code != 0 {
		t.Fatalf("enqueue train lost: exit %d: %s%s", code, out, errOut)
	}
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if st, ok, err := scheduler.ReadRunState(ctx, rdb, "lost"); err == nil && ok && st.Checkpoint >= 40 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("run lost did not upload a checkpoint of step 40 or later")
		}
	}
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = w.Wait()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	objects, err := store.NewLocal(filepath.Join(envValue(env, "KILN_DATA_DIR"), "objects"))
	if err != nil {
		t.Fatal(err)
	}
	steps, err := segment.RemoteSteps(ctx, objects, "lost")
	if err != nil || len(steps) == 0 {
		t.Fatalf("checkpoints of run lost in object storage: %v, %v", steps, err)
	}
	newest := steps[len(steps)-1]
	out, errOut, code := sched(t, env, "enqueue", "train", "lost")
	// A segment stopped as Redis lost its data may hold a newer checkpoint
	// on the GPU worker's disk, which the worker resumes from: said so, in
	// the one line that gives the step.
	want := regexp.MustCompile(fmt.Sprintf(`^queued train:segment:\S+ on gpu; the run resumes from its last checkpoint \(step %d, the newest in object storage, or a newer one where the GPU worker's disk holds one: Redis holds no record of the run, .*\)\n$`, newest))
	if code != 0 || !want.MatchString(out) {
		t.Fatalf("enqueue train lost after Redis lost its data: exit %d: %q%s; want it queued from step %d, or a newer one on the worker's disk", code, out, errOut, newest)
	}
}

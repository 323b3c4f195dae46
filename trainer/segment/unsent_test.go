package segment

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
)

// runState reads run's state as `sched status` does.
func runState(t *testing.T, rdb *redis.Client, run string) scheduler.RunState {
	t.Helper()
	st, _, err := scheduler.ReadRunState(context.Background(), rdb, run)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// trainInBackground runs a segment of p until the test stops it (stop);
// stop returns its error.
func trainInBackground(t *testing.T, p Params) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() {
		_, err := Run(ctx, p)
		ended <- err
	}()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-ended
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// While object storage refuses the run's checkpoints (503 on every put),
// training goes on and the run's state records it: since when, the
// newest checkpoint on this worker's disk only, which worker, the store
// and its error in a few words, which `sched status` shows beside the
// last checkpoint uploaded, where it read as a healthy run while every
// checkpoint after that one had a single copy. The record follows the
// newest checkpoint, keeping its first time, and the upload that next
// succeeds clears it.
func TestCheckpointsObjectStorageRefusesAreRecordedInTheRunsState(t *testing.T) {
	rdb := newRedis(t)
	through, faults, _ := faultyS3(t)
	run := testRun("refused", 1_000_000)
	core, logs := observer.New(zap.InfoLevel)
	stop := trainInBackground(t, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a", Log: zap.New(core)})
	waitFor(t, "a checkpoint uploaded and recorded", func() bool { return runState(t, rdb, run.Name).Checkpoint >= 2 })

	faults.Add(testsvc.Fault{Method: "PUT", Path: CheckpointPrefix(run.Name), Action: testsvc.Status, Code: 503})
	var st scheduler.RunState
	waitFor(t, "the run's state recording the checkpoints object storage refuses", func() bool {
		st = runState(t, rdb, run.Name)
		return !st.Unsent.Since.IsZero()
	})
	u := st.Unsent
	if u.Newest <= st.Checkpoint || u.Worker != "gpu-a" || u.Store != describe(through) || u.Err != "put: 503 SlowDown: injected by the test" {
		t.Errorf("the state records %+v beside checkpoint %d; want a newer step on gpu-a's disk, the store %s and its 503 in a few words", u, st.Checkpoint, describe(through))
	}
	want := fmt.Sprintf("checkpoints after step %d (newest: step %d) are on gpu-a's disk only: object storage at %s has not taken them since %s (put: 503 SlowDown: injected by the test)",
		st.Checkpoint, u.Newest, describe(through), u.Since.UTC().Format(time.RFC3339))
	if note := st.UnsentNote(); note != want {
		t.Errorf("note %q\nwant %q", note, want)
	}
	if n := len(logs.FilterMessageSnippet("checkpoint upload failed").FilterField(zap.String("endpoint", describe(through))).All()); n == 0 {
		t.Error("no failed upload logged naming the store")
	}

	// The next failure records its newer checkpoint, since the first.
	waitFor(t, "a newer checkpoint recorded as on this disk only", func() bool {
		st = runState(t, rdb, run.Name)
		return st.Unsent.Newest > u.Newest
	})
	if !st.Unsent.Since.Equal(u.Since) {
		t.Errorf("since %v after a second failure; want the first's, %v", st.Unsent.Since, u.Since)
	}

	faults.Clear()
	waitFor(t, "the record cleared once an upload succeeds", func() bool {
		st = runState(t, rdb, run.Name)
		return st.Unsent.Since.IsZero()
	})
	if st.Checkpoint <= u.Newest-2 || st.UnsentNote() != "" {
		t.Errorf("after the store takes a checkpoint again: checkpoint %d, note %q; want a checkpoint as new as the ones refused, and no note", st.Checkpoint, st.UnsentNote())
	}
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// A store that holds a checkpoint's upload (it hangs) is recorded as one
// that refuses them is, once the upload is slow (SlowUpload): its error
// says how long the upload has gone on. It is cleared once the upload
// goes through.
func TestACheckpointUploadThatHangsIsRecordedInTheRunsState(t *testing.T) {
	rdb := newRedis(t)
	through, faults, _ := faultyS3(t)
	run := testRun("held", 1_000_000)
	stop := trainInBackground(t, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: through, OpenData: openStream, Owner: "gpu-a",
		SlowUpload: 20 * time.Millisecond})
	waitFor(t, "a checkpoint uploaded and recorded", func() bool { return runState(t, rdb, run.Name).Checkpoint >= 2 })

	held := faults.Add(testsvc.Fault{Method: "PUT", Path: CheckpointPrefix(run.Name), Action: testsvc.Hold})
	select {
	case <-held.Held:
	case <-time.After(3 * time.Minute): // for an upload that never comes
		t.Fatal("no checkpoint upload held within 3 minutes")
	}
	var st scheduler.RunState
	waitFor(t, "the run's state recording the held upload", func() bool {
		st = runState(t, rdb, run.Name)
		return !st.Unsent.Since.IsZero() && st.Unsent.Newest > st.Checkpoint
	})
	if !strings.Contains(st.Unsent.Err, "the upload of step ") || !strings.Contains(st.Unsent.Err, " has gone on for ") || st.Unsent.Store != describe(through) {
		t.Errorf("the state records %+v; want the held upload's step and time, and the store %s", st.Unsent, describe(through))
	}
	if note := st.UnsentNote(); !strings.Contains(note, "are on gpu-a's disk only: object storage at "+describe(through)+" has not taken them since ") {
		t.Errorf("note %q", note)
	}

	faults.Clear()
	waitFor(t, "the record cleared once the upload goes through", func() bool { return runState(t, rdb, run.Name).Unsent.Since.IsZero() })
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// Redis down while a checkpoint uploads: every write of it to object
// storage waits for Redis to confirm the run's lease, and that failure is
// logged as Redis's, naming its error, not as an upload that object
// storage failed, naming the store's endpoint. Nothing is recorded of
// object storage in the run's state.
func TestACheckpointNotUploadedForRedisIsNotLoggedAsTheStoresFailure(t *testing.T) {
	rs, rdb, obj := stoppableRedis(t)
	run := testRun("redis-fence", 1_000_000)
	core, logs := observer.New(zap.InfoLevel)
	var once sync.Once
	stop := trainInBackground(t, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a",
		LockTTL: time.Hour, Log: zap.New(core), // the lease outlasts any outage this test makes
		Progress: func(step, total int, m *trainer.Metrics) {
			if m != nil && step == 3 {
				once.Do(rs.Stop)
			}
		}})
	notUploaded := func() []observer.LoggedEntry {
		return logs.FilterMessageSnippet("checkpoint not uploaded: every write of a checkpoint to object storage waits for Redis").All()
	}
	waitFor(t, "a checkpoint not uploaded for Redis logged", func() bool { return len(notUploaded()) > 0 })
	e := notUploaded()[0]
	if e.Level != zap.WarnLevel || !strings.Contains(fmt.Sprint(e.ContextMap()["redis"]), "fenced write for run redis-fence") {
		t.Errorf("logged %v %q %v; want a warning with Redis's error", e.Level, e.Message, e.ContextMap())
	}
	if _, ok := e.ContextMap()["endpoint"]; ok {
		t.Errorf("logged %v; want no object store named", e.ContextMap())
	}
	if failed := logs.FilterMessageSnippet("checkpoint upload failed").All(); len(failed) > 0 {
		t.Errorf("logged %q %v; want no upload failure of object storage while Redis is what failed", failed[0].Message, failed[0].ContextMap())
	}

	rs.Start()
	waitFor(t, "the client reaching Redis again", func() bool { return rdb.Ping(context.Background()).Err() == nil })
	if err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if st := runState(t, rdb, run.Name); !st.Unsent.Since.IsZero() {
		t.Errorf("the state records %+v of object storage, which failed nothing", st.Unsent)
	}
}

// A segment whose training diverges leaves the run at its last good
// checkpoint: the run's state records that step, its tokens and its loss
// (the checkpoint's), as its results, its metrics and the resume do. It
// recorded the step trained after the checkpoint, which nothing kept,
// beside the loss of the step logged before it.
func TestADivergedSegmentLeavesTheRunAtItsLastGoodCheckpoint(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	run := testRun("diverged", 100)
	// Step 5, trained after the checkpoint of step 4, is not logged; the
	// lr that makes step 5's update diverge shows at step 6.
	run.LogEvery, run.EvalEvery, run.CheckpointEvery = 4, 4, 4
	run.Segment.MaxSteps = 4
	dir := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: dir, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != 4 {
		t.Fatalf("first segment: %+v, %v", out, err)
	}
	ck, err := trainer.CheckCheckpoint(filepath.Join(RunDir(dir, run.Name), trainer.StepDir(4)))
	if err != nil {
		t.Fatal(err)
	}

	run.LR = 1e6
	out, err := Run(ctx, Params{Run: run, Dir: dir, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	var nf *trainer.NonFiniteError
	if !errors.As(err, &nf) || nf.Step <= 5 {
		t.Fatalf("second segment: %+v, %v; want it to diverge after step 5", out, err)
	}
	st := runState(t, rdb, run.Name)
	want := fmt.Sprintf("%.4f", ck.Loss)
	if st.Step != 4 || st.Tokens != ck.Tokens || fmt.Sprintf("%.4f", st.Loss) != want || st.LossAt() != 4 || out.Step != 4 {
		t.Errorf("after diverging at step %d: state step %d, tokens %d, loss %.4f of step %d, outcome step %d; want step 4, %d tokens, loss %s of step 4 (the last good checkpoint's)",
			nf.Step, st.Step, st.Tokens, st.Loss, st.LossAt(), out.Step, ck.Tokens, want)
	}
}

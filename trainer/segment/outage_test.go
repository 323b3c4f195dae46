package segment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/results/tfevents"
	"github.com/kiln-lm/kiln/trainer/runs"
)

// waitFor polls cond until it holds. Its bound, minutes, is for a
// condition that would never hold: what these tests wait for takes
// seconds on a loaded 2-vCPU machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 3 minutes", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stoppableS3 is kiln's S3 store on a real versitygw that hang stops
// (SIGSTOP: connections are accepted and never answered) and resume
// continues. The store would wait an hour for the stopped server: nothing
// relies on its timeouts.
func stoppableS3(t *testing.T) (obj store.Store, srv *testsvc.S3Server, hang, resume func()) {
	t.Helper()
	srv = testsvc.S3(t)
	obj, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey,
		StallTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var thaw func()
	hang = func() {
		t.Helper()
		f := srv.Freeze()
		mu.Lock()
		thaw = f
		mu.Unlock()
	}
	resume = func() {
		mu.Lock()
		f := thaw
		thaw = nil
		mu.Unlock()
		if f != nil {
			f()
		}
	}
	return obj, srv, hang, resume
}

// downableS3 is kiln's S3 store on a real versitygw that the test stops
// and starts (srv.Stop, srv.Start: connections refused meanwhile), with one
// retry, so that requests fail fast while it is down.
func downableS3(t *testing.T) (store.Store, *testsvc.S3Server) {
	t.Helper()
	srv := testsvc.S3(t)
	obj, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	return obj, srv
}

// An object store that hangs mid-run (its process stopped: connections
// are accepted and never answered) neither stalls training nor costs a
// step at a stop. Training goes on, a newer checkpoint taking the place of
// the one waiting to upload, and a warning names the hung upload's step,
// its time so far and the endpoint, again as that time grows. A stop
// (ctx cancelled, as SIGTERM does) returns once the upload grace is over,
// while the store still hangs, with the last step's checkpoint on this
// disk; the next segment, once the store answers, resumes from it and
// uploads it.
func TestHungObjectStoreNeitherStallsTrainingNorLosesSteps(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, srv, hang, resume := stoppableS3(t)
	run := testRun("hung", 1_000_000)
	disk := t.TempDir()
	core, logs := observer.New(zap.InfoLevel)
	var logged atomic.Int64 // the last step whose metrics were logged
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		out Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := Run(runCtx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a",
			Log: zap.New(core), SlowUpload: 20 * time.Millisecond, UploadGrace: 200 * time.Millisecond,
			Progress: func(step, total int, m *trainer.Metrics) {
				if m != nil {
					logged.Store(int64(step))
				}
			}})
		done <- result{out, err}
	}()
	waitFor(t, "a checkpoint uploaded while the store answers", func() bool {
		return len(logs.FilterMessage("checkpoint uploaded").All()) > 0
	})
	hang()

	// The upload in flight hangs (its push, or the retention or results
	// after it): it is warned of again and again, the elapsed time growing,
	// naming the step and the endpoint.
	slow := func() []observer.LoggedEntry { return logs.FilterMessageSnippet(" slow; training").All() }
	before := len(slow())
	endpoint := "http://" + srv.Endpoint + "/kiln"
	stuck := -1
	waitFor(t, "repeated warnings of a hung upload", func() bool {
		seen := map[int64][]time.Duration{}
		for _, e := range slow()[before:] {
			f := e.ContextMap()
			if f["endpoint"] != endpoint {
				t.Fatalf("slow-upload warning names endpoint %v, want %s", f["endpoint"], endpoint)
			}
			step := f["step"].(int64)
			seen[step] = append(seen[step], f["elapsed"].(time.Duration))
			if d := seen[step]; len(d) >= 2 && d[len(d)-1] > d[0] {
				stuck = int(step)
				return true
			}
		}
		return false
	})
	// Training goes on past it: with five checkpoints written since, no
	// upload queue could have held them all.
	waitFor(t, "training past the hung upload", func() bool { return logged.Load() >= int64(stuck+10) })
	if len(logs.FilterMessageSnippet("the newer checkpoint waits in place of the one that waited").All()) == 0 {
		t.Error("no checkpoint took the place of the one waiting to upload")
	}
	last := int(logged.Load())

	// The stop, the store still hung.
	cancel()
	var r result
	select {
	case r = <-done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the stopped segment did not return within 3 minutes while object storage hangs (its grace is 200 ms)")
	}
	out := r.out
	if !errors.Is(r.err, context.Canceled) || out.Step < last || out.Uploaded >= out.Step {
		t.Fatalf("stopped segment: %+v %v; want it cancelled at step %d or after, its checkpoint not uploaded", out, r.err, last)
	}
	if want := filepath.Join(RunDir(disk, "hung"), trainer.StepDir(out.Step)); out.Checkpoint != want {
		t.Fatalf("stopped segment's checkpoint %q, want %q", out.Checkpoint, want)
	}
	if st, err := trainer.CheckCheckpoint(out.Checkpoint); err != nil || st.Step != out.Step {
		t.Fatalf("the stop's local checkpoint: step %d, %v; want step %d complete", st.Step, err, out.Step)
	}
	if w := logs.FilterMessageSnippet("upload grace over").All(); len(w) != 1 || w[0].ContextMap()["newest"] != int64(out.Step) {
		t.Errorf("grace warnings %v; want one naming step %d", w, out.Step)
	}
	// The hung store left no pile of checkpoints: the newest two.
	if local := localSteps(RunDir(disk, "hung")); len(local) > 2 || local[len(local)-1] != out.Step {
		t.Errorf("local checkpoints %v after the stop; want at most two, the newest %d", local, out.Step)
	}

	// The store answers again; the next segment uploads the stop's
	// checkpoint and goes on from it.
	resume()
	run.Segment.MaxSteps = 1
	core, logs = observer.New(zap.InfoLevel)
	next, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", Log: zap.New(core)})
	if err != nil || next.ResumeSource != "local" || next.ResumedFrom != out.Step || next.Step != out.Step+1 || next.Uploaded != out.Step+1 {
		t.Fatalf("next segment: %+v %v; want it to resume from the local step %d and upload step %d", next, err, out.Step, out.Step+1)
	}
	if w := logs.FilterMessage("uploading the local checkpoint object storage lacks").All(); len(w) != 1 || w[0].ContextMap()["step"] != int64(out.Step) {
		t.Errorf("logs %v; want the upload of step %d announced", w, out.Step)
	}
	if _, err := Pull(ctx, obj, "hung", out.Step, t.TempDir()); err != nil {
		t.Errorf("the stop's checkpoint, step %d, in object storage: %v", out.Step, err)
	}
}

// A checkpoint retention keeps for good (keep_every; here every one) is
// never dropped from the upload queue: replaced there by a newer one while
// the store hangs, it stays on this disk, and the next segment uploads it
// with the newest. Then only the newest two stay local.
func TestRetainedCheckpointsReachObjectStorageAfterAHang(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _, hang, resume := stoppableS3(t)
	run := testRun("kept", 1_000_000)
	run.Retention = runs.Retention{KeepLast: 2, KeepEvery: 1}
	disk := t.TempDir()
	core, logs := observer.New(zap.InfoLevel)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Run(runCtx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a",
			Log: zap.New(core), UploadGrace: 200 * time.Millisecond})
		done <- err
	}()
	waitFor(t, "a checkpoint uploaded while the store answers", func() bool {
		return len(logs.FilterMessage("checkpoint uploaded").All()) > 0
	})
	hang()
	var replaced []int
	waitFor(t, "three retained checkpoints replaced in the upload queue", func() bool {
		replaced = nil
		for _, e := range logs.FilterMessageSnippet("the newer checkpoint waits in place of the one that waited").All() {
			if f := e.ContextMap(); f["replaced_owed"] == true {
				replaced = append(replaced, int(f["replaced"].(int64)))
			}
		}
		return len(replaced) >= 3
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("stopped segment: %v", err)
	}
	local := localSteps(RunDir(disk, "kept"))
	for _, s := range replaced {
		if !slices.Contains(local, s) {
			t.Fatalf("retained step %d, replaced in the upload queue, is not on this disk: %v", s, local)
		}
	}

	resume()
	run.Segment.MaxSteps = 1
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	if err != nil || out.Uploaded != out.Step {
		t.Fatalf("next segment: %+v %v", out, err)
	}
	remote, err := RemoteSteps(ctx, obj, "kept")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range replaced {
		if !slices.Contains(remote, s) {
			t.Errorf("retained step %d is not in object storage after the next segment: %v", s, remote)
		}
	}
	if local := localSteps(RunDir(disk, "kept")); len(local) != 2 {
		t.Errorf("local checkpoints %v once object storage has them; want the newest two", local)
	}
}

// After an outage of object storage filled the disk with checkpoints it
// lacks, the disk guard stops the segment saying so; once the store is
// back, the next segment uploads the newest before the guard decides, the
// guard frees the older one, and the run goes on (it used to fail on every
// retry). The disk here has room for one of the run's checkpoints above
// min_free_disk.
func TestDiskGuardWaitsForUploadsAfterAnOutage(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, srv := downableS3(t)
	run := testRun("outage", 40)
	run.MinFreeDisk = 10 << 30
	disk := t.TempDir()
	rd := RunDir(disk, "outage")
	free := func(string) (int64, error) { return 15<<30 - int64(len(localSteps(rd)))*(3<<30), nil }

	var once sync.Once
	_, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", FreeSpace: free,
		Progress: func(step, total int, m *trainer.Metrics) {
			// Before step 2's checkpoint, so that none of this segment's
			// checkpoints reaches the store. Stopped at step 3, whether
			// step 2's upload ended first decided whether the next
			// segment's guard had to wait.
			if m != nil && step == 1 {
				once.Do(srv.Stop)
			}
		}})
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	for _, want := range []string{"local checkpoints (steps", "are not in object storage yet", "http://" + srv.Endpoint + "/kiln is unreachable or behind"} {
		if !errors.Is(err, ErrDiskFull) || !strings.Contains(msg, want) || strings.Contains(msg, "\n") {
			t.Fatalf("segment during the outage: %v; want ErrDiskFull on one line saying %q", err, want)
		}
	}
	local := localSteps(rd)
	if len(local) != 2 {
		t.Fatalf("local checkpoints after the outage %v; want the newest two", local)
	}
	newest := local[1]

	srv.Start()
	core, logs := observer.New(zap.InfoLevel)
	run.Segment.MaxSteps = 2 // one more checkpoint, which the guard lets through once the newest is uploaded
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", FreeSpace: free, Log: zap.New(core)})
	if err != nil || out.ResumeSource != "local" || out.ResumedFrom != newest || out.Step != newest+2 || out.Uploaded != newest+2 {
		t.Fatalf("segment after the outage: %+v %v; want it to resume from the local step %d and train on", out, err, newest)
	}
	if len(logs.FilterMessageSnippet("before the disk guard decides").All()) != 1 {
		t.Errorf("logs %v; want the guard to wait for the upload once", logs.All())
	}
	if w := logs.FilterMessage("disk guard removed an uploaded local checkpoint").All(); len(w) == 0 || w[0].ContextMap()["step"] != int64(local[0]) {
		t.Errorf("guard warnings %v; want the first to name step %d", w, local[0])
	}
	if steps, err := RemoteSteps(ctx, obj, "outage"); err != nil || !slices.Contains(steps, newest) || !slices.Contains(steps, newest+2) {
		t.Errorf("object storage holds steps %v (%v); want %d and %d", steps, err, newest, newest+2)
	}
}

// A segment that trains its steps while object storage hangs ends within
// its upload grace, as a success: the run's chain goes on from the
// checkpoint on this disk, rather than the segment waiting on the hung
// store and spending a retry. The next segment here resumes from that
// checkpoint and goes on uploading once the store answers.
func TestASegmentEndingDuringAHangLeavesItsCheckpointForTheNext(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _, hang, resume := stoppableS3(t)
	run := testRun("ends", 40)
	run.Segment.MaxSteps = 8
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != 8 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	// The store hangs once the second segment trains (its start lists
	// object storage, which a hung store would hold).
	var once sync.Once
	core, logs := observer.New(zap.WarnLevel)
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a",
		Log: zap.New(core), UploadGrace: 200 * time.Millisecond,
		Progress: func(step, total int, m *trainer.Metrics) { once.Do(hang) }})
	if err != nil || out.Step != 16 || out.Done {
		t.Fatalf("segment during the hang: %+v, %v; want it to end at step 16 without an error", out, err)
	}
	if w := logs.FilterMessageSnippet("the run goes on from the checkpoint on this disk").All(); len(w) != 1 {
		t.Errorf("warnings %v; want one saying the run goes on from the local checkpoint", logs.All())
	}
	if _, err := trainer.VerifyCheckpoint(filepath.Join(RunDir(disk, "ends"), trainer.StepDir(16))); err != nil {
		t.Fatalf("step 16 on this disk: %v", err)
	}
	resume()
	out, err = Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	if err != nil || out.ResumedFrom != 16 || out.ResumeSource != "local" || out.Step != 24 {
		t.Fatalf("next segment: %+v, %v; want it to resume from step 16 here", out, err)
	}
	steps, err := RemoteSteps(ctx, obj, "ends")
	if err != nil || len(steps) == 0 || steps[len(steps)-1] != 24 {
		t.Errorf("object storage holds steps %v, %v; want the newest, 24", steps, err)
	}
}

// firstSegmentStopsTheStore trains run's first segment, of six steps, on
// disk, and stops the object store at step 5 once a checkpoint is
// uploaded: the segment's last uploads and results fail.
func firstSegmentStopsTheStore(t *testing.T, rdb *redis.Client, obj store.Store, srv *testsvc.S3Server, run runs.Run, disk string) {
	t.Helper()
	if run.Segment.MaxSteps != 6 {
		t.Fatalf("segment of %d steps; the store stops at step 5 of 6", run.Segment.MaxSteps)
	}
	core, logs := observer.New(zap.InfoLevel)
	var once sync.Once
	out, err := Run(context.Background(), Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", Log: zap.New(core),
		UploadGrace: 200 * time.Millisecond,
		Progress: func(step, total int, m *trainer.Metrics) {
			if m != nil && step == 5 {
				once.Do(func() {
					waitFor(t, "a checkpoint uploaded", func() bool { return len(logs.FilterMessage("checkpoint uploaded").All()) > 0 })
					srv.Stop()
				})
			}
		}})
	if err != nil || out.Step != 6 {
		t.Fatalf("first segment: %+v, %v", out, err)
	}
}

// A segment that starts while object storage is down (connections
// refused) trains on from the checkpoint on this disk, which is as new as
// any the store holds: the run's state records which it holds. The
// checkpoints retention keeps for good that the store may lack stay on
// this disk meanwhile, and go up once it answers. A disk without the
// run's newest checkpoint does not train: its segment returns the outage,
// which the task waits out.
func TestASegmentStartingDuringAnOutageTrainsOnFromItsDisk(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, srv := downableS3(t)
	run := testRun("down", 1_000_000)
	run.Retention = runs.Retention{KeepLast: 2, KeepEvery: 2} // every second checkpoint (of every 2 steps): 4, 8, 12 kept for good
	run.Segment.MaxSteps = 6
	disk := t.TempDir()
	firstSegmentStopsTheStore(t, rdb, obj, srv, run, disk)

	// The store is down as the next segment starts. Still down at its end,
	// it is not waited for: the segment's checkpoints are on this disk for
	// the next (an hour's grace would hold the test for the hour).
	core, logs := observer.New(zap.InfoLevel)
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", Log: zap.New(core),
		UploadGrace: time.Hour})
	if err != nil || out.ResumeSource != "local" || out.ResumedFrom != 6 || out.Step != 12 {
		t.Fatalf("segment started during the outage: %+v, %v; want it to resume from the local step 6 and train to 12", out, err)
	}
	if w := logs.FilterMessageSnippet("object storage does not answer: resuming from the local checkpoint").All(); len(w) != 1 || w[0].ContextMap()["step"] != int64(6) {
		t.Errorf("warnings %v; want one naming the local step 6", w)
	}
	local := localSteps(RunDir(disk, "down"))
	for _, s := range []int{4, 8, 12} {
		if !slices.Contains(local, s) {
			t.Errorf("retained step %d, which object storage lacks, is not on this disk: %v", s, local)
		}
	}

	// Another disk, without the run's newest checkpoint, does not train.
	st, _, err := scheduler.ReadRunState(ctx, rdb, "down")
	if err != nil || st.Checkpoint < 2 {
		t.Fatalf("run state %+v, %v; want a checkpoint recorded uploaded", st, err)
	}
	_, err = Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
	if !store.Unreachable(err) || !strings.Contains(err.Error(), fmt.Sprintf("its newest checkpoint, step %d, is in object storage, and this disk holds no checkpoint", st.Checkpoint)) {
		t.Fatalf("segment on an empty disk during the outage: %v; want the outage, naming step %d", err, st.Checkpoint)
	}

	// Nor does a run not begun: nothing says what object storage holds.
	if _, err := Run(ctx, Params{Run: testRun("fresh", 10), Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"}); !store.Unreachable(err) {
		t.Fatalf("a run not begun, during the outage: %v; want the outage", err)
	}

	// Once the store answers, every retained checkpoint goes up.
	srv.Start()
	run.Segment.MaxSteps = 2
	out, err = Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	if err != nil || out.ResumedFrom != 12 || out.Step != 14 || out.Uploaded != 14 {
		t.Fatalf("segment after the outage: %+v, %v", out, err)
	}
	remote, err := RemoteSteps(ctx, obj, "down")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []int{4, 8, 12, 14} {
		if !slices.Contains(remote, s) {
			t.Errorf("step %d is not in object storage after the outage: %v", s, remote)
		}
	}
	// And TensorBoard's files hold every step once: the first segment's,
	// whose last upload failed, and the second's, which never uploaded
	// one, went up with the third's.
	holdsEveryStepOnce(t, obj, "down", 14)
}

// A segment's event file that object storage never got goes up with a
// later segment's results, but only over the steps that are still the
// run's: here another worker resumed from an older checkpoint meanwhile
// and trained the first segment's last steps again, so TensorBoard shows
// each step once, as metrics.jsonl has it.
func TestEventFilesCaughtUpNeverHoldAStepTwice(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, srv := downableS3(t)
	run := testRun("twice", 1_000_000)
	run.Segment.MaxSteps = 6
	diskA, diskB := t.TempDir(), t.TempDir()
	firstSegmentStopsTheStore(t, rdb, obj, srv, run, diskA)
	srv.Start()
	steps, err := RemoteSteps(ctx, obj, "twice")
	if err != nil || len(steps) == 0 || steps[len(steps)-1] >= 6 {
		t.Fatalf("object storage holds steps %v, %v; want some older than 6", steps, err)
	}
	older := steps[len(steps)-1]

	// Another worker, without the first's disk, resumes from the older
	// checkpoint in object storage and trains its steps after it again.
	out, err := Run(ctx, Params{Run: run, Dir: diskB, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
	if err != nil || out.ResumedFrom != older || out.Step != older+6 {
		t.Fatalf("segment of the other worker: %+v, %v; want it to resume from step %d", out, err, older)
	}
	// The first worker again: it resumes from the newer checkpoint in
	// object storage, and its results catch up its first file.
	run.Segment.MaxSteps = 2
	out, err = Run(ctx, Params{Run: run, Dir: diskA, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	if err != nil || out.ResumedFrom != older+6 || out.Step != older+8 {
		t.Fatalf("first worker's next segment: %+v, %v; want it to resume from step %d", out, err, older+6)
	}
	holdsEveryStepOnce(t, obj, "twice", older+8)
}

// A segment killed after a checkpoint and before its results caught up
// leaves its event file short of the step the next segment resumes from,
// on this disk and in the store alike (here: written at step 4, killed
// after the checkpoint of step 8). The next segment's results fill it in.
func TestAKilledSegmentsShortEventFileIsFilledIn(t *testing.T) {
	ctx := context.Background()
	p, key := eightStepSegment(t, "killed")
	// What the kill left: the file as the results after step 4 wrote it.
	name := path.Base(key)
	began, _, from, ok := results.ParseEventFileName(name)
	f, err := os.Open(filepath.Join(RunDir(p.Dir, "killed"), results.MetricsFile))
	if err != nil || !ok || from != 0 {
		t.Fatalf("%s: %v", name, err)
	}
	recs, err := results.ReadMetrics(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	var short bytes.Buffer
	if _, err := results.WriteEventStretch(&short, recs, 0, 4, began); err != nil {
		t.Fatal(err)
	}
	if err := p.Objects.Put(ctx, key, bytes.NewReader(short.Bytes()), int64(short.Len())); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(RunDir(p.Dir, "killed"), results.TensorBoardDir, name), short.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	p.Run.Segment.MaxSteps = 2
	if out, err := Run(ctx, p); err != nil || out.ResumedFrom != 8 || out.Step != 10 {
		t.Fatalf("next segment: %+v, %v", out, err)
	}
	holdsEveryStepOnce(t, p.Objects, "killed", 10)
}

// A first segment killed during its first checkpoint's upload leaves that
// checkpoint and its metrics lines on this disk and no event file at all,
// here or in the store (results, the file among them, are written once an
// upload ends). The next segment resumes from the local checkpoint, and
// its results give the first stretch a file of its own: its steps were in
// no file, where the earlier files are caught up only over their own
// stretches.
func TestAFirstSegmentKilledBeforeItsResultsKeepsItsStepsInTensorBoard(t *testing.T) {
	ctx := context.Background()
	p, key := eightStepSegment(t, "unlogged")
	// What the kill left: no event file, on this disk or in the store.
	if err := p.Objects.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(RunDir(p.Dir, "unlogged"), results.TensorBoardDir)); err != nil {
		t.Fatal(err)
	}

	p.Run.Segment.MaxSteps = 2
	if out, err := Run(ctx, p); err != nil || out.ResumedFrom != 8 || out.Step != 10 {
		t.Fatalf("next segment: %+v, %v", out, err)
	}
	holdsEveryStepOnce(t, p.Objects, "unlogged", 10)
	// A third segment finds the first stretch's file and makes no other.
	if out, err := Run(ctx, p); err != nil || out.Step != 12 {
		t.Fatalf("third segment: %+v, %v", out, err)
	}
	holdsEveryStepOnce(t, p.Objects, "unlogged", 12)
	if files, err := p.Objects.List(ctx, path.Dir(key)+"/"); err != nil || len(files) != 3 {
		t.Errorf("event files %v, %v; want three: the first stretch's and two segments'", files, err)
	}
}

// eightStepSegment trains a first segment of 8 steps of a run named name
// on a disk of its own, with a real Redis and object store, and returns
// the segment's parameters, for the next segments, and the key of its
// event file in the store.
func eightStepSegment(t *testing.T, name string) (Params, string) {
	t.Helper()
	obj, _ := downableS3(t)
	p := Params{Run: testRun(name, 1_000_000), Dir: t.TempDir(), Redis: newRedis(t), Objects: obj, OpenData: openStream, Owner: "gpu-a"}
	p.Run.Segment.MaxSteps = 8
	if out, err := Run(context.Background(), p); err != nil || out.Step != 8 {
		t.Fatalf("first segment: %+v, %v", out, err)
	}
	files, err := obj.List(context.Background(), ResultsPrefix(name)+results.TensorBoardDir+"/")
	if err != nil || len(files) != 1 {
		t.Fatalf("event files %v, %v; want the first segment's", files, err)
	}
	return p, files[0].Key
}

// holdsEveryStepOnce checks that the event files of run in object storage
// hold each step of its metrics.jsonl there, 0 to last, exactly once and
// with its loss.
func holdsEveryStepOnce(t *testing.T, obj store.Store, run string, last int) {
	t.Helper()
	ctx := context.Background()
	rc, err := obj.Get(ctx, ResultsPrefix(run)+results.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.ReadMetrics(rc)
	rc.Close()
	if err != nil || len(recs) != last+1 {
		t.Fatalf("metrics.jsonl in object storage: %d lines, %v; want steps 0 to %d", len(recs), err, last)
	}
	prefix := ResultsPrefix(run) + results.TensorBoardDir + "/"
	files, err := obj.List(ctx, prefix)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64][]string{}
	for _, f := range files {
		r, err := obj.Get(ctx, f.Key)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		evs, err := tfevents.Read(b)
		if err != nil {
			t.Fatalf("%s: %v", f.Key, err)
		}
		for _, e := range evs[1:] {
			seen[e.Step] = append(seen[e.Step], strings.TrimPrefix(f.Key, prefix))
			if e.Step > int64(last) {
				t.Errorf("%s: step %d, past the run's last step %d", f.Key, e.Step, last)
				continue
			}
			if rec := recs[e.Step]; rec.Loss != nil && e.Values[results.TagLoss] != float32(*rec.Loss) {
				t.Errorf("%s: step %d loss %v; metrics.jsonl says %v", f.Key, e.Step, e.Values[results.TagLoss], *rec.Loss)
			}
		}
	}
	for step := int64(0); step <= int64(last); step++ {
		if len(seen[step]) != 1 {
			t.Errorf("step %d is in %d event files %v; want one (files %v)", step, len(seen[step]), seen[step], files)
		}
	}
}

// stoppableRedis is a real redis-server the test stops and starts, a
// client of it, and a local object store.
func stoppableRedis(t *testing.T) (*testsvc.RedisServer, *redis.Client, store.Store) {
	t.Helper()
	rs := testsvc.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { rdb.Close() })
	obj, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return rs, rdb, obj
}

// Redis down for longer than the run lock's lease ends the segment (once
// Redis is back, another worker may take the run): training stops at a
// step boundary with that step's checkpoint on this disk, and the next
// segment here resumes from it, so no step is lost.
func TestARedisOutageLongerThanTheLeaseLosesNoStep(t *testing.T) {
	ctx := context.Background()
	rs, rdb, obj := stoppableRedis(t)
	run := testRun("redis-down", 1_000_000)
	run.CheckpointEvery = 1_000 // the stop writes the only checkpoint
	disk := t.TempDir()
	var once sync.Once
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", LockTTL: time.Second,
		Progress: func(step, total int, m *trainer.Metrics) {
			if m != nil && step == 3 {
				once.Do(rs.Stop)
			}
		}})
	if !errors.Is(err, scheduler.ErrRunLockLost) || out.Step <= 3 {
		t.Fatalf("segment through a Redis outage: %+v, %v; want it stopped past step 3 with the lock lost", out, err)
	}
	if local := localSteps(RunDir(disk, "redis-down")); !slices.Contains(local, out.Step) {
		t.Fatalf("local checkpoints %v; want the stopped step %d", local, out.Step)
	}

	rs.Start()
	// The client dials again once Redis is back: after a run of failed
	// dials its pool answers with the last dial error until a probe, once
	// a second, gets through.
	waitFor(t, "the client reaching Redis again", func() bool { return rdb.Ping(ctx).Err() == nil })
	run.Segment.MaxSteps = 2
	next, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", LockTTL: time.Second})
	if err != nil || next.ResumeSource != "local" || next.ResumedFrom != out.Step || next.Step != out.Step+2 {
		t.Fatalf("segment after Redis is back: %+v, %v; want it to resume from step %d", next, err, out.Step)
	}
}

// Redis down for less than the lease: training goes on, and the state
// writes that fail meanwhile (one a second) make two lines in the log,
// one when the first fails and one when a write succeeds again.
func TestARedisOutageWithinTheLeaseIsLoggedTwice(t *testing.T) {
	rs, rdb, obj := stoppableRedis(t)
	run := testRun("redis-blip", 1_000_000)
	run.CheckpointEvery = 1_000_000
	core, logs := observer.New(zap.InfoLevel)
	said := func(msg string) []observer.LoggedEntry { return logs.FilterMessage(msg).AllUntimed() }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	var steps atomic.Int64
	ended := make(chan error, 1)
	go func() {
		// The lease outlasts any outage this test makes.
		_, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a",
			LockTTL: time.Hour, Log: zap.New(core),
			Progress: func(step, total int, m *trainer.Metrics) {
				steps.Store(int64(step))
				if m != nil && step == 3 {
					once.Do(rs.Stop)
				}
			}})
		ended <- err
	}()
	waitFor(t, "the first failed state write logged", func() bool {
		return len(said("run state not recorded; further failures are not logged until a write succeeds")) > 0
	})
	// Training goes on while Redis is down.
	during := steps.Load()
	waitFor(t, "steps trained while Redis is down", func() bool { return steps.Load() >= during+5 })
	rs.Start()
	waitFor(t, "a state write after the outage logged", func() bool { return len(said("run state recorded again")) > 0 })
	cancel()
	if err := <-ended; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("segment: %v", err)
	}
	down, back := said("run state not recorded; further failures are not logged until a write succeeds"), said("run state recorded again")
	if len(down) != 1 || len(back) != 1 {
		t.Fatalf("the outage was logged as %d failure line(s) and %d recovery line(s); want one of each", len(down), len(back))
	}
	if lost := back[0].ContextMap()["writes_lost"]; lost == nil || lost.(int64) < 1 {
		t.Fatalf("recovery line: writes_lost %v; want the failed writes counted", lost)
	}
	if n := len(said("record run state")); n != 0 {
		t.Fatalf("%d lines per failed write", n)
	}
}

// A segment that resumes from an older checkpoint than the one the
// segment before it began at (the newer ones damaged in object storage,
// on another disk) trains that segment's steps again: its event file in
// object storage, all of whose steps this segment has trained again, is
// removed, where it stayed beside the new one with every step twice.
func TestAnEventFileOfStepsTrainedAgainIsRemoved(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := downableS3(t)
	run := testRun("again", 1_000_000)
	run.Retention.KeepLast = 4
	run.Segment.MaxSteps = 4
	for _, want := range []int{4, 8} {
		if out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != want {
			t.Fatalf("segment to step %d: %+v, %v", want, out, err)
		}
	}
	for _, step := range []int{4, 6, 8} {
		if err := obj.Delete(ctx, checkpointKey("again", step)+trainer.ModelFile); err != nil {
			t.Fatal(err)
		}
	}
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-b"})
	if err != nil || out.ResumedFrom != 2 || out.Step != 6 {
		t.Fatalf("segment past the damaged checkpoints: %+v, %v; want steps 3 to 6 trained again", out, err)
	}
	holdsEveryStepOnce(t, obj, "again", 6)
}

// A segment that starts as object storage begins to hang (after the
// worker's check of it, before the listing of the run's checkpoints) gives
// the listing AnswerWithin, then trains on from the checkpoint on this
// disk, as after a check that failed, where it waited on the store's
// timeouts and retries, minutes at a time, saying nothing. The store still
// hung at its end, it ends without waiting for the grace (an hour here),
// where it waited all of it, as one whose store refuses does.
func TestASegmentStartingAsTheStoreHangsTrainsOnFromItsDisk(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _, hang, resume := stoppableS3(t)
	run := testRun("hangs", 1_000_000)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v, %v; want step 4 uploaded", out, err)
	}
	hang()
	core, logs := observer.New(zap.InfoLevel)
	type result struct {
		out Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", Log: zap.New(core),
			AnswerWithin: 200 * time.Millisecond, UploadGrace: time.Hour})
		done <- result{out, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		// The store's stall timeout is an hour, as is the grace: a
		// listing left unbounded would hold the segment that long.
		resume()
		r = <-done
		t.Fatalf("the segment waited on the hung store's listing: %+v, %v", r.out, r.err)
	}
	if r.out.ResumeSource != "local" || r.out.ResumedFrom != 4 || r.out.Step != 8 {
		t.Fatalf("segment started as the store hung: %+v, %v; want it to resume from the local step 4 and train to 8", r.out, r.err)
	}
	if w := logs.FilterMessageSnippet("object storage does not answer: resuming from the local checkpoint").All(); len(w) != 1 {
		t.Errorf("warnings %v; want one saying it resumes from the local checkpoint", w)
	}
	// Once the store answers, the next segment uploads what this one
	// left on the disk, and every step is in TensorBoard's files once.
	resume()
	run.Segment.MaxSteps = 2
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.ResumedFrom != 8 || out.Uploaded != 10 {
		t.Fatalf("segment after the hang: %+v, %v; want it to resume from 8 and upload 10", out, err)
	}
	holdsEveryStepOnce(t, obj, "hangs", 10)
}

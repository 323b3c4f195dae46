package segment

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/pidlock"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// streamData is a deterministic token stream with a learnable pattern,
// standing in for a token store so that these tests need no ingest.
type streamData struct{ next int }

func (d *streamData) window(i, t int) []int32 {
	w := make([]int32, t+1)
	x := uint64(i)*0x9e3779b97f4a7c15 + 1
	for j := range w {
		x = x*6364136223846793005 + 1442695040888963407
		w[j] = int32((x>>40)%61) + 2
		if j%3 == 2 {
			w[j] = w[j-1] // a repeat the model can learn
		}
	}
	return w
}

func (d *streamData) batch(first, b, t int) model.Batch {
	mb := model.Batch{B: b, T: t}
	for i := 0; i < b; i++ {
		w := d.window(first+i, t)
		for j := 0; j < t; j++ {
			mb.Inputs = append(mb.Inputs, w[j])
			mb.Targets = append(mb.Targets, w[j+1])
		}
	}
	return mb
}

func (d *streamData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	mb := d.batch(d.next, b, t)
	d.next += b
	return mb, nil
}

func (d *streamData) Eval(ctx context.Context, i, b, t int) (model.Batch, error) {
	return d.batch(1_000_000+i*b, b, t), nil
}

func (d *streamData) Cursor() (json.RawMessage, error) { return json.Marshal(d.next) }
func (d *streamData) Seek(c json.RawMessage) error     { return json.Unmarshal(c, &d.next) }
func (d *streamData) Close() error                     { return nil }

func openStream(trainer.RunConfig, model.Config) (trainer.Data, error) { return &streamData{}, nil }

func testRun(name string, total int) runs.Run {
	return runs.Run{
		Name: name,
		RunConfig: trainer.RunConfig{Model: "tiny", Seq: 32, Batch: 2, Accumulate: 1, LR: 1e-3, Warmup: 2, TotalSteps: total,
			LogEvery: 1, EvalEvery: 2, EvalBatches: 1, CheckpointEvery: 2, Seed: 5, Engine: "cpu", Precision: "fp32",
			Mixture: []trainer.MixtureEntry{{Store: "stream", Weight: 1}}},
		Tokenizer: "test",
		Retention: runs.Retention{KeepLast: 2},
	}
}

// losses collects the training loss of every logged step.
type losses struct {
	mu sync.Mutex
	m  map[int]float64
}

func (l *losses) hook(step, total int, m *trainer.Metrics) {
	if m == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[int]float64{}
	}
	l.m[m.Step] = m.LossOr(0)
}

// A run done at its total and given a longer one is not done while it
// trains towards it: its state says so from the first step it trains, which
// the metrics endpoint's kiln_run_done and sched retry read, not from the
// end of the segment.
func TestADoneRunGivenALongerTotalIsNotDoneWhileItTrains(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("longer", 4)
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream}); err != nil || !out.Done {
		t.Fatalf("the run to its first total: %+v, %v", out, err)
	}
	if st, _, err := scheduler.ReadRunState(ctx, rdb, "longer"); err != nil || !st.Done {
		t.Fatalf("the run's state at its first total: %+v, %v; want done", st, err)
	}
	run.TotalSteps = 8
	var at5 scheduler.RunState
	var read error
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream,
		Progress: func(step, total int, m *trainer.Metrics) {
			if step == 5 && m == nil {
				at5, _, read = scheduler.ReadRunState(ctx, rdb, "longer")
			}
		}})
	if err != nil || !out.Done || read != nil || at5.Step != 5 || at5.Done {
		t.Fatalf("the run's state at the first step towards its longer total: %+v (%v); the segment: %+v, %v; want step 5, not done", at5, read, out, err)
	}
	if st, _, err := scheduler.ReadRunState(ctx, rdb, "longer"); err != nil || !st.Done || st.Step != 8 {
		t.Fatalf("the run's state at its longer total: %+v, %v; want done at step 8", st, err)
	}
}

// A worker that loses its disk costs at most one checkpoint interval: the
// next worker pulls the newest complete checkpoint from object storage and
// the run continues with the losses it would have had uninterrupted.
func TestSegmentsResumeFromObjectStorageAfterLosingTheDisk(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)

	var want losses
	ref := testRun("ref", 8)
	if out, err := Run(ctx, Params{Run: ref, Dir: t.TempDir(), Redis: rdb, OpenData: openStream, Progress: want.hook}); err != nil || !out.Done {
		t.Fatalf("reference run: %+v %v", out, err)
	}

	run := testRun("r", 8)
	run.Segment.MaxSteps = 4
	var first, second losses
	diskA := t.TempDir()
	out, err := Run(ctx, Params{Run: run, Dir: diskA, Redis: rdb, Objects: obj, OpenData: openStream, Progress: first.hook, Owner: "gpu-a"})
	if err != nil || out.Done || out.Step != 4 || out.Uploaded != 4 || out.ResumeSource != "" {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	if err := os.RemoveAll(diskA); err != nil {
		t.Fatal(err)
	}
	out, err = Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Progress: second.hook, Owner: "gpu-b"})
	if err != nil || out.Step != 8 || out.ResumedFrom != 4 || out.ResumeSource != "object storage" {
		t.Fatalf("second segment: %+v %v", out, err)
	}
	// The second segment is bounded at 4 steps too and ends the run.
	if !out.Done {
		t.Fatalf("run not done: %+v", out)
	}
	for step := 1; step <= 8; step++ {
		got := first.m[step]
		if step > 4 {
			got = second.m[step]
		}
		if got != want.m[step] {
			t.Errorf("step %d: loss %v, uninterrupted %v", step, got, want.m[step])
		}
	}

	// Retention kept the last two; the state in Redis names the last one.
	steps, err := RemoteSteps(ctx, obj, "r")
	if err != nil || !reflect.DeepEqual(steps, []int{6, 8}) {
		t.Fatalf("remote checkpoints %v %v", steps, err)
	}
	st := rdb.HGetAll(ctx, scheduler.RunStateKey("r")).Val()
	// The rate is one device's here, and says so.
	if wall, err := strconv.ParseFloat(st["wall_s"], 64); err != nil || wall <= 0 ||
		st["checkpoint"] != "8" || st["step"] != "8" || st["total"] != "8" || st["worker"] != "gpu-b" || st["done"] != "true" ||
		st["tok_per_s"] == "" || st["gpus"] != "1" {
		t.Errorf("run state %v", st)
	}

	// results/r/ holds the whole history: the metrics of both segments.
	rc, err := obj.Get(ctx, ResultsPrefix("r")+results.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.ReadMetrics(rc)
	rc.Close()
	// Step 0 is the initial weights' evaluation, then steps 1 to 8.
	if err != nil || len(recs) != 9 || recs[0].Step != 0 || recs[0].EvalLoss == nil || recs[0].Loss != nil || *recs[1].Loss != want.m[1] {
		t.Fatalf("results metrics: %d records, %v", len(recs), err)
	}
	// The untrained model is near ln(63 ids in use) at best and far above
	// what it learns.
	if *recs[0].EvalLoss < 4 || *recs[0].EvalLoss < *recs[8].EvalLoss {
		t.Errorf("initial eval loss %v, final %v", *recs[0].EvalLoss, *recs[8].EvalLoss)
	}
	// Each segment left its TensorBoard event file beside the results: one
	// from step 0, one from the step the second resumed from.
	events, err := obj.List(ctx, ResultsPrefix("r")+results.TensorBoardDir+"/")
	if err != nil || len(events) != 2 {
		t.Fatalf("event files in results/r/tensorboard/: %v %v; want one per segment", events, err)
	}
	for i, suffix := range []string{".step0", ".step4"} {
		if !strings.Contains(events[i].Key, "events.out.tfevents.") || !strings.HasSuffix(events[i].Key, suffix) || events[i].Size < 100 {
			t.Errorf("event file %d: %+v; want a tfevents file ending %s", i, events[i], suffix)
		}
	}
	// The state carries the last evaluation, for watchers of the run.
	if want := strconv.FormatFloat(*recs[8].EvalLoss, 'f', 4, 64); st["eval_loss"] != want || st["eval_step"] != "8" {
		t.Errorf("run state eval_loss %q at step %q; want %s at step 8", st["eval_loss"], st["eval_step"], want)
	}
	for _, name := range []string{results.SummaryFile, results.PlotFile} {
		r, err := obj.Get(ctx, ResultsPrefix("r")+name)
		if err != nil {
			t.Fatalf("results/r/%s: %v", name, err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if len(b) < 100 {
			t.Errorf("results/r/%s is %d bytes", name, len(b))
		}
		if name == results.SummaryFile && (!strings.Contains(string(b), "8 / 8") || !strings.Contains(string(b), "| smooth ")) {
			t.Errorf("summary.md:\n%s", b)
		}
	}
}

func TestSecondWorkerFindsTheRunLocked(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	held, err := scheduler.AcquireRun(ctx, rdb, "busy", "gpu-a", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	_, err = Run(ctx, Params{Run: testRun("busy", 4), Dir: t.TempDir(), Redis: rdb, OpenData: openStream, Owner: "gpu-b", LockTTL: 200 * time.Millisecond})
	if !errors.Is(err, scheduler.ErrRunLocked) || !strings.Contains(err.Error(), "gpu-a") {
		t.Fatalf("want scheduler.ErrRunLocked naming gpu-a, got %v", err)
	}
}

// A worker that died holds the run until its lease runs out; the next one
// waits for that rather than failing into a retry back-off.
func TestDeadWorkersLockIsTakenOverAfterItsLease(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	// A killed holder leaves its lock to lapse: the key, never renewed.
	if err := rdb.Set(ctx, scheduler.RunLockKey("orphan"), "1:gpu-a", 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	// The new holder's own lease is longer than the dead one's, so that it
	// waits long enough and its renewals survive a busy machine.
	out, err := Run(ctx, Params{Run: testRun("orphan", 2), Dir: t.TempDir(), Redis: rdb, OpenData: openStream, Owner: "gpu-b", LockTTL: time.Second})
	if err != nil || !out.Done {
		t.Fatalf("takeover after the lease: %+v %v", out, err)
	}
}

func TestDiskGuardStopsTheSegment(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	run := testRun("full", 6)
	run.MinFreeDisk = 10 << 30
	free := func(string) (int64, error) { return 1 << 30, nil }
	_, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, OpenData: openStream, FreeSpace: free})
	if !errors.Is(err, ErrDiskFull) || !strings.Contains(err.Error(), "min_free_disk") || !strings.Contains(err.Error(), "1.0 GiB free") {
		t.Fatalf("want ErrDiskFull naming the space, got %v", err)
	}
	// The lock is released, so the run can be retried once space is freed.
	if _, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, OpenData: openStream}); err != nil {
		t.Fatalf("retry with space: %v", err)
	}

	// With object storage that answers, a disk filled by something else
	// is said to be so: the checkpoint just written, whose upload is under
	// way, is no sign that the store is behind, where the message blamed
	// it.
	obj, _ := newS3(t)
	run2 := testRun("filled", 6)
	run2.MinFreeDisk = 10 << 30
	disk := t.TempDir()
	// Room at the start, none once the first checkpoint is written.
	fills := func(string) (int64, error) {
		if len(localSteps(RunDir(disk, "filled"))) == 0 {
			return 20 << 30, nil
		}
		return 1 << 30, nil
	}
	_, err = Run(ctx, Params{Run: run2, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, FreeSpace: fills, Owner: "gpu-a"})
	if !errors.Is(err, ErrDiskFull) || strings.Contains(err.Error(), "unreachable or behind") || !strings.Contains(err.Error(), "free space on that disk, or lower min_free_disk") {
		t.Fatalf("disk filled with object storage answering: %v; want ErrDiskFull saying to free space, without blaming object storage", err)
	}
	// The run is its wrapper's to name (the worker's "run filled: "),
	// which named it twice.
	if strings.Contains(err.Error(), "run filled") || !strings.Contains(err.Error(), "min_free_disk: "+RunDir(disk, "filled")+" has ") {
		t.Errorf("disk filled: %v; want the run's directory named after the guard's words, and no run named", err)
	}
}

// Cancellation (SIGTERM, `sched cancel`) checkpoints at the next step and
// uploads it before returning. Step 3 is counted (its progress reported)
// once step 4 is queued behind it (the engine runs a step ahead; step 4,
// an evaluation's, is completed at once), so the stop comes at step 4.
func TestCancelledSegmentUploadsItsLastCheckpoint(t *testing.T) {
	rdb := newRedis(t)
	obj, _ := newS3(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := testRun("c", 40)
	run.CheckpointEvery = 100
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream,
		Progress: func(step, total int, m *trainer.Metrics) {
			if step == 3 && m == nil {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) || out.Step != 4 || out.Uploaded != 4 {
		t.Fatalf("cancelled segment: %+v %v", out, err)
	}
	if steps, _ := RemoteSteps(context.Background(), obj, "c"); !reflect.DeepEqual(steps, []int{4}) {
		t.Fatalf("remote checkpoints %v, want [4]", steps)
	}
}

// checkpointLists is the run's object store, counting the listings of its
// checkpoints; everything else goes straight to the store.
type checkpointLists struct {
	Objects
	run string
	mu  sync.Mutex
	n   int
}

func (c *checkpointLists) List(ctx context.Context, prefix string) ([]store.Info, error) {
	if strings.HasPrefix(prefix, CheckpointPrefix(c.run)) {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
	}
	return c.Objects.List(ctx, prefix)
}

func (c *checkpointLists) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// A segment lists the run's checkpoints in object storage once before its
// first step, whether it resumes from its own disk or pulls from object
// storage, and the listing still guides both: the pull, and the disk
// guard's and the upload's idea of what object storage holds.
func TestSegmentListsTheRunsCheckpointsOnceAtItsStart(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("l", 12)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	for i, c := range []struct {
		dir    string
		source string
		from   int
	}{{disk, "", 0}, {disk, "local", 4}, {t.TempDir(), "object storage", 8}} {
		lists := &checkpointLists{Objects: obj, run: "l"}
		atFirstStep := -1
		out, err := Run(ctx, Params{Run: run, Dir: c.dir, Redis: rdb, Objects: lists, OpenData: openStream,
			Progress: func(step, total int, m *trainer.Metrics) {
				if atFirstStep < 0 && m == nil {
					atFirstStep = lists.count()
				}
			}})
		if err != nil || out.ResumeSource != c.source || out.ResumedFrom != c.from || out.Step != c.from+4 || out.Uploaded != c.from+4 {
			t.Fatalf("segment %d: %+v %v; want resumed from step %d (%q), 4 steps trained and uploaded", i+1, out, err, c.from, c.source)
		}
		if atFirstStep != 1 {
			t.Errorf("segment %d (resumed from %q): %d listings of the checkpoints before its first step; want 1", i+1, c.source, atFirstStep)
		}
	}
}

// A damaged checkpoint costs at most the steps since the intact one before
// it, locally or in object storage: a local one is set aside and the same
// step pulled from object storage; one damaged in object storage is passed
// over, with a warning, for the one before. The losses stay the
// uninterrupted run's.
func TestDamagedCheckpointsArePassedOver(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)

	want := referenceLosses(t, ctx, rdb, 8)
	run := testRun("d", 8)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != 4 || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v %v", out, err)
	}

	// The local step 4 is damaged; object storage holds it whole.
	local := filepath.Join(RunDir(disk, "d"), trainer.StepDir(4))
	flip(t, filepath.Join(local, trainer.ModelFile))
	run.Segment.MaxSteps = 2
	var second losses
	core, logs := observer.New(zap.WarnLevel)
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Progress: second.hook, Owner: "gpu-a", Log: zap.New(core)})
	if err != nil || out.ResumedFrom != 4 || out.ResumeSource != "object storage" || out.Step != 6 {
		t.Fatalf("second segment: %+v %v; want it to resume from step 4 pulled from object storage", out, err)
	}
	if w := logs.FilterMessageSnippet("damaged checkpoint set aside").All(); len(w) != 1 || w[0].ContextMap()["checkpoint"] != local {
		t.Errorf("warnings %v; want one naming %s", logs.All(), local)
	}
	if _, err := os.Stat(local + ".damaged"); err != nil {
		t.Errorf("the damaged local checkpoint is not kept aside: %v", err)
	}

	// Object storage's step 6 is damaged and the disk is lost: the run goes
	// on from step 4.
	key := CheckpointPrefix("d") + trainer.StepDir(6) + "/" + trainer.ModelFile
	spoilObject(t, ctx, obj, key)
	var third losses
	core, logs = observer.New(zap.WarnLevel)
	run.Segment.MaxSteps = 4
	out, err = Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Progress: third.hook, Owner: "gpu-b", Log: zap.New(core)})
	if err != nil || out.ResumedFrom != 4 || out.ResumeSource != "object storage" || !out.Done || out.Step != 8 {
		t.Fatalf("third segment: %+v %v; want it to resume from step 4 and finish", out, err)
	}
	if w := logs.FilterMessageSnippet("checkpoint in object storage passed over").All(); len(w) != 1 || w[0].ContextMap()["step"] != int64(6) {
		t.Errorf("warnings %v; want one naming step 6", logs.All())
	}
	for step := 5; step <= 8; step++ {
		if step <= 6 && second.m[step] != want.m[step] {
			t.Errorf("second segment, step %d: loss %v, uninterrupted %v", step, second.m[step], want.m[step])
		}
		if third.m[step] != want.m[step] {
			t.Errorf("third segment, step %d: loss %v, uninterrupted %v", step, third.m[step], want.m[step])
		}
	}
	// Step 6 was uploaded again, whole.
	dir, step, err := PullNewest(ctx, obj, "d", 5, t.TempDir(), func(step int, err error) { t.Errorf("step %d damaged: %v", step, err) })
	if err != nil || step != 8 || dir == "" {
		t.Errorf("newest in object storage: step %d %v", step, err)
	}
	if _, err := Pull(ctx, obj, "d", 6, t.TempDir()); err != nil {
		t.Errorf("step 6 uploaded again: %v", err)
	}
}

// flip changes two bytes of path in place, keeping its size.
func flip(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, 400); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^b[0], ^b[1]}, 400); err != nil {
		t.Fatal(err)
	}
}

// spoilObject replaces key with its bytes, two of them flipped.
func spoilObject(t *testing.T, ctx context.Context, obj Objects, key string) {
	t.Helper()
	b := readObject(t, ctx, obj, key)
	b[400], b[401] = ^b[400], ^b[401]
	putObject(t, ctx, obj, key, b)
}

// A checkpoint in object storage that is a partial copy (a file cut short,
// a file missing, an empty marker) is passed over for the one before, as a
// damaged one is; the segment that resumes takes the one before and trains
// on with the uninterrupted run's losses.
func TestPartialCheckpointInObjectStorageIsPassedOver(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	want := referenceLosses(t, ctx, rdb, 8)
	run := testRun("p", 8)
	run.Segment.MaxSteps = 6
	if out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != 6 || out.Uploaded != 6 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	// The one before step 6 in object storage: step 4, unless step 6 took
	// its place while step 2 still uploaded (training never waits for
	// uploads); retention keeps the last two.
	steps, err := RemoteSteps(ctx, obj, "p")
	if err != nil || len(steps) != 2 || steps[1] != 6 {
		t.Fatalf("object storage holds steps %v (%v); want two, the newest 6", steps, err)
	}
	prev := steps[0]
	prefix := CheckpointPrefix("p") + trainer.StepDir(6) + "/"
	whole := readObject(t, ctx, obj, prefix+trainer.ModelFile)
	marker := readObject(t, ctx, obj, prefix+MarkerFile)
	for _, c := range []struct {
		name  string
		spoil func()
		want  string
	}{
		{"a file cut short", func() { putObject(t, ctx, obj, prefix+trainer.ModelFile, whole[:len(whole)/2]) }, "the marker says"},
		{"a file missing", func() {
			if err := obj.Delete(ctx, prefix+trainer.ModelFile); err != nil {
				t.Fatal(err)
			}
		}, "not found"},
		{"an empty marker", func() {
			putObject(t, ctx, obj, prefix+trainer.ModelFile, whole)
			putObject(t, ctx, obj, prefix+MarkerFile, nil)
		}, "unexpected end of JSON input"},
		// Read whole, and cut short where it was written: no transfer
		// failure to retry, where the segment failed and was retried
		// until it was archived.
		{"a marker cut short", func() { putObject(t, ctx, obj, prefix+MarkerFile, marker[:len(marker)/2]) }, "unexpected end of JSON input"},
	} {
		c.spoil()
		var passed []string
		dir, step, err := PullNewest(ctx, obj, "p", -1, t.TempDir(), func(step int, err error) {
			passed = append(passed, fmt.Sprintf("%d: %v", step, err))
		})
		if err != nil || step != prev || dir == "" {
			t.Errorf("%s: PullNewest gave step %d, %v; want step %d", c.name, step, err, prev)
		}
		if len(passed) != 1 || !strings.HasPrefix(passed[0], "6: ") || !strings.Contains(passed[0], c.want) {
			t.Errorf("%s: passed over %q, want step 6 with %q", c.name, passed, c.want)
		}
	}
	// The segment that resumes on a new disk: from the one before, the
	// same losses.
	var resumed losses
	run.Segment.MaxSteps = 0
	out, err := Run(ctx, Params{Run: run, Dir: t.TempDir(), Redis: rdb, Objects: obj, OpenData: openStream, Progress: resumed.hook, Owner: "gpu-b"})
	if err != nil || out.ResumedFrom != prev || !out.Done {
		t.Fatalf("resumed segment: %+v %v; want it to resume from step %d and finish", out, err, prev)
	}
	for step := prev + 1; step <= 8; step++ {
		if resumed.m[step] != want.m[step] {
			t.Errorf("step %d: loss %v, uninterrupted %v", step, resumed.m[step], want.m[step])
		}
	}
}

func readObject(t *testing.T, ctx context.Context, obj Objects, key string) []byte {
	t.Helper()
	r, err := obj.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func putObject(t *testing.T, ctx context.Context, obj Objects, key string, b []byte) {
	t.Helper()
	if err := obj.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
		t.Fatal(err)
	}
}

// Below min_free_disk when a segment starts, the guard first removes the
// local checkpoints that object storage already holds (never the newest),
// and the segment trains on if that was enough.
func TestDiskGuardFreesUploadedCheckpointsAtTheStart(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("g", 8)
	run.Segment.MaxSteps = 6
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Uploaded != 6 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	older := filepath.Join(RunDir(disk, "g"), trainer.StepDir(4))
	if _, err := os.Stat(older); err != nil {
		t.Fatalf("the first segment left no local step 4: %v", err)
	}
	// The disk is short of space while the older checkpoint is there.
	run.MinFreeDisk = 10 << 30
	free := func(string) (int64, error) {
		if _, err := os.Stat(older); err == nil {
			return 1 << 30, nil
		}
		return 20 << 30, nil
	}
	core, logs := observer.New(zap.WarnLevel)
	run.Segment.MaxSteps = 0
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a", FreeSpace: free, Log: zap.New(core)})
	if err != nil || out.ResumedFrom != 6 || !out.Done {
		t.Fatalf("second segment: %+v %v; want the guard to free step 4 and the run to finish", out, err)
	}
	if w := logs.FilterMessageSnippet("disk guard removed an uploaded local checkpoint").All(); len(w) != 1 || w[0].ContextMap()["step"] != int64(4) {
		t.Errorf("warnings %v; want one naming step 4", logs.All())
	}
}

// A run whose last checkpoint could not be uploaded (object storage down at
// the end) is not done until it is: the segment fails, and the next one,
// which resumes from that local checkpoint and has no step left to train,
// uploads it.
func TestLastCheckpointIsUploadedByTheNextSegment(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, srv := newS3(t)
	run := testRun("last", 8)
	disk := t.TempDir()
	stopped := false
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a",
		Progress: func(step, total int, m *trainer.Metrics) {
			if m != nil && step == 7 && !stopped {
				stopped = true
				srv.Stop() // before step 8's checkpoint
			}
		}})
	if err == nil || out.Uploaded == 8 {
		t.Fatalf("first segment with object storage down at the end: %+v %v; want its last upload to fail", out, err)
	}
	srv.Start()
	out, err = Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream, Owner: "gpu-a"})
	if err != nil || !out.Done || out.ResumedFrom != 8 || out.Uploaded != 8 {
		t.Fatalf("second segment: %+v %v; want it to resume from the local step 8 and upload it", out, err)
	}
	steps, err := RemoteSteps(ctx, obj, "last")
	if err != nil || len(steps) == 0 || steps[len(steps)-1] != 8 {
		t.Fatalf("object storage holds steps %v (%v), want 8 the newest", steps, err)
	}
	if _, err := Pull(ctx, obj, "last", 8, t.TempDir()); err != nil {
		t.Errorf("step 8 in object storage: %v", err)
	}
}

// A holder whose lease lapsed (a worker that froze past it) writes nothing
// into a checkpoint the newer holder marked complete: its push is refused
// before its first file, and the newer holder's checkpoint pulls whole.
func TestFencedOutHolderLeavesACompleteCheckpointAlone(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	// Two different step-2 checkpoints: the stale holder's and the new one's.
	dirs := map[string]string{}
	for owner, seed := range map[string]uint64{"a": 5, "b": 6} {
		run := testRun("f-"+owner, 2)
		run.Seed = seed
		disk := t.TempDir()
		if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, OpenData: openStream}); err != nil || !out.Done {
			t.Fatalf("checkpoint %s: %+v %v", owner, out, err)
		}
		dirs[owner] = filepath.Join(RunDir(disk, "f-"+owner), trainer.StepDir(2))
	}
	stale, err := scheduler.AcquireRun(ctx, rdb, "f", "gpu-a", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its lease is gone (released here; lapsed in life) while it holds on.
	if err := stale.Release(ctx); err != nil {
		t.Fatal(err)
	}
	holder, err := scheduler.AcquireRun(ctx, rdb, "f", "gpu-b", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	if _, err := Push(ctx, obj, holder, "f", dirs["b"]); err != nil {
		t.Fatalf("the holder's push: %v", err)
	}
	want := readObject(t, ctx, obj, CheckpointPrefix("f")+trainer.StepDir(2)+"/"+trainer.ModelFile)
	if _, err := Push(ctx, obj, stale, "f", dirs["a"]); !errors.Is(err, scheduler.ErrRunLockLost) {
		t.Fatalf("the stale holder's push: %v, want ErrRunLockLost", err)
	}
	if got := readObject(t, ctx, obj, CheckpointPrefix("f")+trainer.StepDir(2)+"/"+trainer.ModelFile); !bytes.Equal(got, want) {
		t.Error("the stale holder overwrote the complete checkpoint's weights")
	}
	if _, err := Pull(ctx, obj, "f", 2, t.TempDir()); err != nil {
		t.Errorf("the complete checkpoint after the stale push: %v", err)
	}
}

// What a pull cut off by a kill left (its temporary directory, up to a
// whole checkpoint) is removed when the run's next segment starts.
func TestInterruptedPullIsRemoved(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	disk := t.TempDir()
	stale := filepath.Join(RunDir(disk, "p"), ".pull-step-123")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(stale, trainer.ModelFile), make([]byte, 1000), 0o644)
	if out, err := Run(ctx, Params{Run: testRun("p", 2), Dir: disk, Redis: rdb, OpenData: openStream}); err != nil || !out.Done {
		t.Fatalf("segment: %+v %v", out, err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the interrupted pull's directory is still there: %v", err)
	}
}

// referenceLosses are the logged losses of testRun's run of steps steps,
// uninterrupted, in one segment.
func referenceLosses(t *testing.T, ctx context.Context, rdb *redis.Client, steps int) *losses {
	t.Helper()
	var want losses
	if out, err := Run(ctx, Params{Run: testRun("ref", steps), Dir: t.TempDir(), Redis: rdb, OpenData: openStream, Progress: want.hook}); err != nil || !out.Done {
		t.Fatalf("reference run: %+v %v", out, err)
	}
	return &want
}

// A run whose checkpoints on this machine are all damaged, with none
// whole in object storage (here: none there at all), is not trained from
// step 0 over its history: the segment stops for good saying so, the
// damaged ones set aside, and the next enqueue starts the run over.
func TestEveryCheckpointDamagedAndNoneRemoteStopsTheSegment(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	run := testRun("gone", 8)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.Step != 4 {
		t.Fatalf("first segment: %+v %v", out, err)
	}
	steps, _ := filepath.Glob(filepath.Join(RunDir(disk, "gone"), "step-*"))
	if len(steps) == 0 {
		t.Fatal("the first segment left no checkpoint")
	}
	for _, d := range steps {
		flip(t, filepath.Join(d, trainer.ModelFile))
	}
	out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, OpenData: openStream, Owner: "gpu-a"})
	var bad interface{ BadInput() bool }
	if err == nil || !errors.As(err, &bad) || !bad.BadInput() || !strings.Contains(err.Error(), "every checkpoint in") ||
		!strings.Contains(err.Error(), "sched enqueue train gone") {
		t.Fatalf("second segment: %+v, %v; want it stopped for good, naming how to start over", out, err)
	}
	for _, d := range steps {
		if _, err := os.Stat(d + ".damaged"); err != nil {
			t.Errorf("%s not set aside: %v", d, err)
		}
	}
	// Enqueued again, the run starts over.
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, OpenData: openStream, Owner: "gpu-a"}); err != nil || out.ResumedFrom != 0 || out.Step != 4 {
		t.Fatalf("third segment: %+v %v; want the run started over", out, err)
	}
}

// A run is held to the bench row of as many GPUs as it trains on: for
// gpus: all, the GPUs its segment found, since a sweep on a host of
// several holds a row for one GPU beside theirs.
func TestTheThroughputGateReadsTheRowOfTheRunsGPUs(t *testing.T) {
	for _, c := range []struct {
		configured trainer.GPUCount
		devices    int
		want       int
	}{
		{0, 1, 1},
		{0, 0, 1},
		{2, 2, 2},
		{trainer.GPUCount(model.AllGPUs), 2, 2},
		{trainer.GPUCount(model.AllGPUs), 1, 1},
		// No engine started: any row of the shape.
		{trainer.GPUCount(model.AllGPUs), 0, 0},
	} {
		if got := benchGPUs(c.configured, c.devices); got != c.want {
			t.Errorf("gpus %v on %d device(s): the row of %d GPU(s), want %d", c.configured, c.devices, got, c.want)
		}
	}
}

// A segment whose run directory another process still trains in (a
// segment whose worker lost the run's lock and has not ended) says so in
// a segment's words, where it said to train into another directory with
// --out, which a segment has not.
func TestASegmentWhoseRunDirectoryIsHeldSaysWhoHoldsIt(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	disk := t.TempDir()
	dir := RunDir(disk, "held")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := pidlock.Lock(filepath.Join(dir, trainer.RunDirLockFile), false)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, err = Run(ctx, Params{Run: testRun("held", 6), Dir: disk, Redis: rdb, OpenData: openStream})
	want := fmt.Sprintf("run held: its directory %s on this machine is held by another process (pid %d), a segment of the run that has not ended", dir, os.Getpid())
	var busy *trainer.RunDirBusyError
	if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "--out") || !errors.As(err, &busy) {
		t.Fatalf("segment of a run whose directory is held: %v; want %q, without --out", err, want)
	}
}

// After Redis lost its data, a segment records at its start the newest
// checkpoint object storage holds, where the run's state said it had none
// (`sched status`: "no checkpoint yet") until the segment's first upload,
// hours away at the pilot's checkpoint interval.
func TestASegmentAfterRedisLostItsDataRecordsTheNewestCheckpointAtOnce(t *testing.T) {
	ctx := context.Background()
	rdb := newRedis(t)
	obj, _ := newS3(t)
	run := testRun("lostdata", 1_000_000)
	run.Segment.MaxSteps = 4
	disk := t.TempDir()
	if out, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream}); err != nil || out.Uploaded != 4 {
		t.Fatalf("first segment: %+v, %v", out, err)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	run.CheckpointEvery = 1000 // no upload during the second segment
	var at5 scheduler.RunState
	var read error
	_, err := Run(ctx, Params{Run: run, Dir: disk, Redis: rdb, Objects: obj, OpenData: openStream,
		Progress: func(step, total int, m *trainer.Metrics) {
			if step == 5 && m == nil {
				at5, _, read = scheduler.ReadRunState(ctx, rdb, "lostdata")
			}
		}})
	if err != nil || read != nil || at5.Checkpoint != 4 {
		t.Fatalf("the run's state at the second segment's first step: %+v, %v, %v; want checkpoint 4 recorded", at5, read, err)
	}
}

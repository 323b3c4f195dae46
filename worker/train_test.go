package worker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	tokstore "github.com/kiln-lm/kiln/tokens"
	"github.com/kiln-lm/kiln/tokens/catalog"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// patternData is a deterministic token stream with a learnable repeat,
// used in place of a token store so these tests need no ingest.
type patternData struct{ next int }

func (d *patternData) batch(first, b, t int) model.Batch {
	mb := model.Batch{B: b, T: t}
	for i := 0; i < b; i++ {
		x := uint64(first+i)*0x9e3779b97f4a7c15 + 1
		prev := int32(2)
		for j := 0; j <= t; j++ {
			x = x*6364136223846793005 + 1442695040888963407
			id := int32((x>>40)%61) + 2
			if j%2 == 1 {
				id = prev
			}
			if j < t {
				mb.Inputs = append(mb.Inputs, id)
			}
			if j > 0 {
				mb.Targets = append(mb.Targets, id)
			}
			prev = id
		}
	}
	return mb
}

func (d *patternData) Next(_ context.Context, b, t int) (model.Batch, error) {
	mb := d.batch(d.next, b, t)
	d.next += b
	return mb, nil
}
func (d *patternData) Eval(_ context.Context, i, b, t int) (model.Batch, error) {
	return d.batch(1<<20+i*b, b, t), nil
}
func (d *patternData) Cursor() (json.RawMessage, error) { return json.Marshal(d.next) }
func (d *patternData) Seek(c json.RawMessage) error     { return json.Unmarshal(c, &d.next) }
func (d *patternData) Close() error                     { return nil }

// publishTestTokenizer learns a small tokenizer and publishes it, as
// `sched enqueue tokenizer` does, from a data directory of its own.
func publishTestTokenizer(t *testing.T, objects store.Store) string {
	t.Helper()
	corpus := strings.Repeat("func main() { return x + y } the quick brown fox jumps over the lazy dog\n", 100)
	b, err := tokenizer.Train(context.Background(), []io.Reader{strings.NewReader(corpus)}, tokenizer.TrainOptions{VocabSize: 300})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := catalog.New(objects, t.TempDir()).Publish(context.Background(), "train-test-bpe", b); err != nil {
		t.Fatal(err)
	}
	return "train-test-bpe"
}

// patternRun is a tiny CPU run over patternData: total steps at lr, with
// evaluations and checkpoints every evalEvery and ckptEvery steps.
func patternRun(name, tok string, lr float64, total, evalEvery, ckptEvery int) runs.Run {
	return runs.Run{
		Name: name, Tokenizer: tok,
		RunConfig: trainer.RunConfig{Model: "tiny", Seq: 16, Batch: 2, Accumulate: 1, LR: lr, Warmup: 1, TotalSteps: total,
			LogEvery: 1, EvalEvery: evalEvery, EvalBatches: 1, CheckpointEvery: ckptEvery, Seed: 3, Engine: "cpu", Precision: "fp32",
			Mixture: []trainer.MixtureEntry{{Store: "pattern", Weight: 1}}},
		Retention: runs.Retention{KeepLast: 1},
	}
}

// trainPattern configures training of run on patternData and starts a
// worker serving the gpu queue.
func (e *env) trainPattern(objects store.Store, run runs.Run) {
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Runs: runs.Set{run.Name: run}, Dir: e.t.TempDir(), Owner: "gpu-test",
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil },
		Log:      zap.NewNop(),
	}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
}

// A run enqueued once trains as a chain of segments, each queuing the
// next, until the run is done; checkpoints and results land in the store.
func TestTrainSegmentsChainUntilTheRunIsDone(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	run := patternRun("chain", tokName, 1e-3, 9, 3, 3)
	run.Segment = runs.Segment{MaxSteps: 3}
	e.trainPattern(objects, run)

	// A bench figure for the run's shape feeds its tok/s gate.
	tiny := model.Presets["tiny"]
	row := fmt.Sprintf(`{"model":"tiny","vocab":%d,"d_model":%d,"layers":%d,"batch":2,"seq":16,"tok_per_sec":1,"gpu_idle":true}`+"\n",
		tiny.VocabSize, tiny.Hidden, tiny.Layers)
	if err := objects.Put(context.Background(), BenchKey, strings.NewReader(row), int64(len(row))); err != nil {
		t.Fatal(err)
	}
	first := e.enqueue(scheduler.TrainSegment{Run: "chain"})
	e.waitFor(first, time.Minute, "completed", state("completed"))
	deadline := time.Now().Add(2 * time.Minute)
	for {
		// The last segment records done once its uploads, retention and
		// results are finished; the checkpoint alone is recorded before
		// retention prunes the older ones.
		st := e.rdb.HGetAll(context.Background(), scheduler.RunStateKey("chain")).Val()
		if st["checkpoint"] == "9" && st["step"] == "9" && st["done"] == "true" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run not finished through the queue; state %v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	steps, err := segment.RemoteSteps(context.Background(), objects, "chain")
	if err != nil || len(steps) != 1 || steps[0] != 9 {
		t.Fatalf("checkpoints in the store: %v %v (retention keeps the last one)", steps, err)
	}
	for _, name := range []string{"metrics.jsonl", "summary.md", "loss.svg"} {
		if _, err := objects.Stat(context.Background(), "results/chain/"+name); err != nil {
			t.Errorf("results/chain/%s: %v", name, err)
		}
	}
	r, err := objects.Get(context.Background(), "results/chain/summary.md")
	if err != nil {
		t.Fatal(err)
	}
	md, _ := io.ReadAll(r)
	r.Close()
	if !strings.Contains(string(md), "against 1 in bench") {
		t.Errorf("the tok/s gate did not use the bench figure:\n%s", md)
	}
	// Three segments ran: from 0, from 3 and from 6.
	for _, from := range []int64{3, 6} {
		info, err := e.c.Enqueue(context.Background(), scheduler.TrainSegment{Run: "chain", Tokenizer: tokName, FromStep: from, TotalSteps: 9})
		if err == nil {
			t.Errorf("segment from step %d was not queued by its predecessor (enqueued anew as %s)", from, info.ID)
		}
	}
}

func TestTrainSegmentOfAnUnknownRunIsArchived(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Runs: runs.Presets(), Dir: t.TempDir(),
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	id := e.enqueue(scheduler.TrainSegment{Run: "no-such-run"})
	ts := e.waitFor(id, 30*time.Second, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, `unknown run "no-such-run"`) || !strings.Contains(ts.LastErr, "pilot") ||
		!strings.Contains(ts.LastErr, "then 'sched enqueue train no-such-run'") {
		t.Fatalf("archived with %q; want the unknown run named, the choices listed and how to go on", ts.LastErr)
	}
	// Without Runs, the runs file named by KILN_RUNS is read per task; a
	// broken one archives the task with the file's error.
	bad := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(bad, []byte("pilot:\n  learning_rate: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KILN_RUNS", bad)
	e = newEnv(t)
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Dir: t.TempDir(),
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	id = e.enqueue(scheduler.TrainSegment{Run: "pilot"})
	ts = e.waitFor(id, 30*time.Second, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, "this worker's KILN_RUNS") || !strings.Contains(ts.LastErr, "learning_rate") ||
		!strings.Contains(ts.LastErr, "mend it on the worker, then 'sched enqueue train pilot'") {
		t.Fatalf("archived with %q; want the runs file's error and how to go on", ts.LastErr)
	}
	// A run under way waits, using no retry, where its file does not read
	// (caught as it is written) or lacks its entry, and goes on once it is
	// mended: it is not archived for good.
	id = e.enqueue(scheduler.TrainSegment{Run: "pilot", FromStep: 100})
	ts = e.waitFor(id, 30*time.Second, "waiting on the runs file", func(ts scheduler.TaskStatus) bool {
		return ts.HasProgress && ts.Progress.State == "waiting" || ts.State == "archived"
	})
	if ts.State == "archived" || ts.Retried != 0 || !strings.Contains(ts.Progress.Message, "this worker's KILN_RUNS to read") ||
		!strings.Contains(ts.Progress.Message, "learning_rate") || !strings.Contains(ts.Progress.Message, "the run goes on from step 100 once it reads") {
		t.Fatalf("a run under way with a runs file that does not read: %s, retried %d, %q (%q); want it waiting, saying why", ts.State, ts.Retried, ts.Progress.Message, ts.LastErr)
	}
	if _, err := e.c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("other:\n  from: pilot\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id = e.enqueue(scheduler.TrainSegment{Run: "gone", FromStep: 100})
	ts = e.waitFor(id, 30*time.Second, "waiting on the run's entry", func(ts scheduler.TaskStatus) bool {
		return ts.HasProgress && ts.Progress.State == "waiting" || ts.State == "archived"
	})
	if ts.State == "archived" || ts.Retried != 0 || !strings.Contains(ts.Progress.Message, "run gone's entry in this worker's runs file") {
		t.Fatalf("a run under way whose entry is gone: %s, retried %d, %q (%q); want it waiting, saying why", ts.State, ts.Retried, ts.Progress.Message, ts.LastErr)
	}
}

// cpuBench measures a shape with the engine the spec names, the CPU
// engine where it names none or auto, two timed steps, through the same
// trainer.Bench that `sched worker` uses on the GPU.
func cpuBench(ctx context.Context, b BenchSpec) (results.BenchRow, error) {
	s := b.Shape
	c, err := s.Config()
	if err != nil {
		return results.BenchRow{}, err
	}
	engine := b.Engine
	if engine == "" || engine == "auto" {
		engine = "cpu"
	}
	r, err := trainer.Bench(ctx, trainer.BenchOptions{Model: c, Engine: engine, Precision: "fp32", Batch: s.Batch, Seq: s.Seq, Steps: 2})
	if err != nil {
		return results.BenchRow{}, err
	}
	return results.Row(s.Model, c, s.Batch, s.Seq, r), nil
}

func TestBenchRunAppendsRows(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A worker of every GPU whose measurement found one measures each
	// shape once: a second, one-GPU row is for the scaling of several.
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Runs: runs.Presets(), Dir: t.TempDir(), Bench: cpuBench,
		GPUs:    trainer.GPUCount(model.AllGPUs),
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	for _, seq := range []string{"16", "32"} {
		id := e.enqueue(scheduler.BenchRun{Model: "tiny", Engine: "cpu", Params: map[string]string{"batch": "1", "seq": seq}})
		e.waitFor(id, time.Minute, "completed", state("completed"))
	}
	r, err := objects.Get(context.Background(), BenchKey)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := results.ReadBench(r)
	r.Close()
	if err != nil || len(rows) != 2 || rows[0].Seq != 16 || rows[1].Seq != 32 || rows[0].TokPerSec <= 0 || rows[0].Vocab != 4096 {
		t.Fatalf("rows %+v %v", rows, err)
	}
	id := e.enqueue(scheduler.BenchRun{Sweep: "nonsense"})
	if ts := e.waitFor(id, 30*time.Second, "archived", state("archived")); !strings.Contains(ts.LastErr, `unknown sweep "nonsense"`) {
		t.Fatalf("unknown sweep archived with %q", ts.LastErr)
	}
	id = e.enqueue(scheduler.BenchRun{Model: "tiny", Params: map[string]string{"batch": "many"}})
	if ts := e.waitFor(id, 30*time.Second, "archived", state("archived")); !strings.Contains(ts.LastErr, `batch "many"`) {
		t.Fatalf("bad batch archived with %q", ts.LastErr)
	}
}

// `sched cancel` on a training segment checkpoints at the step boundary,
// uploads that checkpoint, archives the task so that it never runs again,
// and queues no next segment.
func TestCancelledSegmentCheckpointsAndStopsTheChain(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	e.trainPattern(objects, patternRun("long-one", tokName, 1e-3, 100000, 50, 1000))

	id := e.enqueue(scheduler.TrainSegment{Run: "long-one"})
	deadline := time.Now().Add(time.Minute)
	for e.rdb.HGet(context.Background(), scheduler.RunStateKey("long-one"), "step").Val() == "" {
		if time.Now().After(deadline) {
			t.Fatal("training did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Cancel returns once the task has left the active state and is
	// archived: asynq alone would have moved it to retry, and the segment
	// would have run again after its back-off.
	if st, err := e.c.Cancel(context.Background(), id); err != nil || st != "cancelled" {
		t.Fatalf("cancel: %q, %v; want cancelled", st, err)
	}
	if ts, err := e.c.Task(context.Background(), id); err != nil || ts.State != "archived" {
		t.Fatalf("cancelled segment is %q (%v); want archived so that it never runs again", ts.State, err)
	}
	// The handler sees its context end, and the trainer writes a checkpoint
	// at the step boundary that the segment uploads before returning.
	var stopped string
	var steps []int
	deadline = time.Now().Add(time.Minute)
	for {
		st := e.rdb.HGetAll(context.Background(), scheduler.RunStateKey("long-one")).Val()
		steps, err = segment.RemoteSteps(context.Background(), objects, "long-one")
		if err == nil && len(steps) == 1 && st["done"] == "false" && fmt.Sprint(steps[0]) == st["step"] {
			stopped = st["step"]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint of the stop step uploaded: state %v, checkpoints %v %v", st, steps, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// No next segment was queued: the one from the stop step is not a
	// duplicate.
	from, _ := strconv.Atoi(stopped)
	if _, err := e.c.Enqueue(context.Background(), scheduler.TrainSegment{Run: "long-one", Tokenizer: tokName, FromStep: int64(from), TotalSteps: 100000}); err != nil {
		t.Fatalf("a next segment from step %d was already queued: %v", from, err)
	}
}

// A segment's tokenizer is resolved by name: a name nothing holds, or
// token stores made by another tokenizer than the run's, archive the task
// at once with a message naming them, before any step.
func TestTrainSegmentRefusesAnotherTokenizer(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	tokens := t.TempDir()
	a, err := tokstore.OpenAppender(context.Background(), filepath.Join(tokens, "other"),
		tokstore.Tokenizer{Name: "other-bpe", SHA256: strings.Repeat("cd", 32), VocabSize: 300}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, 5000)
	for i := range ids[:len(ids)-1] {
		ids[i] = uint32(1 + i%250)
	}
	if _, err := a.Append(context.Background(), tokstore.ShardInfo{ID: "s0"}, bytes.NewReader(tokstore.Encode(nil, tokstore.DtypeFor(300), ids))); err != nil {
		t.Fatal(err)
	}
	a.Close()
	run := runs.Run{
		Name: "pinned", Tokenizer: tokName,
		RunConfig: trainer.RunConfig{Model: "tiny", Seq: 16, Batch: 2, Accumulate: 1, LR: 1e-3, Warmup: 1, TotalSteps: 4,
			LogEvery: 1, CheckpointEvery: 4, Seed: 3, Engine: "cpu", Precision: "fp32",
			Mixture: []trainer.MixtureEntry{{Store: "other", Weight: 1}}},
		Retention: runs.Retention{KeepLast: 1},
	}
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Runs: runs.Set{"pinned": run}, Dir: t.TempDir(), TokensDir: tokens,
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	id := e.enqueue(scheduler.TrainSegment{Run: "pinned", Tokenizer: "never-published"})
	ts := e.waitFor(id, 30*time.Second, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, "never-published") || !strings.Contains(ts.LastErr, tokName) {
		t.Fatalf("unknown tokenizer archived with %q; want the name and the known ones", ts.LastErr)
	}
	id = e.enqueue(scheduler.TrainSegment{Run: "pinned"})
	ts = e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.Contains(ts.LastErr, "other-bpe") || !strings.Contains(ts.LastErr, tokName) || !strings.Contains(ts.LastErr, "their ids mean different text") {
		t.Fatalf("store of another tokenizer archived with %q; want both tokenizers named", ts.LastErr)
	}
	if st := e.rdb.HGet(context.Background(), scheduler.RunStateKey("pinned"), "step").Val(); st != "" && st != "0" {
		t.Fatalf("the run trained to step %s on a store of another tokenizer", st)
	}
}

// A run whose loss diverges is archived at its first failure, naming the
// step: a retry would train from the same checkpoint into the same NaN.
func TestTrainSegmentDivergedRunIsArchivedNotRetried(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	e.trainPattern(objects, patternRun("diverge", tokName, 1e30, 20, 10, 2))
	id := e.enqueue(scheduler.TrainSegment{Run: "diverge"})
	st := e.waitFor(id, time.Minute, "archived", state("archived"))
	if st.Retried != 0 || !strings.Contains(st.LastErr, "training diverged") || !strings.Contains(st.LastErr, "step ") {
		t.Fatalf("diverged run: retried %d, last error %q; want archived at once with an error naming the step", st.Retried, st.LastErr)
	}
}

// A segment queued while its tokenizer is being made, or while its store is
// being ingested, waits for them, without using a retry, and trains once
// they are done: the README's day can be typed in one go.
func TestASegmentWaitsForItsTokenizerAndStores(t *testing.T) {
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	run := patternRun("waits", tokName, 1e-3, 2, 0, 2)
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Runs: runs.Set{run.Name: run}, Dir: e.t.TempDir(), Owner: "gpu-test",
		Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil },
		Queue:    e.c, WaitEvery: 50 * time.Millisecond, Log: zap.NewNop(),
	}
	// Nobody serves the ingest and append queues: the work stays queued
	// until the test cancels it, as if it finished.
	sample := e.enqueue(scheduler.TokenizerSample{Name: tokName, Dataset: "d"})
	shard := e.enqueue(scheduler.IngestShard{Dataset: "d", Path: "a", Store: "pattern", Tokenizer: tokName})
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	seg := e.enqueue(scheduler.TrainSegment{Run: "waits"})

	waiting := func(what string) func(scheduler.TaskStatus) bool {
		return func(ts scheduler.TaskStatus) bool { return strings.Contains(ts.LastErr, "waiting for "+what) }
	}
	e.waitFor(seg, time.Minute, "waiting for its tokenizer", waiting("tokenizer "+tokName))
	if _, err := e.c.Cancel(context.Background(), sample); err != nil {
		t.Fatal(err)
	}
	e.waitFor(seg, time.Minute, "waiting for its store", waiting("the ingest of token store pattern (1 task left)"))
	if _, err := e.c.Cancel(context.Background(), shard); err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(seg, time.Minute, "completed", state("completed"))
	if ts.Retried != 0 {
		t.Errorf("the segment used %d retries waiting; want none", ts.Retried)
	}
	if st := e.rdb.HGet(context.Background(), scheduler.RunStateKey("waits"), "done").Val(); st != "true" {
		t.Errorf("run state done=%q; want the run trained to its end", st)
	}
}

// A run whose store lacks files whose ingest failed for good (an append
// archived) trains on what the store holds, and the worker's log says so,
// naming the store and what to retry; a store with nothing failed gets no
// warning.
func TestRunOnAPartlyIngestedStoreIsWarned(t *testing.T) {
	ctx := context.Background()
	addr := testsvc.Redis(t)
	q := scheduler.NewClient(asynq.RedisClientOpt{Addr: addr})
	defer q.Close()
	info, err := q.Enqueue(ctx, scheduler.IngestAppend{Store: "code", ShardID: "f1", Dataset: "local:/src/*", Source: "/src/a.jsonl"})
	if err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: addr})
	defer insp.Close()
	if err := insp.ArchiveTask(info.Queue, info.ID); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.WarnLevel)
	warnPartialStores(ctx, q, "pilot", []trainer.MixtureEntry{{Store: "code", Weight: 1}, {Store: "web", Weight: 1}}, zap.New(core))
	w := logs.All()
	if len(w) != 1 || !strings.Contains(w[0].Message, "run pilot trains on part of token store code: the ingest of 1 file failed for good") ||
		!strings.Contains(w[0].Message, "sched retry") {
		t.Fatalf("warnings %v; want one naming store code, its failed file and sched retry", w)
	}
}

// A run over a store that kiln, upgraded mid-ingest, left short is warned
// with what adds the rest: the files whose tasks an older kiln queued (the
// upgraded worker refused them) by the ingest enqueued again, not by
// 'sched retry', which queues the same payload to be refused again. A file
// the ingest enqueued again appended is not counted, though a 'sched
// retry' of its refused append was refused again after. The warning read
// "the ingest of 3 files failed ...; 'sched retry <task-id>' adds them".
func TestRunOnAStoreAnOlderKilnLeftShortIsWarnedToEnqueueItAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// This build's append, a test's: f3's fails for good, others complete.
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(func(ctx context.Context, a scheduler.IngestAppend) error {
		if a.ShardID == "f3" {
			return fmt.Errorf("append %s to token store %s: the disk is damaged (%w)", a.ShardID, a.Store, asynq.SkipRetry)
		}
		return nil
	}))
	e.serve(map[string]int{scheduler.QueueAppend: 1})
	ctx := context.Background()
	raw := asynq.NewClient(e.opt)
	defer raw.Close()
	p, _ := scheduler.PolicyFor(scheduler.KindIngestAppend)
	olderKiln := func(a scheduler.IngestAppend) string {
		b, err := scheduler.Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		var env map[string]json.RawMessage
		if err := json.Unmarshal(b, &env); err != nil {
			t.Fatal(err)
		}
		env["v"] = json.RawMessage(strconv.Itoa(p.Version - 1))
		if b, err = json.Marshal(env); err != nil {
			t.Fatal(err)
		}
		// Its id as every kiln gives it: its kind and payload's hash
		// (scheduler.TaskID), which 'sched retry' finds it by.
		h := sha256.Sum256(append(append([]byte(a.Kind()), 0), b...))
		id := a.Kind() + ":" + hex.EncodeToString(h[:10])
		info, err := raw.EnqueueContext(ctx, asynq.NewTask(a.Kind(), b, asynq.TaskID(id), asynq.Queue(scheduler.QueueAppend),
			asynq.MaxRetry(10), asynq.Retention(time.Hour)))
		if err != nil {
			t.Fatal(err)
		}
		return info.ID
	}
	refused := func(id string) {
		e.waitFor(id, 20*time.Second, "refused as an older kiln's", func(ts scheduler.TaskStatus) bool {
			return ts.State == "archived" && strings.Contains(ts.LastErr, "an older kiln queued it")
		})
	}
	file := func(id string) scheduler.IngestAppend {
		return scheduler.IngestAppend{Store: "code", ShardID: id, Dataset: "local:/src/*", Source: "/src/" + id + ".jsonl", Tokens: 10}
	}
	old1, old2 := olderKiln(file("f1")), olderKiln(file("f2"))
	refused(old1)
	refused(old2)
	// The ingest enqueued again: f1 is appended, f3 fails at this
	// build's version.
	e.waitFor(e.enqueue(file("f1")), 20*time.Second, "completed", state("completed"))
	e.waitFor(e.enqueue(file("f3")), 20*time.Second, "archived", state("archived"))
	// Then 'sched retry' of f1's refused append: refused again.
	if _, err := e.c.Retry(ctx, old1); err != nil {
		t.Fatal(err)
	}
	refused(old1)

	core, logs := observer.New(zap.WarnLevel)
	warnPartialStores(ctx, e.c, "pilot", []trainer.MixtureEntry{{Store: "code", Weight: 1}}, zap.New(core))
	w := logs.All()
	if len(w) != 1 || !strings.Contains(w[0].Message, "run pilot trains on part of token store code: the ingest of 2 files failed for good or was cancelled; ") ||
		!strings.Contains(w[0].Message, "an older kiln queued the tasks of 1 file, ") ||
		!strings.Contains(w[0].Message, "enqueue the ingest again, not sched retry: 'sched enqueue ingest <dataset> --store code' with the ingest's arguments") {
		t.Fatalf("warnings %v; want one saying store code lacks 2 files, f2 an older kiln's, to be added by the ingest enqueued again", w)
	}
}

// stopAtData is patternData that calls stop once, when the batch of
// example at is asked for.
type stopAtData struct {
	patternData
	at   int
	stop func()
}

func (d *stopAtData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	if d.next >= d.at && d.stop != nil {
		d.stop()
		d.stop = nil
	}
	return d.patternData.Next(ctx, b, t)
}

// The run's last segment, whose final checkpoint object storage cannot
// take because it went down during the last step, waits for the store,
// using up none of its retries; once the store is back the checkpoint
// from this disk goes up and the run is done.
func TestTheLastSegmentWaitsForTheObjectStoreToTakeItsCheckpoint(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: srv.Endpoint, Bucket: "kiln", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	const total = 6
	run := patternRun("last", tokName, 1e-3, total, 0, 3)
	// The last step's batch (batch 2: examples 2*(total-1) on) stops the
	// store before that step's checkpoint is written.
	var first sync.Once
	e.handlers.Training = &Training{
		Redis: e.rdb, Objects: objects, Runs: runs.Set{run.Name: run}, Dir: t.TempDir(), Owner: "gpu-test",
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err },
		OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) {
			d := &stopAtData{at: 2 * (total - 1)}
			first.Do(func() { d.stop = srv.Stop })
			return d, nil
		},
		Log: zap.NewNop(),
	}
	e.serve(map[string]int{scheduler.QueueGPU: 1})
	id := e.enqueue(scheduler.TrainSegment{Run: "last"})
	e.waitsOutTheOutage(id, srv)
	steps, err := segment.RemoteSteps(context.Background(), objects, "last")
	if err != nil || len(steps) == 0 || steps[len(steps)-1] != total {
		t.Errorf("run last's checkpoints in object storage: %v, %v; want step %d", steps, err, total)
	}
	if st := e.rdb.HGetAll(context.Background(), scheduler.RunStateKey("last")).Val(); st["done"] != "true" || st["checkpoint"] != strconv.Itoa(total) {
		t.Errorf("run state %v; want done at checkpoint %d", st, total)
	}
}

// A finished bench says what it measured: a shape's tok/s on the GPUs or
// the CPU, why a shape could not be measured, or a sweep's count of shapes
// with those that could not run.
func TestBenchSummarySaysWhatWasMeasured(t *testing.T) {
	one := []runs.Shape{{Model: "small", Batch: 32, Seq: 1024, Precision: "bf16"}}
	for _, c := range []struct {
		shapes []runs.Shape
		rows   []results.BenchRow
		want   string
	}{
		{one, []results.BenchRow{{TokPerSec: 1541299.4, Device: "NVIDIA H100", GPUs: 2}},
			"measured small 32x1024 bf16: 1,541,299 tok/s on 2 GPUs; sched results bench shows the table"},
		{one, []results.BenchRow{{TokPerSec: 812.6, Precision: "fp32"}},
			"measured small 32x1024 fp32: 813 tok/s on the CPU; sched results bench shows the table"},
		{one, []results.BenchRow{{Error: "CUDA out of memory"}},
			"small 32x1024 bf16 could not be measured: CUDA out of memory; sched results bench shows the table"},
		{runs.Sweep(), []results.BenchRow{{TokPerSec: 1}, {Error: "too big"}, {TokPerSec: 2}},
			"measured 3 shapes (1 could not run); sched results bench shows the table"},
	} {
		if got := benchSummary(c.shapes, c.rows); got != c.want {
			t.Errorf("benchSummary of %d rows:\n got %q\nwant %q", len(c.rows), got, c.want)
		}
	}
}

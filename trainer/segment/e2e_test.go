package segment_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/kiln-lm/kiln/ingest"
	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/results"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
	"github.com/kiln-lm/kiln/worker"
)

// TestMain doubles as a GPU worker process: with KILN_E2E_WORKER=1 the test
// binary serves the gpu queue until it is killed, so the end-to-end test can
// SIGKILL a real worker; as sched worker does, the worker runs each segment
// in a child process, this binary again with KILN_E2E_WORKER=task, which
// runs the real train:segment handler.
func TestMain(m *testing.M) {
	switch os.Getenv("KILN_E2E_WORKER") {
	case "1":
		os.Exit(e2eWorker())
	case "task":
		os.Exit(e2eTask())
	}
	os.Exit(m.Run())
}

func e2eWorker() int {
	env := os.Getenv
	log, _ := zap.NewDevelopment()
	w, err := worker.New(worker.Params{Redis: asynq.RedisClientOpt{Addr: env("KILN_E2E_REDIS")}, Queues: map[string]int{scheduler.QueueGPU: 1}, Logger: log,
		Name: env("KILN_E2E_NAME"), DelayedTaskCheckInterval: 200 * time.Millisecond,
		Isolate: &worker.Isolation{Queues: []string{scheduler.QueueGPU}, Command: []string{os.Args[0], "-test.run=^$"}, Env: []string{"KILN_E2E_WORKER=task"}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e worker:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "e2e worker:", err)
		return 1
	}
	return 0
}

// e2eTask runs one segment handed over by e2eWorker.
func e2eTask() int {
	env := os.Getenv
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "e2e task:", err); return 1 }
	set, err := runs.Load(env("KILN_E2E_RUNS"))
	if err != nil {
		return fail(err)
	}
	objects, err := store.NewS3(store.S3Options{Endpoint: env("KILN_E2E_S3"), Bucket: "kiln", AccessKey: env("KILN_E2E_S3_ACCESS"), SecretKey: env("KILN_E2E_S3_SECRET")})
	if err != nil {
		return fail(err)
	}
	opt := asynq.RedisClientOpt{Addr: env("KILN_E2E_REDIS")}
	client := scheduler.NewClient(opt)
	defer client.Close()
	rdb := redis.NewClient(&redis.Options{Addr: env("KILN_E2E_REDIS")})
	defer rdb.Close()
	log, _ := zap.NewDevelopment()
	var openData func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error)
	if step, _ := strconv.Atoi(env("KILN_E2E_HOLD")); step > 0 {
		openData = func(rc trainer.RunConfig, mc model.Config) (trainer.Data, error) {
			m, err := trainer.OpenMixture(rc.Mixture, mc, rc.Seq, rc.Seed)
			if err != nil {
				return nil, err
			}
			return &heldData{Mixture: m, at: (step-1)*rc.Accumulate + 1, marker: env("KILN_E2E_DIR") + ".held"}, nil
		}
	}
	training := &worker.Training{
		Redis: rdb, Objects: objects, Runs: set, Dir: env("KILN_E2E_DIR"), TokensDir: env("KILN_E2E_TOKENS"), OpenData: openData,
		// The run lock keeps its production lease (LockTTL unset): the
		// killed worker's lock must have lapsed by the time asynq hands
		// its task to another worker.
		Owner: env("KILN_E2E_NAME"), Log: log,
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := client.Enqueue(ctx, a); return err },
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return worker.ServeTask(ctx, worker.TaskParams{Redis: opt, Handlers: worker.Handlers{Training: training}, Logger: log})
}

// heldData is the token-store mixture that stops serving at one read, the
// first micro-batch of a chosen step, until the segment is stopped: the
// test then knows exactly which steps are complete when its signal lands,
// however fast or slow the machine. It announces the hold by creating
// marker, and returns the stop's error as the sampler does.
type heldData struct {
	*trainer.Mixture
	at, reads int
	marker    string
}

func (d *heldData) Next(ctx context.Context, b, t int) (model.Batch, error) {
	if d.reads++; d.reads == d.at {
		if err := os.WriteFile(d.marker, nil, 0o644); err != nil {
			return model.Batch{}, err
		}
		<-ctx.Done()
		return model.Batch{}, ctx.Err()
	}
	return d.Mixture.Next(ctx, b, t)
}

const e2eRuns = `
e2e:
  model: tiny
  seq: 32
  batch: 2
  accumulate: 2
  lr: 2.0e-3
  warmup: 4
  total_steps: 48
  eval_every: 4
  eval_batches: 1
  checkpoint_every: 4
  log_every: 1
  seed: 9
  engine: cpu
  precision: fp32
  tokenizer: e2e-512
  mixture: [{store: go-strings, weight: 1}]
  retention: {keep_last: 2, keep_every: 5}
ref:
  from: e2e
`

// e2e is the shared setup of the end-to-end tests: real servers, a token
// store made by local ingest, the uninterrupted reference losses, and a way
// to start worker processes.
type e2e struct {
	ctx     context.Context
	objects store.Store
	rdb     *redis.Client
	client  *scheduler.Client
	start   func(name string, env ...string) *exec.Cmd
	want    map[int]float64
	work    string
}

func newE2E(t *testing.T) *e2e {
	ctx := context.Background()
	rs := testsvc.StartRedis(t)
	s3 := testsvc.S3(t)
	objects, err := store.NewS3(store.S3Options{Endpoint: s3.Endpoint, Bucket: "kiln", AccessKey: s3.AccessKey, SecretKey: s3.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	runsFile := filepath.Join(work, "runs.yaml")
	if err := os.WriteFile(runsFile, []byte(e2eRuns), 0o644); err != nil {
		t.Fatal(err)
	}

	// Ingest (local) -> append: a tokenizer learned from the strings and
	// bytes packages, then their sources appended to a token store.
	glob := filepath.Join(runtime.GOROOT(), "src", "[bs]*", "*.go")
	files, _ := filepath.Glob(glob)
	var inputs []io.Reader
	for _, f := range files[:min(len(files), 40)] {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, bytes.NewReader(b))
	}
	tokJSON, err := tokenizer.Train(ctx, inputs, tokenizer.TrainOptions{VocabSize: 512})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Parse(tokJSON)
	if err != nil {
		t.Fatal(err)
	}
	if err := objects.Put(ctx, "tokenizers/e2e-512/tokenizer.json", bytes.NewReader(tokJSON), int64(len(tokJSON))); err != nil {
		t.Fatal(err)
	}
	preset, err := ingest.LookupPreset(nil, ingest.LocalPrefix+glob)
	if err != nil {
		t.Fatal(err)
	}
	tokensDir := filepath.Join(work, "tokens")
	rep, err := ingest.Direct(ctx, ingest.DirectOptions{Preset: preset, Tokenizer: tok, TokenizerName: "e2e-512",
		StoreDir: filepath.Join(tokensDir, "go-strings"), DataDir: filepath.Join(work, "ingest"), Seed: 1, MaxTokens: 400_000})
	if err != nil || rep.Appended == 0 {
		t.Fatalf("ingest: %+v %v", rep, err)
	}

	// The uninterrupted reference, in this process, on the same store.
	set, err := runs.Load(runsFile)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := set.Get("ref")
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { rdb.Close() })
	want := map[int]float64{}
	if out, err := segment.Run(ctx, segment.Params{Run: ref, Dir: filepath.Join(work, "ref"), TokensDir: tokensDir, Redis: rdb,
		Progress: func(step, total int, m *trainer.Metrics) {
			if m != nil {
				want[m.Step] = m.LossOr(0)
			}
		}}); err != nil || !out.Done {
		t.Fatalf("reference run: %+v %v", out, err)
	}

	client := scheduler.NewClient(asynq.RedisClientOpt{Addr: rs.Addr})
	t.Cleanup(func() { client.Close() })
	start := func(name string, env ...string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "KILN_E2E_WORKER=1", "KILN_E2E_NAME="+name, "KILN_E2E_RUNS="+runsFile,
			"KILN_E2E_REDIS="+rs.Addr, "KILN_E2E_S3="+s3.Endpoint, "KILN_E2E_S3_ACCESS="+s3.AccessKey, "KILN_E2E_S3_SECRET="+s3.SecretKey,
			"KILN_E2E_DIR="+filepath.Join(work, name), "KILN_E2E_TOKENS="+tokensDir)
		cmd.Env = append(cmd.Env, env...)
		logf, err := os.Create(filepath.Join(work, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			logf.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logf.Name())
				t.Logf("%s log:\n%s", name, b)
			}
		})
		return cmd
	}

	return &e2e{ctx: ctx, objects: objects, rdb: rdb, client: client, start: start, want: want, work: work}
}

// The end-to-end run on a real Redis and versitygw: ingest local
// files and append them to a token store, train the tiny model on the CPU
// through the queue with checkpoints in S3, and SIGKILL the worker. Nobody
// enqueues anything after that: asynq recovers the dead worker's task once
// its lease has expired, retries it on a new worker with a fresh disk, and
// the retry resumes from the last complete checkpoint in S3 and finishes
// with exactly the losses of an uninterrupted run.
func TestEndToEndSurvivesAKilledWorker(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SIGKILL of a child process is exercised on linux")
	}
	if testing.Short() {
		t.Skip("waits out asynq's lease of the killed worker's task (about a minute)")
	}
	e := newE2E(t)
	ctx, objects, client, start, want := e.ctx, e.objects, e.client, e.start, e.want
	// Worker A trains 10 steps, holds before step 11, and dies once two
	// checkpoints (steps 4 and 8) are complete in S3.
	a := start("gpu-a", "KILN_E2E_HOLD=11")
	info, err := client.Enqueue(ctx, scheduler.TrainSegment{Run: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	e.waitHeld(t, "gpu-a")
	e.waitRemote(t, "e2e", 8)
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	steps, err := segment.RemoteSteps(ctx, objects, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	last := steps[len(steps)-1]
	if last != 8 {
		t.Fatalf("checkpoints in S3 when worker A was killed: %v; want the last at step 8", steps)
	}

	// A's task is still active under its lease, and A's run lock is
	// still held. asynq recovers a task once its lease is 30s past expiry
	// (its allowance for clock skew), and a worker's recoverer runs when it
	// starts, so B is started just after that point, read from the lease.
	exp, err := e.rdb.ZScore(ctx, "asynq:{"+scheduler.QueueGPU+"}:lease", info.ID).Result()
	if err != nil {
		t.Fatalf("lease of the killed worker's task %s: %v", info.ID, err)
	}
	recoverable := time.Unix(int64(exp), 0).Add(31 * time.Second)
	lockLeft, err := e.rdb.PTTL(ctx, scheduler.RunLockKey("e2e")).Result()
	if err != nil || lockLeft <= 0 {
		t.Fatalf("the killed worker's run lock: ttl %v (%v); want it still held", lockLeft, err)
	}
	if lockFree := time.Now().Add(lockLeft); !lockFree.Before(recoverable) {
		t.Errorf("the dead worker's run lock lapses at %v, after asynq recovers its task at %v: the retry would wait on it",
			lockFree.Format(time.TimeOnly), recoverable.Format(time.TimeOnly))
	}
	time.Sleep(time.Until(recoverable))

	// Worker B, on another disk, recovers and runs the very same task.
	start("gpu-b")
	e.waitDone(t, "e2e")
	ts := e.waitTask(t, info.ID, "completed")
	if ts.Retried != 1 || ts.Progress.Worker != "gpu-b" {
		t.Errorf("task %s: retried %d times, last run by %q; want one retry (the lease expiry), run by gpu-b", info.ID, ts.Retried, ts.Progress.Worker)
	}
	b := e.log("gpu-b")
	if line := lineWith(b, "resuming from object storage"); !strings.Contains(line, fmt.Sprintf(`"step": %d}`, last)) {
		t.Errorf("worker B did not resume from step %d in object storage:\n%s", last, b)
	}
	if strings.Contains(b, scheduler.ErrRunLocked.Error()) {
		t.Errorf("worker B found the run still locked by the dead worker:\n%s", b)
	}
	// The recovered task is the run's only segment: nothing else was queued.
	if qs := e.gpuQueue(t); qs.Completed != 1 || qs.Size != 0 || qs.Archived != 0 {
		t.Errorf("gpu queue: %d completed, %d waiting, %d archived; want the one recovered task completed", qs.Completed, qs.Size, qs.Archived)
	}

	// Every step's loss equals the uninterrupted run's: those before the
	// kill trained by A, those after it by B from A's last checkpoint.
	recs, got := e.losses(t, "e2e")
	for step := 1; step <= 48; step++ {
		if g, ok := got[step]; !ok || g != want[step] {
			t.Errorf("step %d: loss %v (logged %v), uninterrupted %v", step, g, ok, want[step])
		}
	}
	if recs[0].Step != 0 || recs[0].EvalLoss == nil {
		t.Errorf("no step-0 evaluation: %+v", recs[0])
	}
	// Results and plot are present; retention kept the last two checkpoints
	// uploaded and every fifth (step 20 and 40). Step 44 is one of them
	// unless step 48 took its place in the upload queue (training never
	// waits for uploads), and then 40 is the one before 48.
	for _, name := range []string{results.SummaryFile, results.PlotFile} {
		if _, err := objects.Stat(ctx, segment.ResultsPrefix("e2e")+name); err != nil {
			t.Errorf("results/e2e/%s: %v", name, err)
		}
	}
	steps, err = segment.RemoteSteps(ctx, objects, "e2e")
	if got := fmt.Sprint(steps); err != nil || got != "[20 40 44 48]" && got != "[20 40 48]" {
		t.Errorf("checkpoints in S3 %v (%v), want [20 40 44 48] or [20 40 48]", steps, err)
	}
	t.Logf("worker killed after step %d was in S3; asynq's retry resumed from it", last)
}

// A lost GPU worker's segment is retried within seconds of asynq
// recovering it, while repeated failures back off to minutes and stop after
// MaxRetry: no storm, and an outage of about 20 minutes is waited out.
func TestTrainSegmentRetryPolicy(t *testing.T) {
	p, ok := scheduler.PolicyFor(scheduler.KindTrainSegment)
	if !ok {
		t.Fatal("train:segment has no policy")
	}
	task := asynq.NewTask(scheduler.KindTrainSegment, nil)
	if d := scheduler.RetryDelay(0, asynq.ErrLeaseExpired, task); d > 10*time.Second {
		t.Errorf("first retry after a lost worker in %v; want seconds", d)
	}
	var total time.Duration
	for n := 0; n < p.MaxRetry; n++ {
		total += scheduler.RetryDelay(n, errors.New("object storage unreachable"), task)
	}
	if p.MaxRetry > 10 || total < 15*time.Minute {
		t.Errorf("%d retries span %v; want at most 10 spanning at least 15 minutes", p.MaxRetry, total)
	}
	if d := scheduler.RetryDelay(p.MaxRetry-1, errors.New("x"), task); d < 5*time.Minute {
		t.Errorf("last retry after %v; want backed off to minutes", d)
	}
}

// SIGTERM, as `docker compose down` sends, stops the worker at the step
// boundary with a checkpoint that is uploaded before it exits; the segment
// is re-queued and the next worker continues from exactly there. The run
// accumulates two micro-batches a step, and the signal lands while step 7
// reads its first one: step 7 is abandoned, and the stop checkpoint is
// step 6's, which no periodic checkpoint (every 4 steps) wrote.
func TestEndToEndGracefulStopLosesNoStep(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("signals to a child process are exercised on linux")
	}
	e := newE2E(t)
	a := e.start("gpu-a", "KILN_E2E_HOLD=7")
	if _, err := e.client.Enqueue(e.ctx, scheduler.TrainSegment{Run: "e2e"}); err != nil {
		t.Fatal(err)
	}
	e.waitHeld(t, "gpu-a")
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(); err != nil {
		t.Fatalf("worker A did not exit cleanly on SIGTERM: %v\n%s", err, e.log("gpu-a"))
	}
	stopped, _ := strconv.Atoi(e.rdb.HGet(e.ctx, scheduler.RunStateKey("e2e"), "step").Val())
	steps, err := segment.RemoteSteps(e.ctx, e.objects, "e2e")
	if err != nil || stopped != 6 || len(steps) == 0 || steps[len(steps)-1] != 6 {
		t.Fatalf("stopped at step %d; checkpoints in S3 %v (%v): the stop must checkpoint and upload step 6, the last completed step", stopped, steps, err)
	}
	// The interrupted segment is queued again, and B (another disk) runs it.
	e.start("gpu-b")
	e.waitDone(t, "e2e")
	if b := lineWith(e.log("gpu-b"), "resuming from object storage"); !strings.Contains(b, `"step": 6}`) {
		t.Errorf("worker B did not resume from step 6 in object storage:\n%s", e.log("gpu-b"))
	}
	_, got := e.losses(t, "e2e")
	for step := 1; step <= 48; step++ {
		if got[step] != e.want[step] {
			t.Errorf("step %d: loss %v, uninterrupted %v", step, got[step], e.want[step])
		}
	}
}

// waitHeld waits for worker name's data to hold (heldData's marker).
func (e *e2e) waitHeld(t *testing.T, name string) {
	t.Helper()
	marker := filepath.Join(e.work, name) + ".held"
	deadline := time.Now().Add(3 * time.Minute)
	for {
		if _, err := os.Stat(marker); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %s did not reach its hold within 3 minutes:\n%s", name, e.log(name))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *e2e) log(name string) string {
	b, _ := os.ReadFile(filepath.Join(e.work, name+".log"))
	return string(b)
}

// losses reads the run's metrics from results/<run>/ in S3.
func (e *e2e) losses(t *testing.T, run string) ([]results.Record, map[int]float64) {
	t.Helper()
	r, err := e.objects.Get(e.ctx, segment.ResultsPrefix(run)+results.MetricsFile)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := results.ReadMetrics(r)
	r.Close()
	if err != nil {
		t.Fatal(err)
	}
	got := map[int]float64{}
	for _, rec := range recs {
		if rec.Loss != nil {
			got[rec.Step] = *rec.Loss
		}
	}
	return recs, got
}

// waitRemote waits for a complete checkpoint at step >= min in S3.
func (e *e2e) waitRemote(t *testing.T, run string, min int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		steps, err := segment.RemoteSteps(e.ctx, e.objects, run)
		if err == nil && len(steps) > 0 && steps[len(steps)-1] >= min {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint at step %d in S3 within 3 minutes (have %v, %v)", min, steps, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lineWith is the first line of log that contains s, or "".
func lineWith(log, s string) string {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// waitTask waits for the task to reach state.
func (e *e2e) waitTask(t *testing.T, id, state string) scheduler.TaskStatus {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ts, err := e.client.Task(e.ctx, id)
		if err == nil && ts.State == state {
			return ts
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not %s within a minute: %+v (%v)", id, state, ts, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gpuQueue is the gpu queue's status.
func (e *e2e) gpuQueue(t *testing.T) scheduler.QueueStatus {
	t.Helper()
	qs, err := e.client.Status(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if q.Name == scheduler.QueueGPU {
			return q
		}
	}
	t.Fatal("no gpu queue in the status")
	return scheduler.QueueStatus{}
}

// waitDone waits for the run's state to say done.
func (e *e2e) waitDone(t *testing.T, run string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for e.rdb.HGet(e.ctx, scheduler.RunStateKey(run), "done").Val() != "true" {
		if time.Now().After(deadline) {
			t.Fatalf("run not done within 3 minutes; state %v", e.rdb.HGetAll(e.ctx, scheduler.RunStateKey(run)).Val())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

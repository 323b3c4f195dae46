package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// Test kinds: their handlers exercise the machinery, not product code.
const (
	kindSlow    = "test:slow"
	kindPanic   = "test:panic"
	kindUnbuilt = "test:unbuilt"
)

// slowArgs works for Steps*StepMS milliseconds, checking its context
// between steps (its safe points), and records one side effect at the end:
// INCR kiln-test:done:<Name>.
type slowArgs struct {
	Name   string `json:"name"`
	Steps  int    `json:"steps"`
	StepMS int    `json:"step_ms"`
}

func (slowArgs) Kind() string { return kindSlow }

type panicArgs struct{}

func (panicArgs) Kind() string { return kindPanic }

type unbuiltArgs struct{}

func (unbuiltArgs) Kind() string { return kindUnbuilt }

var testPolicy = scheduler.Policy{Queue: scheduler.QueueIngest, Version: 1, Timeout: time.Minute, MaxRetry: 3, Backoff: 100 * time.Millisecond, MaxBackoff: time.Second, Retention: time.Hour}

// lastChanceArgs is slowArgs of a kind that has no retry.
type lastChanceArgs struct{ slowArgs }

func (lastChanceArgs) Kind() string { return kindLastChance }

const kindLastChance = "test:last-chance"

func init() {
	noRetry := testPolicy
	noRetry.MaxRetry = 0
	scheduler.Define(kindLastChance, noRetry)
	scheduler.Define(kindSlow, testPolicy)
	scheduler.Define(kindPanic, testPolicy)
	scheduler.Define(kindUnbuilt, testPolicy)
}

// testHandlers are the handlers of the test kinds (unbuiltArgs has none).
func testHandlers() []Handler {
	return []Handler{HandlerFunc(slow), HandlerFunc(func(ctx context.Context, a panicArgs) error { panic("boom") }),
		HandlerFunc(func(ctx context.Context, a lastChanceArgs) error { return slow(ctx, a.slowArgs) })}
}

func slow(ctx context.Context, a slowArgs) error {
	rep := Progress(ctx)
	for i := 0; i < a.Steps; i++ {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped at step %d of %d: %w", i, a.Steps, ctx.Err())
		case <-time.After(time.Duration(a.StepMS) * time.Millisecond):
		}
		rep.Report(ctx, float64(i+1)/float64(a.Steps), float64(1000/max(a.StepMS, 1)), "steps/s", fmt.Sprintf("step %d", i+1))
	}
	return rep.rdb.Incr(context.Background(), "kiln-test:done:"+a.Name).Err()
}

// TestMain doubles as a worker process: with KILN_TEST_WORKER_URL set, the
// test binary serves the ingest queue with the test handlers until SIGTERM,
// so tests can kill a real process.
func TestMain(m *testing.M) {
	if url := os.Getenv("KILN_TEST_WORKER_URL"); url != "" {
		os.Exit(runChild(url))
	}
	if url := os.Getenv(taskChildEnv); url != "" {
		os.Exit(runTaskChild(url))
	}
	os.Exit(m.Run())
}

func runChild(url string) int {
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log, _ := zap.NewDevelopment()
	w, err := New(Params{Redis: opt, Queues: map[string]int{scheduler.QueueIngest: 2}, ShutdownGrace: 10 * time.Second,
		Handlers: Handlers{Extra: testHandlers()},
		Logger:   log, DelayedTaskCheckInterval: 200 * time.Millisecond, ProgressEvery: time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := w.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

type env struct {
	// handlers are what serve gives its worker: the test kinds', and a
	// test's own groups.
	handlers Handlers
	t        *testing.T
	redis    *testsvc.RedisServer
	url      string
	opt      asynq.RedisConnOpt
	c        *scheduler.Client
	rdb      redis.UniversalClient
	// log is the in-process worker's logger; nil: none.
	log *zap.Logger
	// redact is the in-process worker's Params.Redact.
	redact func(string) string
	// outputWait is isolatedShell's Isolation.OutputWait; 0: its default.
	outputWait time.Duration
	// cancelCheckEvery is serve's Params.CancelCheckEvery; 0: its default.
	cancelCheckEvery time.Duration
}

func newEnv(t *testing.T) *env {
	r := testsvc.StartRedis(t)
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	c := scheduler.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return &env{handlers: Handlers{Extra: testHandlers()}, t: t, redis: r, url: r.URL(0), opt: opt, c: c, rdb: c.Redis()}
}

// startInProcess runs a worker in this process until the test ends.
func (e *env) startInProcess() { e.serve(map[string]int{scheduler.QueueIngest: 2}) }

// serve runs a worker for queues in this process until the test ends.
func (e *env) serve(queues map[string]int) {
	ctx, cancel := context.WithCancel(context.Background())
	log := e.log
	if log == nil {
		log = zap.NewNop()
	}
	w, err := New(Params{Redis: e.opt, Queues: queues, Handlers: e.handlers, Logger: log, Redact: e.redact,
		DelayedTaskCheckInterval: 200 * time.Millisecond, ProgressEvery: time.Millisecond, CancelCheckEvery: e.cancelCheckEvery})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() { cancel(); <-done })
}

// startChild runs a worker as a separate process.
func (e *env) startChild() *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KILN_TEST_WORKER_URL="+e.url)
	logf, err := os.Create(fmt.Sprintf("%s/worker-%d.log", e.t.TempDir(), time.Now().UnixNano()))
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if e.t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			e.t.Logf("worker log %s:\n%s", logf.Name(), b)
		}
		logf.Close()
	})
	return cmd
}

func (e *env) enqueue(a scheduler.Args) string {
	info, err := e.c.Enqueue(context.Background(), a)
	if err != nil {
		e.t.Fatal(err)
	}
	return info.ID
}

// waitFor polls the task until cond holds or the deadline passes.
func (e *env) waitFor(id string, within time.Duration, what string, cond func(scheduler.TaskStatus) bool) scheduler.TaskStatus {
	e.t.Helper()
	deadline := time.Now().Add(within)
	var last scheduler.TaskStatus
	for time.Now().Before(deadline) {
		ts, err := e.c.Task(context.Background(), id)
		if err == nil {
			last = ts
			if cond(ts) {
				return ts
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.t.Fatalf("task %s: not %s within %v; last: state=%s err=%q progress=%+v", id, what, within, last.State, last.LastErr, last.Progress)
	return last
}

func state(s string) func(scheduler.TaskStatus) bool {
	return func(ts scheduler.TaskStatus) bool { return ts.State == s }
}

func (e *env) sideEffects(name string) int {
	n, err := e.rdb.Get(context.Background(), "kiln-test:done:"+name).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		e.t.Fatal(err)
	}
	return n
}

func TestTaskRunsWithProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startInProcess()
	id := e.enqueue(slowArgs{Name: "a", Steps: 3, StepMS: 10})
	ts := e.waitFor(id, 20*time.Second, "completed", state("completed"))
	if !ts.HasProgress || ts.Progress.State != "done" || ts.Progress.Fraction != 1 || ts.Progress.Message != "step 3" {
		t.Fatalf("progress after completion: %+v", ts.Progress)
	}
	if n := e.sideEffects("a"); n != 1 {
		t.Fatalf("side effect ran %d times", n)
	}
}

func TestFinalErrorsAreArchivedWithoutRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startInProcess()
	ctx := context.Background()
	raw := asynq.NewClient(e.opt)
	defer raw.Close()
	cases := map[string]struct {
		task *asynq.Task
		want string
	}{
		"unbuilt kind":      {mustTask(t, unbuiltArgs{}), "not available on this worker"},
		"unknown kind":      {asynq.NewTask("nope:x", []byte("{}"), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(5)), `unknown task kind "nope:x"`},
		"malformed payload": {asynq.NewTask(kindSlow, []byte("\xff not json"), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(5)), "malformed payload"},
		"future version":    {asynq.NewTask(kindSlow, []byte(`{"v":7,"args":{}}`), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(5)), "payload version 7"},
		// No kiln queued it: not "an older kiln queued it".
		"no envelope": {asynq.NewTask(kindSlow, []byte(`{"path":"/etc/passwd"}`), asynq.Queue(scheduler.QueueIngest), asynq.MaxRetry(5)), "payload has no version: it is not a kiln task envelope"},
	}
	for name, c := range cases {
		info, err := raw.EnqueueContext(ctx, c.task)
		if err != nil {
			t.Fatal(err)
		}
		ts := e.waitFor(info.ID, 20*time.Second, "archived", state("archived"))
		if ts.Retried != 0 || !strings.Contains(ts.LastErr, c.want) || strings.Contains(ts.LastErr, "\n") {
			t.Errorf("%s: retried=%d err=%q; want no retry and a one-line error containing %q", name, ts.Retried, ts.LastErr, c.want)
		}
	}
}

func mustTask(t *testing.T, a scheduler.Args) *asynq.Task {
	task, err := scheduler.NewTask(a)
	if err != nil {
		t.Fatal(err)
	}
	return task
}

func TestPanicBecomesTaskError(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startInProcess()
	id := e.enqueue(panicArgs{})
	ts := e.waitFor(id, 30*time.Second, "failed with the panic", func(ts scheduler.TaskStatus) bool {
		return ts.Retried >= 1 && strings.Contains(ts.LastErr, "panicked: boom")
	})
	if ts.Progress.State != "failed" {
		t.Fatalf("progress state %q, want failed", ts.Progress.State)
	}
}

func TestRedisRestartUnderRunningWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startInProcess()
	id := e.enqueue(slowArgs{Name: "before", Steps: 1, StepMS: 1})
	e.waitFor(id, 20*time.Second, "completed", state("completed"))
	e.redis.Stop()
	e.redis.Start()
	id = e.enqueue(slowArgs{Name: "after", Steps: 1, StepMS: 1})
	e.waitFor(id, 60*time.Second, "completed after the restart", state("completed"))
	if e.sideEffects("before") != 1 || e.sideEffects("after") != 1 {
		t.Fatal("side effects lost or repeated across the restart")
	}
}

func TestSIGTERMRequeuesAndAnotherWorkerCompletes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.startChild()
	id := e.enqueue(slowArgs{Name: "term", Steps: 40, StepMS: 50})
	e.waitFor(id, 30*time.Second, "running", func(ts scheduler.TaskStatus) bool {
		return ts.State == "active" && ts.Progress.Fraction > 0
	})
	if err := a.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- a.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("worker exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("worker did not exit within its grace period")
	}
	ts, err := e.c.Task(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if ts.State == "completed" || ts.Progress.State != "interrupted" || ts.Retried != 0 {
		t.Fatalf("after SIGTERM: state=%s progress=%s retried=%d; want re-queued, interrupted, no retry used", ts.State, ts.Progress.State, ts.Retried)
	}
	if n := e.sideEffects("term"); n != 0 {
		t.Fatalf("interrupted task left %d side effects", n)
	}
	e.startChild()
	e.waitFor(id, 60*time.Second, "completed by the second worker", state("completed"))
	if n := e.sideEffects("term"); n != 1 {
		t.Fatalf("side effect ran %d times, want once", n)
	}
}

// killItsWorkerAndRecover runs a on a worker process, kills that worker
// with SIGKILL once a reports progress, and starts a second worker once
// asynq will hand it the task: 30s past the dead worker's lease (asynq's
// allowance for clock skew), read from the lease itself; a worker's
// recoverer runs when it starts. It returns a's task id.
func (e *env) killItsWorkerAndRecover(a scheduler.Args) string {
	e.t.Helper()
	id := e.killItsWorker(a)
	e.recoverAfterTheLease(id)
	return id
}

// killItsWorker runs a on a worker process and kills that worker with
// SIGKILL once a reports progress. It returns a's task id.
func (e *env) killItsWorker(a scheduler.Args) string {
	e.t.Helper()
	w := e.startChild()
	id := e.enqueue(a)
	e.waitFor(id, 30*time.Second, "running", func(ts scheduler.TaskStatus) bool {
		return ts.State == "active" && ts.Progress.Fraction > 0
	})
	if err := w.Process.Kill(); err != nil {
		e.t.Fatal(err)
	}
	_ = w.Wait()
	return id
}

// recoverAfterTheLease starts a second worker once asynq will hand it the
// task id of a dead worker.
func (e *env) recoverAfterTheLease(id string) {
	e.t.Helper()
	exp, err := e.rdb.ZScore(context.Background(), "asynq:{"+scheduler.QueueIngest+"}:lease", id).Result()
	if err != nil {
		e.t.Fatalf("lease of %s: %v", id, err)
	}
	time.Sleep(time.Until(time.Unix(int64(exp), 0).Add(31 * time.Second)))
	e.startChild()
}

// A task cancelled while its worker is dead (killed, its host gone) stays
// cancelled: the worker that takes it back from the dead one archives it
// without running it, where it would otherwise run again, a training run
// the user stopped going on as if the cancel had never been given.
func TestACancelWhileItsWorkerIsDeadHolds(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for asynq's lease expiry (about a minute)")
	}
	t.Parallel()
	e := newEnv(t)
	id := e.killItsWorker(slowArgs{Name: "cancelled", Steps: 40, StepMS: 50})
	// No worker hears the cancel: it waits for the task to stop, then
	// says it has not.
	if state, err := e.c.Cancel(context.Background(), id); err != nil || state != "cancelling" {
		t.Fatalf("cancel with its worker dead: %q, %v; want cancelling", state, err)
	}
	// Until then sched status shows it lost and cancelled, not as a task
	// that runs again.
	for {
		snap, err := e.c.Snapshot(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if i := slices.IndexFunc(snap.Running(), func(ts scheduler.TaskStatus) bool { return ts.ID == id && ts.Lost }); i >= 0 {
			if ts := snap.Running()[i]; !ts.Cancelled {
				t.Fatalf("sched status of the lost task after its cancel: %+v; want it cancelled", ts)
			}
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.recoverAfterTheLease(id)
	ts := e.waitFor(id, time.Minute, "ended", func(ts scheduler.TaskStatus) bool { return ts.State == "archived" || ts.State == "completed" })
	if ts.State != "archived" || !strings.Contains(ts.LastErr, "cancelled by sched cancel") {
		t.Fatalf("a task cancelled while its worker was dead, once taken back: %s (%q); want archived as cancelled", ts.State, ts.LastErr)
	}
	if n := e.sideEffects("cancelled"); n != 0 {
		t.Fatalf("the cancelled task ran to its end %d times", n)
	}
	// Enqueuing it again is a new run of the work: it runs.
	if _, err := e.c.Again(context.Background(), slowArgs{Name: "cancelled", Steps: 40, StepMS: 50}); err != nil {
		t.Fatal(err)
	}
	e.waitFor(id, time.Minute, "completed when enqueued again", state("completed"))
}

// A task stopped by sched cancel is logged as cancelled, at info: the
// user asked for it, and the worker's log said ERROR task failed. Its
// end is archived as cancelled, as before.
func TestACancelledTaskIsNoErrorInTheLog(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	core, logs := observer.New(zap.InfoLevel)
	e.log = zap.New(core)
	e.startInProcess()
	id := e.enqueue(slowArgs{Name: "stopped", Steps: 100_000, StepMS: 10})
	e.waitFor(id, time.Minute, "running", state("active"))
	if _, err := e.c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if ts := e.waitFor(id, time.Minute, "archived", state("archived")); !ts.Cancelled {
		t.Fatalf("the task archived after its cancel: %+v; want it cancelled", ts)
	}
	// asynq ends the task as soon as its context ends; the handler
	// returns, and the worker logs its end, after. asynq may have tried
	// the task again before the cancel archived it: that try is refused
	// and logged as cancelled too.
	deadline := time.Now().Add(time.Minute)
	const cancelled = "task cancelled by sched cancel"
	for logs.FilterField(zap.String("task_id", id)).FilterMessage(cancelled).Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the worker logged no end of the cancelled task in a minute: %+v", logs.All())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, e := range logs.FilterField(zap.String("task_id", id)).FilterMessageSnippet("task ").All() {
		if e.Message != "task started" && e.Message != cancelled || e.Level != zap.InfoLevel {
			t.Errorf("the cancelled task's log says %q at %s; want it started, then cancelled, at info", e.Message, e.Level)
		}
	}
	if errs := logs.FilterLevelExact(zap.ErrorLevel).All(); len(errs) != 0 {
		t.Fatalf("a cancel logged errors: %+v", errs)
	}
}

// TestSIGKILLRecoveredByAnotherWorker waits out asynq's lease: a killed
// worker stops extending it, and a task is recovered once its lease is 30s
// past expiry (asynq's allowance for clock skew). A worker's recoverer
// runs when it starts, so the second worker is started right after that
// point, which the test reads from the lease itself: about a minute.
func TestSIGKILLRecoveredByAnotherWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for asynq's lease expiry (about a minute)")
	}
	t.Parallel()
	e := newEnv(t)
	id := e.killItsWorkerAndRecover(slowArgs{Name: "kill", Steps: 40, StepMS: 50})
	ts := e.waitFor(id, 60*time.Second, "completed by the second worker", state("completed"))
	if n := e.sideEffects("kill"); n != 1 {
		t.Fatalf("side effect ran %d times, want once", n)
	}
	if ts.Retried != 1 {
		t.Logf("retried=%d", ts.Retried)
	}
}

// A task whose worker is killed while it runs with no retry left is
// archived when another worker recovers it, saying why, as a failure then
// would be: asynq, which holds one retry more than the kind so that a stop
// after the last failure re-queues, would run it again, and a stop in that
// extra attempt would archive it.
func TestAWorkersDeathInTheLastRetryArchivesTheTask(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for asynq's lease expiry (about a minute)")
	}
	t.Parallel()
	e := newEnv(t)
	id := e.killItsWorkerAndRecover(lastChanceArgs{slowArgs{Name: "last", Steps: 40, StepMS: 50}})
	ts := e.waitFor(id, time.Minute, "ended", func(ts scheduler.TaskStatus) bool { return ts.State == "archived" || ts.State == "completed" })
	if ts.State != "archived" || !strings.Contains(ts.LastErr, "stopped answering") || !strings.Contains(ts.LastErr, "sched retry "+id) {
		t.Fatalf("after its worker died with no retry left: %s (%q); want archived, saying why and how to run it again", ts.State, ts.LastErr)
	}
	if n := e.sideEffects("last"); n != 0 {
		t.Fatalf("the task ran to its end %d times after its worker died with no retry left", n)
	}
}

func TestParseQueues(t *testing.T) {
	q, err := ParseQueues("ingest=4, append=1,gpu")
	if err != nil || q["ingest"] != 4 || q["append"] != 1 || q["gpu"] != 1 {
		t.Fatalf("ParseQueues = %v, %v", q, err)
	}
	for _, bad := range []struct{ queues, says string }{
		{"", "no queues given"},
		{"cpu=2", `unknown queue "cpu"`},
		{"ingest=0", "not a positive number"},
		{"ingest=x", "not a positive number"},
		{"ingest=4,ingest=2", `queue "ingest" is given twice`},
		// A worker of that many slots did not stop on SIGTERM.
		{"ingest=99999999999", "ingest=99999999999: at most 256"},
		{"append=257", "append=257: at most 256"},
	} {
		if _, err := ParseQueues(bad.queues); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("ParseQueues(%q) = %v; want an error saying %q", bad.queues, err, bad.says)
		}
	}
	if q, err := ParseQueues("ingest=256"); err != nil || q["ingest"] != 256 {
		t.Errorf("ParseQueues(ingest=256) = %v, %v", q, err)
	}
	// Two tasks at once on the gpu queue would put two engines on the
	// same GPUs; several GPUs are the run's setting.
	if _, err := ParseQueues("ingest=2,gpu=2"); err == nil || !strings.Contains(err.Error(), "gpu=2: the gpu queue runs one task at a time") || !strings.Contains(err.Error(), "gpus: N") {
		t.Errorf("ParseQueues(gpu=2) = %v; want a refusal that says how to use several GPUs", err)
	}
}

const kindObjects = "test:objects"

// objectsArgs puts one object into a real S3 server.
type objectsArgs struct {
	Endpoint  string `json:"endpoint"`
	AccessKey string `json:"access_key"`
	SecretKey string `json:"secret_key"`
}

func (objectsArgs) Kind() string { return kindObjects }

func init() { scheduler.Define(kindObjects, testPolicy) }

// A task that fails because the object store is down waits for it instead
// of using up its retries (three here, a second apart at most), shown as
// waiting for the object store; once the store is back the task is done.
func TestATaskWaitsOutAnObjectStoreOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := testsvc.S3(t)
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(func(ctx context.Context, a objectsArgs) error {
		s, err := store.NewS3(store.S3Options{Endpoint: a.Endpoint, Bucket: "kiln", AccessKey: a.AccessKey, SecretKey: a.SecretKey, MaxRetries: 1})
		if err != nil {
			return err
		}
		return s.Put(ctx, "results/outage", strings.NewReader("x"), 1)
	}))
	e.startInProcess()
	srv.Stop()
	id := e.enqueue(objectsArgs{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	e.waitsOutTheOutage(id, srv)
}

// waitsOutTheOutage wants task id, which met srv stopped, to wait for it
// naming it and the refusal, without using a retry, and, once srv is
// started again, to complete still without one.
func (e *env) waitsOutTheOutage(id string, srv *testsvc.S3Server) {
	e.t.Helper()
	ts := e.waitFor(id, 2*time.Minute, "waiting", func(ts scheduler.TaskStatus) bool { return ts.Progress.State == "waiting" })
	if ts.Retried != 0 || !strings.Contains(ts.Progress.Message, "waiting for the object store at http://"+srv.Endpoint+"/kiln to answer (") || !strings.Contains(ts.Progress.Message, "connect: connection refused)") {
		e.t.Errorf("task %s while the store is down: retried %d, progress %q; want no retry used and a wait naming %s", id, ts.Retried, ts.Progress.Message, srv.Endpoint)
	}
	srv.Start()
	ts = e.waitFor(id, 2*time.Minute, "completed", state("completed"))
	if ts.Retried != 0 {
		e.t.Errorf("task %s used up %d retries waiting for the object store", id, ts.Retried)
	}
}

const kindLate = "test:late"

// lateArgs fails its first Fail attempts, then waits for earlier work
// once, then is done.
type lateArgs struct {
	Name string `json:"name"`
	Fail int    `json:"fail"`
}

func (lateArgs) Kind() string { return kindLate }

func init() { scheduler.Define(kindLate, testPolicy) }

// A task that used all its retries and then waits for earlier work (or is
// interrupted by a shutdown: asynq treats both alike) is tried again, not
// archived: only a failure uses a retry, and the kind's MaxRetry counts
// failures. A failure past it is archived.
func TestATaskThatUsedItsRetriesStillWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(func(ctx context.Context, a lateArgs) error {
		n, err := e.rdb.Incr(ctx, "kiln-test:attempts:"+a.Name).Result()
		switch {
		case err != nil:
			return err
		case n <= int64(a.Fail):
			return fmt.Errorf("failure %d", n)
		case n == int64(a.Fail)+1 && a.Fail <= testPolicy.MaxRetry:
			return &WaitError{For: "earlier work", Every: 10 * time.Millisecond}
		}
		return nil
	}))
	e.startInProcess()
	id := e.enqueue(lateArgs{Name: "late", Fail: testPolicy.MaxRetry})
	ts := e.waitFor(id, time.Minute, "completed", func(ts scheduler.TaskStatus) bool { return ts.State == "completed" || ts.State == "archived" })
	if ts.State != "completed" || ts.Retried != testPolicy.MaxRetry || ts.MaxRetry != testPolicy.MaxRetry {
		t.Errorf("a task that waited after %d failures: %s, retried %d of %d (%q); want completed after %d retries of %d",
			testPolicy.MaxRetry, ts.State, ts.Retried, ts.MaxRetry, ts.LastErr, testPolicy.MaxRetry, testPolicy.MaxRetry)
	}
	id = e.enqueue(lateArgs{Name: "failing", Fail: testPolicy.MaxRetry + 1})
	ts = e.waitFor(id, time.Minute, "archived", func(ts scheduler.TaskStatus) bool { return ts.State == "completed" || ts.State == "archived" })
	if ts.State != "archived" || ts.Retried != testPolicy.MaxRetry || !strings.HasPrefix(ts.LastErr, fmt.Sprintf("failure %d", testPolicy.MaxRetry+1)) {
		t.Errorf("a task failing %d times: %s, retried %d (%q); want archived at its %dth failure", testPolicy.MaxRetry+1, ts.State, ts.Retried, ts.LastErr, testPolicy.MaxRetry+1)
	}
}

// A task whose object store refuses the worker's keys (rotated or revoked
// since the worker began) waits for keys it takes instead of using up its
// retries, saying which settings to mend; once the store takes the keys
// the task is done, still with no retry used. Here the keys are read at
// each attempt, as a restarted worker would read its new ones.
func TestATaskWaitsForKeysTheObjectStoreTakes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	srv := testsvc.S3(t)
	const secretKey = "kiln-test:s3-secret"
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(func(ctx context.Context, a objectsArgs) error {
		secret, err := e.rdb.Get(ctx, secretKey).Result()
		if err != nil {
			return err
		}
		s, err := store.NewS3(store.S3Options{Endpoint: a.Endpoint, Bucket: "kiln", AccessKey: a.AccessKey, SecretKey: secret, MaxRetries: 1})
		if err != nil {
			return err
		}
		return s.Put(ctx, "results/keys", strings.NewReader("x"), 1)
	}))
	e.startInProcess()
	if err := e.rdb.Set(context.Background(), secretKey, "rotated-away", 0).Err(); err != nil {
		t.Fatal(err)
	}
	id := e.enqueue(objectsArgs{Endpoint: srv.Endpoint, AccessKey: srv.AccessKey})
	ts := e.waitFor(id, 2*time.Minute, "waiting", func(ts scheduler.TaskStatus) bool { return ts.Progress.State == "waiting" || ts.Retried > 0 })
	if want := "waiting for the object store at http://" + srv.Endpoint + "/kiln to take this worker's keys ("; ts.Retried != 0 || !strings.Contains(ts.Progress.Message, want) ||
		!strings.HasSuffix(ts.Progress.Message, "keys (SignatureDoesNotMatch): set KILN_S3_ACCESS_KEY and KILN_S3_SECRET_KEY and restart the worker") {
		t.Fatalf("a task whose keys the store refuses: retried %d, progress %q; want no retry used and %q", ts.Retried, ts.Progress.Message, want)
	}
	if err := e.rdb.Set(context.Background(), secretKey, srv.SecretKey, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if ts = e.waitFor(id, 2*time.Minute, "completed", state("completed")); ts.Retried != 0 {
		t.Errorf("the task used up %d retries waiting for keys the store takes", ts.Retried)
	}
}

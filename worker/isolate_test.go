package worker

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
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/trainer"
	"github.com/kiln-lm/kiln/trainer/runs"
	"github.com/kiln-lm/kiln/trainer/segment"
)

// Kinds of the gpu queue, run in a child process each.
const (
	kindCrash   = "test:crash"
	kindGPUSlow = "test:gpu-slow"
	kindFinal   = "test:final"
	// kindCrashLate crashes too, but retries only after a minute, so that
	// a test can move it between workers by hand.
	kindCrashLate = "test:crash-late"
)

// crashArgs ends its process: How is "abort" (a real SIGABRT), "exit"
// (os.Exit(2)) or "killed" (SIGKILL, after an error and then progress in
// sched's console log form, colours included).
type crashArgs struct {
	How string `json:"how"`
}

func (crashArgs) Kind() string { return kindCrash }

type crashLateArgs crashArgs

func (crashLateArgs) Kind() string { return kindCrashLate }

// gpuSlowArgs is slowArgs on the gpu queue; with Hold set it finishes only
// once the key kiln-test:go:<Name> exists.
type gpuSlowArgs struct {
	slowArgs
	Hold bool `json:"hold,omitempty"`
}

func (gpuSlowArgs) Kind() string { return kindGPUSlow }

type finalArgs struct{}

func (finalArgs) Kind() string { return kindFinal }

const taskChildEnv = "KILN_TEST_TASK_REDIS"

func init() {
	gpu := scheduler.Policy{Queue: scheduler.QueueGPU, Version: 1, Timeout: time.Minute, MaxRetry: 5, Backoff: 50 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Retention: time.Hour}
	for _, k := range []string{kindCrash, kindGPUSlow, kindFinal} {
		scheduler.Define(k, gpu)
	}
	late := gpu
	late.Backoff, late.MaxBackoff = time.Hour, time.Hour
	scheduler.Define(kindCrashLate, late)
}

func crash(how string) error {
	switch how {
	case "abort":
		if err := syscall.Kill(os.Getpid(), syscall.SIGABRT); err != nil {
			return err
		}
		select {}
	case "exit":
		os.Exit(2)
	case "killed":
		enc := zap.NewProductionEncoderConfig()
		enc.EncodeTime = zapcore.ISO8601TimeEncoder
		enc.EncodeLevel = zapcore.CapitalColorLevelEncoder
		log := zap.New(zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(os.Stderr), zap.InfoLevel))
		log.Error("shard upload failed", zap.Error(errors.New(killedWhy)))
		log.Info("step 40", zap.Float64("loss", 3.2))
		if err := syscall.Kill(os.Getpid(), syscall.SIGKILL); err != nil {
			return err
		}
		select {}
	}
	return fmt.Errorf("crash: unknown way %q", how)
}

// isolatedTestHandlers are what a task's child process serves.
func isolatedTestHandlers() []Handler {
	return []Handler{
		HandlerFunc(func(ctx context.Context, a crashArgs) error { return crash(a.How) }),
		HandlerFunc(func(ctx context.Context, a crashLateArgs) error { return crash(a.How) }),
		HandlerFunc(func(ctx context.Context, a finalArgs) error {
			return fmt.Errorf("test:final: the payload names nothing (%w)", asynq.SkipRetry)
		}),
		HandlerFunc(func(ctx context.Context, a gpuSlowArgs) error {
			if err := slow(ctx, a.slowArgs); err != nil || !a.Hold {
				return err
			}
			rdb := Progress(ctx).rdb
			for rdb.Exists(ctx, "kiln-test:go:"+a.Name).Val() == 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
			return nil
		}),
	}
}

// runTaskChild is a task's child process: the test handlers, and training
// on patternData when KILN_TEST_TASK_TRAIN names an object store and a run
// directory.
func runTaskChild(url string) int {
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log, _ := zap.NewDevelopment()
	hs := Handlers{Extra: isolatedTestHandlers()}
	if spec := os.Getenv("KILN_TEST_TASK_TRAIN"); spec != "" {
		objDir, runDir, _ := strings.Cut(spec, string(os.PathListSeparator))
		objects, err := store.NewLocal(objDir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		rdb := opt.MakeRedisClient().(redis.UniversalClient)
		defer rdb.Close()
		c := scheduler.NewClient(opt)
		defer c.Close()
		run := patternRun("slow", "train-test-bpe", 1e-3, 100000, 0, 1000)
		hs.Training = &Training{Redis: rdb, Objects: objects, Runs: runs.Set{run.Name: run}, Dir: runDir, Log: log,
			Enqueue:  func(ctx context.Context, a scheduler.Args) error { _, err := c.Enqueue(ctx, a); return err },
			OpenData: func(trainer.RunConfig, model.Config) (trainer.Data, error) { return &patternData{}, nil }}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	return ServeTask(ctx, TaskParams{Redis: opt, Handlers: hs, Logger: log})
}

// serveIsolated runs a worker in this process whose gpu queue runs each
// task in a child process (this test binary, as runTaskChild), until the
// returned stop is called or the test ends.
func (e *env) serveIsolated(queues map[string]int, childEnv ...string) (stop func()) {
	e.t.Helper()
	logf, err := os.Create(filepath.Join(e.t.TempDir(), "children.log"))
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := New(Params{Redis: e.opt, Queues: queues, Handlers: e.handlers, Logger: zap.NewNop(), ShutdownGrace: 20 * time.Second,
		DelayedTaskCheckInterval: 100 * time.Millisecond, ProgressEvery: time.Millisecond,
		Isolate: &Isolation{Queues: []string{scheduler.QueueGPU}, Command: []string{os.Args[0], "-test.run=^$"},
			Env: append([]string{taskChildEnv + "=" + e.url}, childEnv...), Output: logf}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				e.t.Errorf("worker: %v", err)
			}
		}
	}
	e.t.Cleanup(func() {
		stop()
		logf.Close()
		if e.t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			e.t.Logf("children's output:\n%s", b)
		}
	})
	return stop
}

const poison = "poison task: the worker died twice running it"

// poisonRemedy is what a poison task's failure ends with: the remedy of
// docs/operations.md ("Task isolation") for task id.
func poisonRemedy(id string) string {
	return "; fix the cause, then `sched retry " + id + "`, which starts the count again"
}

// A poison task's failure says what to do as its last "; " clause, which
// sched status keeps when it cuts a long failure to its line: after last
// words that hold "; " of their own too.
func TestPoisonErrorEndsWithWhatToDo(t *testing.T) {
	const id = "train:segment:1fcba4492c380bb9669e"
	for _, last := range []string{
		"exit status 2: SIGABRT: abort",
		"exit status 1: ERROR\tupload failed; retrying\t{\"error\": \"s3: reset; giving up\"}",
	} {
		msg := (&PoisonError{ID: id, Last: last}).Error()
		if !strings.HasPrefix(msg, poison+" (last: "+last+")") || !strings.HasSuffix(msg, poisonRemedy(id)) {
			t.Errorf("%q; want %q, how it died, and then %q", msg, poison, poisonRemedy(id))
		}
		if i := strings.LastIndex(msg, "; "); i < 0 || msg[i:] != poisonRemedy(id) {
			t.Errorf("%q: its last \"; \" clause is not the remedy %q", msg, poisonRemedy(id))
		}
	}
}

const killedWhy = "s3: connection reset"

// A task whose process really aborts (SIGABRT) or exits is archived as a
// poison task after its second crash, with how it died, while a task in
// another child of the same worker, which it outlives, and one in the
// worker's own process complete.
func TestACrashingTaskIsPoisonAndItsNeighboursComplete(t *testing.T) {
	e := newEnv(t)
	e.serveIsolated(map[string]int{scheduler.QueueGPU: 3, scheduler.QueueIngest: 1})
	neighbour := e.enqueue(gpuSlowArgs{slowArgs: slowArgs{Name: "neighbour", Steps: 2, StepMS: 10}, Hold: true})
	e.waitFor(neighbour, time.Minute, "running", func(ts scheduler.TaskStatus) bool { return ts.Progress.Fraction == 1 })
	inProcess := e.enqueue(slowArgs{Name: "in-process", Steps: 2, StepMS: 10})
	for how, want := range map[string]string{"abort": "SIGABRT", "exit": "exit status 2"} {
		id := e.enqueue(crashArgs{How: how})
		ts := e.waitFor(id, time.Minute, "archived", state("archived"))
		if !strings.HasPrefix(ts.LastErr, poison) || !strings.Contains(ts.LastErr, want) || !strings.HasSuffix(ts.LastErr, poisonRemedy(id)) || ts.Retried != 1 {
			t.Errorf("%s: archived after %d retries with %q; want after one retry, %q, %q and %q", how, ts.Retried, ts.LastErr, poison, want, poisonRemedy(id))
		}
		if n := e.rdb.Exists(context.Background(), crashKey(id)).Val(); n != 0 {
			t.Errorf("%s: the crash count outlives the archived task", how)
		}
	}
	if ts, _ := e.c.Task(context.Background(), neighbour); ts.State != "active" {
		t.Fatalf("the neighbouring task is %s while the crashes were archived; want it still running", ts.State)
	}
	if err := e.rdb.Set(context.Background(), "kiln-test:go:neighbour", 1, 0).Err(); err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(neighbour, time.Minute, "completed", state("completed"))
	if ts.Retried != 0 || ts.Progress.Message != "step 2" || e.sideEffects("neighbour") != 1 {
		t.Errorf("neighbour: retried %d, progress %+v, side effects %d; want it done once, its progress kept", ts.Retried, ts.Progress, e.sideEffects("neighbour"))
	}
	e.waitFor(inProcess, time.Minute, "completed", state("completed"))
}

// Crashes are counted in Redis: a task that crashed once under one worker
// is poison at its second crash under another.
func TestCrashesAreCountedAcrossWorkers(t *testing.T) {
	e := newEnv(t)
	stop := e.serveIsolated(map[string]int{scheduler.QueueGPU: 1})
	id := e.enqueue(crashLateArgs{How: "abort"})
	ts := e.waitFor(id, time.Minute, "crashed once", state("retry"))
	if !strings.Contains(ts.LastErr, "crash 1 of 2") || !strings.Contains(ts.LastErr, "SIGABRT") {
		t.Errorf("first crash recorded as %q", ts.LastErr)
	}
	if ttl := e.rdb.TTL(context.Background(), crashKey(id)).Val(); ttl <= 0 {
		t.Errorf("crash count TTL %v; want it to expire", ttl)
	}
	stop()
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	if err := insp.RunTask(scheduler.QueueGPU, id); err != nil {
		t.Fatal(err)
	}
	e.serveIsolated(map[string]int{scheduler.QueueGPU: 1})
	ts = e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.HasPrefix(ts.LastErr, poison) || !strings.HasSuffix(ts.LastErr, poisonRemedy(id)) {
		t.Errorf("archived with %q; want %q and %q", ts.LastErr, poison, poisonRemedy(id))
	}
}

// Twice means twice in one queued life: a task that crashed once, was
// cancelled and was enqueued again crashes once more and is retried, not
// archived as poison; its second crash in that life makes it poison. A
// crash's last words are the child's error line, without its colours, not
// the progress it logged after it.
func TestACrashBeforeACancelDoesNotCountAfterTheEnqueueAgain(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.serveIsolated(map[string]int{scheduler.QueueGPU: 1})
	// crash-late waits an hour to retry: each crash leaves it waiting.
	a := crashLateArgs{How: "killed"}
	crashedOnce := func(what string) {
		t.Helper()
		id := e.enqueue(a)
		ts := e.waitFor(id, time.Minute, what, func(ts scheduler.TaskStatus) bool { return ts.State == "retry" || ts.State == "archived" })
		if ts.State != "retry" || !strings.Contains(ts.LastErr, "crash 1 of 2") {
			t.Fatalf("%s: %s with %q; want it waiting to retry after its first crash of 2", what, ts.State, ts.LastErr)
		}
		if !strings.Contains(ts.LastErr, "signal: killed: ERROR\tshard upload failed\t{\"error\": \""+killedWhy+"\"}") ||
			strings.Contains(ts.LastErr, "\x1b") || strings.Contains(ts.LastErr, "step 40") {
			t.Errorf("%s: recorded as %q; want the exit and the error line, no colours, not the progress after it", what, ts.LastErr)
		}
		if n := e.rdb.Get(ctx, crashKey(id)).Val(); n != "1" {
			t.Errorf("%s: crash count %q; want 1", what, n)
		}
	}
	crashedOnce("crashed once")
	id, err := scheduler.TaskID(a)
	if err != nil {
		t.Fatal(err)
	}
	// Waiting to be tried again, it is withdrawn.
	if st, err := e.c.Cancel(ctx, id); err != nil || st != "withdrawn" {
		t.Fatalf("cancel: %s, %v", st, err)
	}
	crashedOnce("crashed once after it was enqueued again")

	// A retry is the same life: its crash is the second.
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	if err := insp.RunTask(scheduler.QueueGPU, id); err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(id, time.Minute, "archived", state("archived"))
	if !strings.HasPrefix(ts.LastErr, poison) || !strings.Contains(ts.LastErr, killedWhy) || !strings.HasSuffix(ts.LastErr, poisonRemedy(id)) {
		t.Errorf("archived with %q; want %q, the error line and %q", ts.LastErr, poison, poisonRemedy(id))
	}
	if e.rdb.Exists(ctx, crashKey(id)).Val() != 0 {
		t.Error("the crash count outlives the archived task")
	}
}

// The last words kept of a child's output are Go's report of its death,
// else its last error log line (JSON or console, colours stripped), else
// its last line that is no log line; never a log line below error level.
func TestLastWordsAreTheChildsReasonNotItsLastLogLine(t *testing.T) {
	for _, tc := range []struct {
		name, out, want string
	}{
		{"progress only", "2026-12-01T10:00:00.000Z\t\x1b[34mINFO\x1b[0m\tstep 40\t{\"loss\": 3.2}\n", ""},
		{"console error", "2026-12-01T10:00:00.000Z\t\x1b[31mERROR\x1b[0m\tupload failed\t{\"error\": \"reset\"}\n" +
			"2026-12-01T10:00:01.000Z\t\x1b[34mINFO\x1b[0m\tstep 40\n", "ERROR\tupload failed\t{\"error\": \"reset\"}"},
		{"json error", `{"level":"error","ts":"2026-12-01T10:00:00Z","msg":"upload failed","error":"reset"}` + "\n" +
			`{"level":"info","ts":"2026-12-01T10:00:01Z","msg":"step 40"}` + "\n", "ERROR upload failed: reset"},
		{"warning", `{"level":"warn","msg":"slow step"}` + "\n", ""},
		{"go's report", "2026-12-01T10:00:00.000Z\tERROR\tupload failed\nfatal error: out of memory\n\ngoroutine 1 [running]:\nmain.main()\n",
			"fatal error: out of memory"},
		{"a library's line", "2026-12-01T10:00:00.000Z\tERROR\tupload failed\nNCCL error: unhandled system error\n" +
			"2026-12-01T10:00:01.000Z\tINFO\tstep 40\n", "ERROR\tupload failed"},
		{"a library's line alone", "NCCL error: unhandled system error\n2026-12-01T10:00:01.000Z\tINFO\tstep 40", "NCCL error: unhandled system error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var passed bytes.Buffer
			l := &lastLines{out: &passed}
			for _, b := range []byte(tc.out) {
				// Byte by byte: a line arrives in pieces.
				if _, err := l.Write([]byte{b}); err != nil {
					t.Fatal(err)
				}
			}
			if got := l.why(); got != tc.want {
				t.Errorf("last words %q; want %q", got, tc.want)
			}
			if passed.String() != tc.out {
				t.Error("the output was not passed on as written")
			}
		})
	}
}

// A child's final error is archived at once with its text; a stop of the
// worker reaches the child as SIGTERM and re-queues its task without
// using a retry or counting a crash, its progress kept.
func TestAChildsErrorsAndStopsMapBack(t *testing.T) {
	e := newEnv(t)
	stop := e.serveIsolated(map[string]int{scheduler.QueueGPU: 2})
	final := e.enqueue(finalArgs{})
	ts := e.waitFor(final, time.Minute, "archived", state("archived"))
	if ts.Retried != 0 || ts.LastErr != "test:final: the payload names nothing (skip retry for the task)" {
		t.Errorf("final error: retried %d, %q", ts.Retried, ts.LastErr)
	}
	long := e.enqueue(gpuSlowArgs{slowArgs: slowArgs{Name: "long", Steps: 1000, StepMS: 20}})
	e.waitFor(long, time.Minute, "running", func(ts scheduler.TaskStatus) bool { return ts.Progress.Fraction > 0 })
	stop()
	ts, err := e.c.Task(context.Background(), long)
	if err != nil {
		t.Fatal(err)
	}
	if ts.State == "completed" || ts.Progress.State != "interrupted" || ts.Retried != 0 || ts.Progress.Fraction <= 0 ||
		!strings.Contains(ts.Progress.Message, "stopped at step") {
		t.Errorf("after the stop: state %s, retried %d, progress %+v; want re-queued, interrupted at a step, no retry used", ts.State, ts.Retried, ts.Progress)
	}
	if e.rdb.Exists(context.Background(), crashKey(long)).Val() != 0 {
		t.Error("a stop was counted as a crash")
	}
}

// `sched cancel` of a training segment in a child stops it at a step
// boundary: the child writes the stop checkpoint of the step it reached,
// and the task is archived as cancelled.
func TestCancelOfAnIsolatedSegmentCheckpointsAndArchives(t *testing.T) {
	e := newEnv(t)
	objDir, runDir := t.TempDir(), t.TempDir()
	objects, err := store.NewLocal(objDir)
	if err != nil {
		t.Fatal(err)
	}
	publishTestTokenizer(t, objects)
	e.serveIsolated(map[string]int{scheduler.QueueGPU: 1}, "KILN_TEST_TASK_TRAIN="+objDir+string(os.PathListSeparator)+runDir)
	id := e.enqueue(scheduler.TrainSegment{Run: "slow"})
	ctx := context.Background()
	for {
		st := e.rdb.HGetAll(ctx, scheduler.RunStateKey("slow")).Val()
		if n, _ := strconv.Atoi(st["step"]); n >= 3 {
			break
		}
		if ts, err := e.c.Task(ctx, id); err == nil && ts.State != "active" && ts.State != "pending" {
			t.Fatalf("segment %s before it trained: %s", ts.State, ts.LastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := e.c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	ts := e.waitFor(id, time.Minute, "archived", state("archived"))
	if !ts.Cancelled {
		t.Errorf("archived with %q and no cancel mark", ts.LastErr)
	}
	// The child checkpoints after asynq let go of the task: wait for it.
	var st map[string]string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if st = e.rdb.HGetAll(ctx, scheduler.RunStateKey("slow")).Val(); st["checkpoint"] != "" {
			break
		}
	}
	steps, err := segment.RemoteSteps(ctx, objects, "slow")
	ckpt, _ := strconv.Atoi(st["checkpoint"])
	reached, _ := strconv.Atoi(st["step"])
	if err != nil || len(steps) == 0 || steps[len(steps)-1] != ckpt || ckpt < reached {
		t.Errorf("run state %v, checkpoints in the store %v (%v); want the stop checkpoint uploaded, at the step the run reached or later", st, steps, err)
	}
}

// BenchmarkTaskInAChild measures a gpu task's time from enqueue to
// completion, in the worker's process and in a child process of its own:
// the difference is what isolation costs each task (process start, Go's
// start, connecting to Redis, handing the outcome back).
func BenchmarkTaskInAChild(b *testing.B) {
	for _, mode := range []string{"in-process", "child"} {
		b.Run(mode, func(b *testing.B) {
			r := testsvc.StartRedis(b)
			opt, _ := asynq.ParseRedisURI(r.URL(0))
			c := scheduler.NewClient(opt)
			defer c.Close()
			p := Params{Redis: opt, Queues: map[string]int{scheduler.QueueGPU: 1}, Logger: zap.NewNop(),
				Handlers: Handlers{Extra: isolatedTestHandlers()}}
			if mode == "child" {
				p.Isolate = &Isolation{Queues: []string{scheduler.QueueGPU}, Command: []string{os.Args[0], "-test.run=^$"},
					Env: []string{taskChildEnv + "=" + r.URL(0)}, Output: io.Discard}
			}
			w, err := New(p)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = w.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Enqueue(context.Background(), gpuSlowArgs{slowArgs: slowArgs{Name: fmt.Sprint(i), Steps: 0}}); err != nil {
					b.Fatal(err)
				}
				for {
					st, err := c.Status(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					if completed(st, scheduler.QueueGPU) == i+1 {
						break
					}
					time.Sleep(2 * time.Millisecond)
				}
			}
		})
	}
}

func completed(qs []scheduler.QueueStatus, queue string) int {
	for _, q := range qs {
		if q.Name == queue {
			return q.Completed
		}
	}
	return 0
}

// leftBehind is the script of a task's process that starts a process
// which outlives it (left, the shell run by start: it writes its pid to
// pidFile, then sleeps an hour), waits until it has written its pid, and
// exits 3 at a stop, leaving it running.
func leftBehind(start, pidFile string) string {
	return fmt.Sprintf(`trap 'exit 3' TERM; %s sh -c 'echo $$ > %s; exec sleep 3600' & `+
		`while [ ! -s %s ]; do sleep 0.01; done; : > "$KILN_TEST_READY/$$"; wait`, start, pidFile, pidFile)
}

// leftPid is the pid leftBehind's process wrote to pidFile; the test's end
// kills it, where it still runs.
func leftPid(t *testing.T, pidFile string) int {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", pidFile, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// running reports whether process pid still runs (a zombie, killed and
// not yet reaped by init, does not).
func running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// A task's process that dies at a cancel, leaving behind a process it
// started (a shell's background job, a helper), ends its task as any that
// dies does, and the process left behind is killed with it. It held the
// child's output and outcome pipes open, which the worker reads to their
// end: the task read as running until it ended, an hour later, and the
// gpu queue ran nothing else meanwhile.
func TestAProcessLeftBehindByATasksProcessIsKilledWithIt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("a task's process has a process group of its own on Linux only")
	}
	t.Parallel()
	e := newEnv(t)
	pidFile := filepath.Join(t.TempDir(), "left")
	ready, _ := e.isolatedShell(time.Hour, leftBehind("", pidFile), zap.NewNop())
	e.heldRun()
	id := e.enqueue(scheduler.TrainSegment{Run: "held"})
	ready(id)
	left := leftPid(t, pidFile)
	if _, err := e.c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	e.waitSays(id, "cancelled by sched cancel: its process ended as it stopped, without saying where (exit status 3), so the steps since its last checkpoint may be lost "+
		"(it had reached step 250 of 1000; object storage's newest checkpoint: step 247); 'sched enqueue train held' resumes the run from its last checkpoint")
	if running(left) {
		t.Errorf("process %d, left behind by the task's process, still runs after the task ended", left)
	}
	// The queue's slot is free: the next task runs.
	next := e.enqueue(heldArgs{})
	ready(next)
}

// A process left behind that left the task's process group too (setsid),
// which the worker cannot kill with it, holds the task's end back
// Isolation.OutputWait at most, and a warning says so.
func TestAProcessLeftBehindOutsideItsGroupHoldsTheTasksEndBackForAWhileOnly(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid: ", err)
	}
	t.Parallel()
	e := newEnv(t)
	e.outputWait = 100 * time.Millisecond
	core, logs := observer.New(zap.InfoLevel)
	pidFile := filepath.Join(t.TempDir(), "left")
	ready, _ := e.isolatedShell(time.Hour, leftBehind("setsid", pidFile), zap.New(core))
	id := e.enqueue(heldArgs{})
	ready(id)
	leftPid(t, pidFile)
	if _, err := e.c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	e.waitSays(id, "cancelled by sched cancel: its process ended as it stopped, without saying where (exit status 3); 'sched retry "+id+"' runs it again")
	if held := logs.FilterField(zap.String("task_id", id)).FilterMessageSnippet("left a process behind").All(); len(held) != 1 || held[0].Level != zap.WarnLevel {
		t.Errorf("the worker's log of the process left behind: %v; want one warning", held)
	}
}

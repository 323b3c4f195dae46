package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// A training segment queued while its store is being ingested waits for
// it, and status says what it waits for, neither as an error on its line
// nor among the failures; once the ingest is gone and the segment trains,
// its line shows no "last error": the wait was none.
func TestStatusActiveSegmentShowsNoPastWait(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetupStore(t, "code")
	ctx := context.Background()
	env, plan := queueUnservedIngest(t, env)
	startWorker(t, env, "--queues", "gpu=1")
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	waiting := waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  waiting  .*"waiting for the ingest of token store code`), time.Minute)
	if strings.Contains(waiting, "last error") {
		t.Errorf("a waiting segment's line calls its wait an error: %q", waiting)
	}
	if out, _, _ := sched(t, env, "status"); !strings.Contains(out, "FAILURES in the last hour\nnone\n") {
		t.Errorf("status lists a wait among the failures:\n%s", out)
	}
	out, _, _ := sched(t, env, "runs")
	if run := lineOf(out, "eta  "); !strings.HasPrefix(run, "eta  waiting  waiting for the ingest of token store code") || strings.Contains(run, "attempt") {
		t.Errorf("sched runs shows the waiting run as %q", run)
	}
	if task := lineWith(out, "  "+id+"  "); !strings.Contains(task, id+"  waiting  waiting for the ingest of token store code") ||
		!strings.Contains(task, "(no retry used)") || strings.Contains(task, "failed") {
		t.Errorf("sched runs shows the waiting segment as %q", task)
	}

	if out, errOut, code := sched(t, env, "cancel", plan); code != 0 {
		t.Fatalf("cancel %s: exit %d\n%s%s", plan, code, out, errOut)
	}
	// Now, not at the wait's next look.
	if out, errOut, code := sched(t, env, "retry", id); code != 0 {
		t.Fatalf("retry %s: exit %d\n%s%s", id, code, out, errOut)
	}
	line := waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  active  .*"run eta step \d+`), time.Minute)
	if strings.Contains(line, "last error") || strings.Contains(line, "waiting for") {
		t.Fatalf("the training segment's line shows its past wait: %q", line)
	}
}

// SIGTERM to the worker while a segment trains: the segment checkpoints
// and is re-queued without using a retry, and `sched runs` says so, not
// "attempt 0 of N failed"; status lists no failure. A new worker resumes
// the run, and the segment's line shows no "last error" from the stop.
func TestRunsSaysAGracefulStopIsNoFailedAttempt(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	waitOutput(t, env, regexp.MustCompile(`(?m)^eta  training  step [1-9]`), time.Minute, "status")
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker on SIGTERM: %v", err)
	}
	ts, err := q.Task(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// With no worker left, the segment waits in asynq's retry state
	// (or pending, had the forwarder moved it before it stopped).
	if (ts.State != "retry" && ts.State != "pending") || ts.Retried != 0 || !ts.HasProgress || ts.Progress.State != "interrupted" {
		t.Fatalf("segment after SIGTERM: %s, retried %d, progress %+v", ts.State, ts.Retried, ts.Progress)
	}
	out, _, _ := sched(t, env, "runs")
	run, task := lineOf(out, "eta  "), lineWith(out, "  "+id+"  ")
	if !strings.HasPrefix(run, "eta  interrupted, re-queued  step ") || !strings.Contains(run, "stopped by its worker's shutdown") ||
		!strings.Contains(run, "resumes from its last checkpoint") || strings.Contains(run, "attempt") || strings.Contains(run, "failed") {
		t.Errorf("sched runs shows the stopped run as %q", run)
	}
	if !strings.Contains(task, id+"  interrupted  by a worker's shutdown and re-queued (no retry used)") || strings.Contains(task, "failed") {
		t.Errorf("sched runs shows the stopped segment as %q", task)
	}
	if out, _, _ := sched(t, env, "status"); !strings.Contains(out, "FAILURES in the last hour\nnone\n") || strings.Contains(lineOf(out, "eta  "), "attempt") {
		t.Errorf("status after a graceful stop:\n%s", out)
	}

	startWorker(t, env, "--queues", "gpu=1")
	line := waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  active  .*"run eta step \d+`), time.Minute)
	if strings.Contains(line, "last error") || strings.Contains(line, "interrupted") {
		t.Fatalf("the resumed segment's line shows its stop as an error: %q", line)
	}
}

// lineWith returns the first line of out that contains s.
func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// A run's progress outlives its segment tasks, which asynq deletes once
// their retention has passed (a finished segment after 30 days): status
// and runs still show the run, as stopped, with how to resume it.
func TestRunsOutliveTheirTasks(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, env, regexp.MustCompile(`(?m)^eta  training  step [1-9]`), time.Minute, "status")
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker on SIGTERM: %v", err)
	}
	// The worker's log has each logged step (operations.md's "Logs").
	if log := workerLog(t, w); !regexp.MustCompile(`"msg":"step","run":"eta","step":20,"total":1000000,"loss":[0-9.]+,"tok_per_s":[1-9]`).MatchString(log) {
		t.Errorf("the worker's log has no line for step 20 with its loss and tok/s:\n%s", log)
	}
	// What retention does to the segment, whatever state it was left in.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if err := insp.DeleteTask(info.Queue, info.ID); err != nil {
		t.Fatalf("delete the segment task: %v", err)
	}
	for _, args := range [][]string{{"status"}, {"runs"}} {
		out, errOut, code := sched(t, env, args...)
		run := lineOf(out, "eta  ")
		if code != 0 || !strings.HasPrefix(run, "eta  stopped") || !strings.Contains(run, "sched enqueue train eta") {
			t.Errorf("sched %s with the run's task gone: exit %d, run line %q\n%s%s", args[0], code, run, out, errOut)
		}
	}
}

// A task cancelled before any worker took it reads cancelled, with the
// time of the cancel, in sched runs, and is no failure in sched status.
func TestCancelledQueuedTaskReadsCancelled(t *testing.T) {
	t.Parallel()
	env := []string{"KILN_REDIS_URL=redis://" + testsvc.Redis(t) + "/0", "KILN_DATA_DIR=" + t.TempDir()}
	out, errOut, code := sched(t, env, "enqueue", "bench", "tiny", "--engine", "cpu")
	m := regexp.MustCompile(`queued (bench:run:[0-9a-f]+) on gpu`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("enqueue: exit %d, %q %q", code, out, errOut)
	}
	before := time.Now().Add(-time.Second)
	if out, errOut, code := sched(t, env, "cancel", m[1]); code != 0 {
		t.Fatalf("cancel: exit %d, %q %q", code, out, errOut)
	}
	out, _, _ = sched(t, env, "runs")
	line := lineWith(out, "  "+m[1]+"  ")
	if !strings.Contains(line, m[1]+"  archived  cancelled by sched cancel") || strings.Contains(line, "failed") {
		t.Errorf("sched runs shows the cancelled task as %q", line)
	}
	if at, err := time.ParseInLocation("2006-01-02 15:04:05", line[:min(len(line), 19)], time.Local); err != nil || at.Before(before) {
		t.Errorf("sched runs dates the cancel %q (%v), want the time of the cancel", line, err)
	}
	if out, _, _ := sched(t, env, "status"); !strings.Contains(out, "FAILURES in the last hour\nnone\n") {
		t.Errorf("status lists the cancelled task among failures:\n%s", out)
	}
}

// A segment that waits for its store's ingest reports what its last try
// found, "1 task left" of it, and status shows that as the last try's,
// with when it looks again: once the ingest is done the report is out of
// date until that look, and must not read as the run's state now.
func TestStatusShowsAWaitAsItsLastTrys(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetupStore(t, "code")
	ctx := context.Background()
	env, plan := queueUnservedIngest(t, env)
	startWorker(t, env, "--queues", "gpu=1")
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	out := waitOutput(t, env, regexp.MustCompile(`(?m)^eta  waiting  `), time.Minute, "status")
	run := lineOf(out, "eta  ")
	stamp := `as of its last try at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ; it looks again at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ`
	if !regexp.MustCompile(`^eta  waiting  .*waiting for the ingest of token store code \(1 task left\) \(` + stamp + `\)$`).MatchString(run) {
		t.Errorf("status shows the waiting run as %q", run)
	}
	task := waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  waiting  `), time.Minute)
	if !regexp.MustCompile(`"waiting for the ingest of token store code \(1 task left\)"  ` + stamp).MatchString(task) {
		t.Errorf("status shows the waiting segment as %q", task)
	}

	// The ingest is over; the segment has not looked again, or has and
	// trains: either way its line says no wait as the state now.
	if out, errOut, code := sched(t, env, "cancel", plan); code != 0 {
		t.Fatalf("cancel %s: exit %d\n%s%s", plan, code, out, errOut)
	}
	out, _, _ = sched(t, env, "status")
	if run := lineOf(out, "eta  "); strings.Contains(run, "waiting for") && !regexp.MustCompile(stamp).MatchString(run) {
		t.Errorf("after the ingest, status shows the run as %q", run)
	}
}

// queueUnservedIngest queues an ingest of one file into store "code" with
// tokenizer "tk", where no worker serves the ingest queue: its plan, one
// task, stays live until it is cancelled. It returns env with the file's
// directory among KILN_LOCAL_ROOTS, and the plan's task id.
func queueUnservedIngest(t *testing.T, env []string) ([]string, string) {
	t.Helper()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.jsonl"), []byte(`{"text":"package main"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env = append(env, "KILN_LOCAL_ROOTS="+src)
	out, errOut, code := sched(t, env, "ingest", "local:"+filepath.Join(src, "*.jsonl"), "--store", "code", "--tokenizer", "tk")
	m := regexp.MustCompile(`queued (ingest:plan:\S+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("ingest: exit %d\n%s%s", code, out, errOut)
	}
	return env, m[1]
}

// An ingest queued while its tokenizer is being made waits for it, and
// the store's line in sched status says so, naming the tokenizer's task,
// where it said only that more files may be queued.
func TestStatusSaysWhatAnIngestsPlanWaitsFor(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := append(baseEnv(t), "KILN_REDIS_URL="+r.URL(0))
	data := strings.TrimPrefix(env[len(env)-2], "KILN_DATA_DIR=")
	if err := os.MkdirAll(filepath.Join(data, "src"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(data, "src", "a.go"), []byte("package a\n"), 0o644)
	opt, err := asynq.ParseRedisURI(r.URL(0))
	if err != nil {
		t.Fatal(err)
	}
	q := scheduler.NewClient(opt)
	defer q.Close()
	// The tokenizer is being made: its training is queued, on a queue no
	// worker here serves.
	train, err := q.Enqueue(context.Background(), scheduler.TokenizerTrain{Name: "tk-new", VocabSize: 512, Sample: "samples/tk-new/"})
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := sched(t, env, "enqueue", "ingest", "local:"+filepath.Join(data, "src", "*.go"), "--store", "code", "--tokenizer", "tk-new"); code != 0 {
		t.Fatalf("enqueue ingest: exit %d\n%s%s", code, out, errOut)
	}
	startWorker(t, env, "--queues", "ingest=1")
	waitOutput(t, env, regexp.MustCompile(`(?m)^code \(local:\S+\)  .*planning, waiting for tokenizer tk-new \(`+train.ID), time.Minute, "status")
}

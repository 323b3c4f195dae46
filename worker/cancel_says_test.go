package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// Kinds whose retry after a failure comes an hour later: a cancel's
// archive never meets asynq's try of the task it stopped, which a back-off
// of milliseconds can bring first (the cancel then finds it running again).
const (
	kindStopped = "test:stopped"
	kindHeld    = "test:held"
)

// stoppedArgs is slowArgs of kindStopped; with StopFails set, a stop
// fails too, with that error beside the stop's (as a stop checkpoint that
// is not written does).
type stoppedArgs struct {
	slowArgs
	StopFails string `json:"stop_fails,omitempty"`
}

// stopped is stoppedArgs' handler.
func stopped(ctx context.Context, a stoppedArgs) error {
	err := slow(ctx, a.slowArgs)
	if ctx.Err() != nil && a.StopFails != "" {
		return errors.Join(err, errors.New(a.StopFails))
	}
	return err
}

func (stoppedArgs) Kind() string { return kindStopped }

// heldArgs is a gpu task, run by isolatedShell's child.
type heldArgs struct{}

func (heldArgs) Kind() string { return kindHeld }

func init() {
	late := testPolicy
	late.Backoff, late.MaxBackoff = time.Hour, time.Hour
	scheduler.Define(kindStopped, late)
	late.Queue = scheduler.QueueGPU
	scheduler.Define(kindHeld, late)
}

// waitEnded waits until the handler of a cancelled task has returned: its
// progress leaves "running" (asynq lets go of the task, and the cancel
// archives it, before that).
func (e *env) waitEnded(id string) scheduler.TaskStatus {
	e.t.Helper()
	return e.waitFor(id, time.Minute, "ended by its handler", func(ts scheduler.TaskStatus) bool {
		return ts.State == "archived" && ts.HasProgress && ts.Progress.State != "running"
	})
}

// waitSays waits until cancelled task id is archived and its end says
// want (a try of it that asynq made before the cancel archived it may end
// first, and the stopped handler's end after).
func (e *env) waitSays(id, want string) {
	e.t.Helper()
	e.waitFor(id, time.Minute, fmt.Sprintf("archived, saying %q", want), func(ts scheduler.TaskStatus) bool {
		return ts.State == "archived" && ts.Cancelled && ts.Progress.State == "failed" && ts.Progress.Message == want
	})
}

// noMarks fails where a cancelled task's words carry what says nothing to
// a person: asynq's mark of a final error, or the stop's bare Go error.
func noMarks(t *testing.T, what, msg string) {
	t.Helper()
	for _, bad := range []string{"skip retry", "context canceled"} {
		if strings.Contains(msg, bad) {
			t.Errorf("%s says %q: %q", what, bad, msg)
		}
	}
}

// A task that sched cancel stopped says so, how far it had got, and what
// runs it again, where it said "cancelled by sched cancel: stopped at step
// 3 of 100000: context canceled (skip retry for the task)". Tried again by
// asynq before the cancel archived it (its worker found the cancel's mark
// and did not run it), it keeps those words, where that try's end said
// "not started again" in their place.
func TestACancelledTaskSaysWhatRunsItAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// The cancel's message stops the task here, not its mark (below: the
	// mark alone, without the message, is set first).
	e.cancelCheckEvery = time.Hour
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(stopped))
	e.startInProcess()
	ctx := context.Background()
	said := func(id string) *regexp.Regexp {
		return regexp.MustCompile(`^cancelled by sched cancel \(its last report: step \d+\); 'sched retry ` + regexp.QuoteMeta(id) + `' runs it again$`)
	}
	id := e.enqueue(stoppedArgs{slowArgs: slowArgs{Name: "stopped", Steps: 100_000, StepMS: 10}})
	e.waitFor(id, time.Minute, "past its first step", func(ts scheduler.TaskStatus) bool { return ts.Progress.Fraction > 0 })
	if _, err := e.c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	ts := e.waitEnded(id)
	if !ts.Cancelled || ts.Progress.State != "failed" || !said(id).MatchString(ts.Progress.Message) {
		t.Fatalf("the cancelled task's end: cancelled %v, progress %s %q; want %v", ts.Cancelled, ts.Progress.State, ts.Progress.Message, said(id))
	}
	noMarks(t, "the cancelled task", ts.Progress.Message)

	// A stop that failed as well says how, and the stop's own error no
	// more.
	id = e.enqueue(stoppedArgs{slowArgs: slowArgs{Name: "failed-stop", Steps: 100_000, StepMS: 10}, StopFails: "write the stop's checkpoint: disk full"})
	e.waitFor(id, time.Minute, "past its first step", func(ts scheduler.TaskStatus) bool { return ts.Progress.Fraction > 0 })
	if _, err := e.c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	ts = e.waitEnded(id)
	failed := regexp.MustCompile(`^cancelled by sched cancel \(its last report: step \d+\), ending with: write the stop's checkpoint: disk full; 'sched retry ` + regexp.QuoteMeta(id) + `' runs it again$`)
	if !failed.MatchString(ts.Progress.Message) {
		t.Fatalf("the cancelled task whose stop failed: %q; want %v", ts.Progress.Message, failed)
	}
	noMarks(t, "the cancelled task whose stop failed", ts.Progress.Message)

	// The cancel's two halves, its mark and the stop, without its
	// archive: asynq sets the task to retry, and runs it again at once.
	id = e.enqueue(slowArgs{Name: "tried-again", Steps: 100_000, StepMS: 10})
	e.waitFor(id, time.Minute, "past its first step", func(ts scheduler.TaskStatus) bool { return ts.Progress.Fraction > 0 })
	if err := e.rdb.Set(ctx, "kiln:cancel:"+id, time.Now().Unix(), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspector(e.opt)
	defer insp.Close()
	if err := insp.CancelProcessing(id); err != nil {
		t.Fatal(err)
	}
	// Archived by its try after the stop, with the words of the stop (a
	// handler still stopping as the try ends writes them after it).
	e.waitFor(id, time.Minute, "archived with its stop's words", func(ts scheduler.TaskStatus) bool {
		return ts.State == "archived" && ts.Retried > 0 && ts.Progress.State == "failed" && said(id).MatchString(ts.Progress.Message)
	})
}

// A cancel whose message no subscription heard (published while the
// worker was connecting to Redis, or connecting again after its
// connection dropped) stops the task still, by the mark it left: the task
// ran on, and sched cancel answered "cancelling".
func TestACancelWhoseMessageNoWorkerHeardStopsTheTaskByItsMark(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.cancelCheckEvery = 20 * time.Millisecond
	e.handlers.Extra = append(e.handlers.Extra, HandlerFunc(stopped))
	e.startInProcess()
	id := e.enqueue(stoppedArgs{slowArgs: slowArgs{Name: "unheard", Steps: 100_000, StepMS: 10}})
	e.waitFor(id, time.Minute, "past its first step", func(ts scheduler.TaskStatus) bool { return ts.Progress.Fraction > 0 })
	// The cancel's mark, without its message.
	if err := e.rdb.Set(context.Background(), "kiln:cancel:"+id, time.Now().Unix(), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	said := regexp.MustCompile(`^cancelled by sched cancel \(its last report: step \d+\); 'sched retry ` + regexp.QuoteMeta(id) + `' runs it again$`)
	ts := e.waitFor(id, time.Minute, "archived as cancelled", func(ts scheduler.TaskStatus) bool {
		return ts.State == "archived" && ts.Cancelled && ts.Progress.State == "failed"
	})
	if !said.MatchString(ts.Progress.Message) || ts.Retried != 0 {
		t.Fatalf("the task cancelled by its mark alone: retried %d, %q; want no retry used, %v", ts.Retried, ts.Progress.Message, said)
	}
}

// A training segment that sched cancel stopped says the step it stopped
// at, that the checkpoint of that step is in object storage, and that
// 'sched enqueue train <run>' resumes the run: it goes on from there,
// nothing redone.
func TestACancelledSegmentSaysWhereItStopped(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tokName := publishTestTokenizer(t, objects)
	e.trainPattern(objects, patternRun("stopped-one", tokName, 1e-3, 100000, 50, 1000))
	id := e.enqueue(scheduler.TrainSegment{Run: "stopped-one"})
	ctx := context.Background()
	for deadline := time.Now().Add(time.Minute); e.rdb.HGet(ctx, scheduler.RunStateKey("stopped-one"), "step").Val() == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("training did not start")
		}
	}
	if _, err := e.c.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	ts := e.waitEnded(id)
	st, _, err := scheduler.ReadRunState(ctx, e.rdb, "stopped-one")
	if err != nil {
		t.Fatal(err)
	}
	if st.Checkpoint != st.Step || st.Step <= 0 {
		t.Fatalf("run state after the cancel: step %d, checkpoint %d; want the stop step's checkpoint uploaded", st.Step, st.Checkpoint)
	}
	want := fmt.Sprintf("cancelled by sched cancel at step %d of 100000, whose checkpoint is in object storage; 'sched enqueue train stopped-one' resumes the run from its last checkpoint", st.Step)
	if ts.Progress.Message != want {
		t.Fatalf("the cancelled segment's end:\n%q\nwant\n%q", ts.Progress.Message, want)
	}
}

// isolatedShell runs a worker whose gpu queue runs each task in a child
// process of script (sh), with ShutdownGrace grace, until the test ends
// or shutdown (its SIGTERM) returns; script gets the directory that ready
// reads in $KILN_TEST_READY.
func (e *env) isolatedShell(grace time.Duration, script string, log *zap.Logger) (ready func(id string), shutdown func()) {
	e.t.Helper()
	dir := e.t.TempDir()
	w, err := New(Params{Redis: e.opt, Queues: map[string]int{scheduler.QueueGPU: 1}, Handlers: e.handlers, Logger: log,
		ShutdownGrace: grace, ProgressEvery: time.Millisecond,
		Isolate: &Isolation{Queues: []string{scheduler.QueueGPU}, Command: []string{"sh", "-c", script},
			Env: []string{"KILN_TEST_READY=" + dir}, Output: os.Stderr, OutputWait: e.outputWait}})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	shutdown = func() { once.Do(func() { cancel(); <-done }) }
	e.t.Cleanup(shutdown)
	// ready waits for task id to run, and for its process to have made
	// its file in the directory: it has set its SIGTERM trap, which a
	// SIGTERM before it would miss.
	return func(id string) {
		e.t.Helper()
		e.waitFor(id, time.Minute, "running", state("active"))
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if made, _ := filepath.Glob(filepath.Join(dir, "*")); len(made) == 1 {
				os.Remove(made[0])
				return
			}
			if time.Now().After(deadline) {
				e.t.Fatalf("task %s's process never started", id)
			}
		}
	}, shutdown
}

// heldRun is the state of run "held" as its segment left it: trained to
// step 250, its newest checkpoint in object storage step 247.
func (e *env) heldRun() {
	e.t.Helper()
	if err := e.rdb.HSet(context.Background(), scheduler.RunStateKey("held"), "step", 250, "total", 1000, "checkpoint", 247).Err(); err != nil {
		e.t.Fatal(err)
	}
}

// A task run in a child process that does not stop within the grace of a
// cancel is killed, and says so, and what that lost: a training segment
// the steps since its last checkpoint, with the step it had reached and
// object storage's newest checkpoint. Its child here ignores SIGTERM, as
// a step longer than the grace does in effect: it ends only when killed.
func TestATaskKilledAtTheGraceOfACancelSaysWhatWasLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	core, logs := observer.New(zap.InfoLevel)
	ready, _ := e.isolatedShell(50*time.Millisecond, `trap '' TERM; : > "$KILN_TEST_READY/$$"; exec sleep 3600`, zap.New(core))
	e.heldRun()
	ctx := context.Background()
	for _, c := range []struct {
		args scheduler.Args
		lost func(id string) string
	}{
		{scheduler.TrainSegment{Run: "held"}, func(string) string {
			return ", losing the steps since its last checkpoint (it had reached step 250 of 1000; object storage's newest checkpoint: step 247); " +
				"'sched enqueue train held' resumes the run from its last checkpoint"
		}},
		{heldArgs{}, func(id string) string { return "; 'sched retry " + id + "' runs it again" }},
	} {
		id := e.enqueue(c.args)
		ready(id)
		if _, err := e.c.Cancel(ctx, id); err != nil {
			t.Fatal(err)
		}
		want := "cancelled by sched cancel: its process outlasted the worker's grace (KILN_SHUTDOWN_GRACE, 50ms) and was killed" + c.lost(id)
		e.waitSays(id, want)
		// Asked for, and yet work was lost: a warning, no error.
		for deadline := time.Now().Add(time.Minute); logs.FilterField(zap.String("task_id", id)).FilterMessageSnippet("was killed").Len() == 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the worker logged no kill of %s", id)
			}
		}
		for _, l := range logs.FilterField(zap.String("task_id", id)).FilterMessageSnippet("was killed").All() {
			if l.Level != zap.WarnLevel {
				t.Errorf("the kill of %s is logged at %s: %q", id, l.Level, l.Message)
			}
		}
	}
}

// A segment whose process, asked to stop by a cancel, dies without its
// outcome says that the steps since its last checkpoint may be lost, and
// how it died, not that it wrote the checkpoint of the step it stopped
// at. The grace is an hour: no kill comes.
func TestASegmentWhoseProcessDiedAtItsCancelSaysStepsMayBeLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ready, _ := e.isolatedShell(time.Hour, `trap 'kill $!; exit 3' TERM; : > "$KILN_TEST_READY/$$"; sleep 3600 & wait`, zap.NewNop())
	e.heldRun()
	id := e.enqueue(scheduler.TrainSegment{Run: "held"})
	ready(id)
	if _, err := e.c.Cancel(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	e.waitSays(id, "cancelled by sched cancel: its process ended as it stopped, without saying where (exit status 3), so the steps since its last checkpoint may be lost "+
		"(it had reached step 250 of 1000; object storage's newest checkpoint: step 247); 'sched enqueue train held' resumes the run from its last checkpoint")
}

// A segment whose process outlasts the grace of its worker's shutdown is
// killed, and says so and what that lost, with the step it had reached
// and object storage's newest checkpoint, where it said "the task's
// process was stopped: signal: killed: context canceled". It is queued
// again, as any task the shutdown stopped, using no retry.
func TestASegmentKilledAtTheGraceOfItsWorkersShutdownSaysWhatWasLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ready, shutdown := e.isolatedShell(50*time.Millisecond, `trap '' TERM; : > "$KILN_TEST_READY/$$"; exec sleep 3600`, zap.NewNop())
	e.heldRun()
	id := e.enqueue(scheduler.TrainSegment{Run: "held"})
	ready(id)
	shutdown()
	want := "interrupted by worker shutdown: its process outlasted the worker's grace (KILN_SHUTDOWN_GRACE, 50ms) and was killed, " +
		"losing the steps since its last checkpoint (it had reached step 250 of 1000; object storage's newest checkpoint: step 247)"
	ts, err := e.c.Task(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if ts.Progress.State != "interrupted" || ts.Progress.Message != want || ts.Retried != 0 || ts.State == "archived" {
		t.Fatalf("the segment after its worker's shutdown: %s, retried %d, %s %q;\nwant it queued again, no retry used, interrupted %q",
			ts.State, ts.Retried, ts.Progress.State, ts.Progress.Message, want)
	}
	if !scheduler.ProcessEndedAtStop(ts.Progress.Message) {
		t.Errorf("scheduler.ProcessEndedAtStop(%q) is false", ts.Progress.Message)
	}
}

package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// cancelledLines are what `sched cancel`, `sched status <id>` and `sched
// runs` say of training segment id once its handler has ended after the
// cancel (status matches ended), with the run's state then.
func cancelledLines(t *testing.T, env []string, q *scheduler.Client, id string, ended *regexp.Regexp) (cancel, status, runs string, st scheduler.RunState) {
	t.Helper()
	out, errOut, code := sched(t, env, "cancel", id)
	if code != 0 {
		t.Fatalf("cancel %s: exit %d %q %q", id, code, out, errOut)
	}
	cancel = strings.TrimSuffix(out, "\n")
	status = strings.TrimSuffix(waitStatus(t, env, id, ended, 2*time.Minute), "\n")
	out, _, _ = sched(t, env, "runs")
	runs = lineWith(out, "  "+id+"  ")
	st, _, err := scheduler.ReadRunState(context.Background(), q.Redis(), "eta")
	if err != nil {
		t.Fatal(err)
	}
	return cancel, status, runs, st
}

// A training segment that sched cancel stopped reads, in `sched status
// <id>` and `sched runs`, the step it stopped at, where the checkpoint of
// that step is, and that 'sched enqueue train <run>' resumes the run:
// where status read `"cancelled by sched cancel: train:segment: run eta:
// context canceled (skip retry for the task)"  last error: context
// canceled` and runs `enqueue it again to redo it`. One whose process did
// not stop within the worker's grace (KILN_SHUTDOWN_GRACE) was killed,
// and reads so, with the steps since its last checkpoint lost, where it
// read as if it had written its stop step's checkpoint; `sched cancel`
// no longer says it keeps that checkpoint before it knows. The process is
// held stopped (SIGSTOP), as a step longer than the grace holds it: it
// can end only by the worker's kill.
func TestACancelledSegmentSaysWhereItStoppedAndWhatResumesIt(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, env, "--queues", "gpu=1")
	if _, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"}); err != nil {
		t.Fatal(err)
	}
	id := waitRunningSegment(t, q)
	for deadline := time.Now().Add(time.Minute); rdb.HGet(ctx, scheduler.RunStateKey("eta"), "step").Val() == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the segment trained no step in a minute")
		}
	}
	cancelled := func(id string) string {
		return id + " cancelled: archived, and it will not run again; its worker stops it at the end of the step under way, and the segment writes that step's checkpoint " +
			"if the step ends within the worker's grace (KILN_SHUTDOWN_GRACE; else its process is killed, and the steps since its last checkpoint are lost): " +
			"'sched status " + id + "' says where it stopped"
	}
	const resumes = "; 'sched enqueue train eta' resumes the run from its last checkpoint"
	cancel, status, runs, st := cancelledLines(t, env, q, id, regexp.MustCompile(`cancelled by sched cancel at step`))
	// The step the run reached, as status reads it.
	at := max(st.Step, st.Checkpoint)
	where := "whose checkpoint is in object storage"
	if st.Checkpoint != at {
		// Its upload did not end within the grace (a loaded machine).
		ts, err := q.Task(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		where = fmt.Sprintf("whose checkpoint is on the disk of worker %s only (object storage's newest checkpoint: step %d)", ts.Progress.Worker, st.Checkpoint)
	}
	said := fmt.Sprintf("cancelled by sched cancel at step %d of 1000000, %s%s", at, where, resumes)
	if cancel != cancelled(id) {
		t.Errorf("sched cancel of a training segment:\n%q\nwant\n%q", cancel, cancelled(id))
	}
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(id) + `  archived  \d+\.\d%  ` + regexp.QuoteMeta(said) + `$`).MatchString(status) {
		t.Errorf("sched status of the cancelled segment:\n%q\nwant its id, archived, its fraction, then\n%q", status, said)
	}
	if !strings.Contains(runs, "  "+id+"  archived  "+said+"  run eta queued at step 0") {
		t.Errorf("sched runs of the cancelled segment:\n%q\nwant it archived, then\n%q", runs, said)
	}
	for what, line := range map[string]string{"status": status, "runs": runs} {
		for _, bad := range []string{"skip retry", "context canceled", "last error", "redo"} {
			if strings.Contains(line, bad) {
				t.Errorf("sched %s of the cancelled segment says %q: %q", what, bad, line)
			}
		}
	}

	// Its process killed at the grace: a worker whose grace is short,
	// the task's process held stopped when the cancel comes.
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker on SIGTERM: %v", err)
	}
	w = startWorker(t, append(env, "KILN_SHUTDOWN_GRACE=1s"), "--queues", "gpu=1")
	if out, errOut, code := sched(t, env, "enqueue", "train", "eta"); code != 0 {
		t.Fatalf("enqueue train eta: exit %d %q %q", code, out, errOut)
	}
	id = waitRunningSegment(t, q)
	// Past the checkpoint it resumed from: steps to lose.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		now, _, err := scheduler.ReadRunState(ctx, q.Redis(), "eta")
		if err != nil {
			t.Fatal(err)
		}
		if now.Step > at {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the resumed segment trained no step past %d in a minute", at)
		}
	}
	freezeChildren(t, w.Process.Pid)
	cancel, status, runs, st = cancelledLines(t, env, q, id, regexp.MustCompile(`was killed`))
	said = fmt.Sprintf("cancelled by sched cancel: its process outlasted the worker's grace (KILN_SHUTDOWN_GRACE, 1s) and was killed, "+
		"losing the steps since its last checkpoint (it had reached step %d of 1000000; object storage's newest checkpoint: step %d)%s", max(st.Step, st.Checkpoint), st.Checkpoint, resumes)
	if cancel != cancelled(id) {
		t.Errorf("sched cancel of a training segment:\n%q\nwant\n%q", cancel, cancelled(id))
	}
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(id) + `  archived  \d+\.\d%  ` + regexp.QuoteMeta(said) + `$`).MatchString(status) {
		t.Errorf("sched status of the segment killed at the grace:\n%q\nwant its id, archived, its fraction, then\n%q", status, said)
	}
	// Cut to its line, it keeps what resumes the run.
	if !strings.Contains(runs, "  "+id+"  archived  cancelled by sched cancel: its process outlasted the worker's grace") ||
		!strings.Contains(runs, resumes+"  run eta queued at step ") {
		t.Errorf("sched runs of the segment killed at the grace:\n%q\nwant it killed, and what resumes the run", runs)
	}
	// The run's own line says the steps after its checkpoint are lost.
	out, _, _ := sched(t, env, "status")
	if line := lineWith(out, "eta  cancelled"); !strings.Contains(line, "by sched cancel, its process killed before it stopped: the steps after its last checkpoint are lost; 'sched enqueue train eta' resumes it from that checkpoint") {
		t.Errorf("the run's line after its segment was killed at the grace:\n%q\nwant it to say the steps after its checkpoint are lost", line)
	}
	for what, line := range map[string]string{"status": status, "runs": runs} {
		for _, bad := range []string{"skip retry", "context canceled", "last error", "redo", "signal: killed"} {
			if strings.Contains(line, bad) {
				t.Errorf("sched %s of the segment killed at the grace says %q: %q", what, bad, line)
			}
		}
	}
}

// A task sched cancel archived reads, in its status line and in sched
// runs, what runs it again: a training segment's run resumes from its
// checkpoint, any other task is retried; while its handler still stops,
// it says so; an attempt that failed before the cancel withdrew it keeps
// its error. Where it was archived before its worker wrote a word (an
// older worker's message), it says no more than the cancel.
func TestACancelledTasksLineSaysWhatRunsItAgain(t *testing.T) {
	at := time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)
	seg, err := scheduler.Encode(scheduler.TrainSegment{Run: "r3", FromStep: 50})
	if err != nil {
		t.Fatal(err)
	}
	const resumes = "'sched enqueue train r3' resumes the run from its last checkpoint"
	task := func(kind string, payload []byte, p *scheduler.Progress, lastErr string) scheduler.TaskStatus {
		ts := scheduler.TaskStatus{ID: kind + ":abc", Kind: kind, Queue: "gpu", State: "archived", Cancelled: true, Payload: payload, LastErr: lastErr, Finished: at}
		if p != nil {
			ts.Progress, ts.HasProgress = *p, true
		}
		return ts
	}
	for _, c := range []struct {
		name       string
		ts         scheduler.TaskStatus
		task, runs string
	}{
		{"an older worker's words",
			task(scheduler.KindTrainSegment, seg, &scheduler.Progress{State: "failed", Fraction: 0.057, Message: "cancelled by sched cancel: train:segment: run r3: context canceled (skip retry for the task)"}, "context canceled"),
			"train:segment:abc  archived  5.7%  cancelled by sched cancel; " + resumes,
			"train:segment:abc  archived  cancelled by sched cancel; " + resumes + "  run r3 queued at step 50"},
		{"still stopping",
			task(scheduler.KindTrainSegment, seg, &scheduler.Progress{State: "running", Fraction: 0.057, Message: "run r3 step 85/1500 loss 3.2000", Updated: at.Add(-3 * time.Second)}, "context canceled"),
			"train:segment:abc  archived  5.7%  cancelled by sched cancel, and not stopped yet at its last report (3s ago): its worker stops it at the end of the step under way, " +
				"and writes that step's checkpoint if the step ends within the worker's grace (KILN_SHUTDOWN_GRACE), else kills it, losing the steps since its last checkpoint; " + resumes,
			""},
		{"withdrawn from its retry",
			task(scheduler.KindIngestShard, nil, &scheduler.Progress{State: "failed", Fraction: -1, Message: "read org/code a.parquet: connection reset"}, "read org/code a.parquet: connection reset"),
			"ingest:shard:abc  archived  cancelled by sched cancel; 'sched retry ingest:shard:abc' runs it again  last error before the cancel: read org/code a.parquet: connection reset",
			"ingest:shard:abc  archived  cancelled by sched cancel; 'sched retry ingest:shard:abc' runs it again"},
		{"withdrawn before it ran",
			task(scheduler.KindBenchRun, nil, nil, ""),
			"bench:run:abc  archived  cancelled by sched cancel; 'sched retry bench:run:abc' runs it again",
			"bench:run:abc  archived  cancelled by sched cancel; 'sched retry bench:run:abc' runs it again"},
	} {
		if line := taskLine(c.ts, nil, at, false, taskErrRunes); line != c.task {
			t.Errorf("%s: status line\n%q\nwant\n%q", c.name, line, c.task)
		}
		if c.runs == "" {
			continue
		}
		if line := outcomeLine(c.ts); line != c.runs {
			t.Errorf("%s: runs line\n%q\nwant\n%q", c.name, line, c.runs)
		}
	}
}

// An ingest whose latest plan failed before it queued a file names the
// plan and the retry that queues it again on its INGEST line, where it read
// "files 0/0 done  its plan failed (see FAILURES)"; one that failed after
// it queued files never reads done, as a cancelled one does not.
func TestAnIngestWhosePlanFailedNeverReadsDone(t *testing.T) {
	at := time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)
	plan, err := scheduler.Encode(scheduler.IngestPlan{Dataset: "org/code", Store: "code", Tokenizer: "tk"})
	if err != nil {
		t.Fatal(err)
	}
	failed := scheduler.TaskStatus{ID: "ingest:plan:p1", Kind: scheduler.KindIngestPlan, Queue: "ingest", State: "archived", Payload: plan,
		LastErr: "dataset org/code is gated: accept its terms and set HF_TOKEN (skip retry for the task)", LastFailed: at, Finished: at}
	shard, err := scheduler.Encode(scheduler.IngestShard{Dataset: "org/code", Store: "code", Path: "a.parquet", ShardID: "a", Size: 100})
	if err != nil {
		t.Fatal(err)
	}
	apnd, err := scheduler.Encode(scheduler.IngestAppend{Store: "code", ShardID: "a", Tokens: 10})
	if err != nil {
		t.Fatal(err)
	}
	file := []scheduler.TaskStatus{
		{ID: "ingest:shard:a", Kind: scheduler.KindIngestShard, Queue: "ingest", State: "completed", Payload: shard, Finished: at.Add(-time.Minute)},
		{ID: "ingest:append:a", Kind: scheduler.KindIngestAppend, Queue: "append", State: "completed", Payload: apnd, Finished: at.Add(-time.Minute)},
	}
	for _, c := range []struct {
		name  string
		tasks []scheduler.TaskStatus
		want  string
	}{
		{"before a file", []scheduler.TaskStatus{failed},
			"code (org/code)  its plan ingest:plan:p1 failed before it queued a file ('sched status ingest:plan:p1' says why): 'sched retry ingest:plan:p1' queues it again"},
		{"after a file", append([]scheduler.TaskStatus{failed}, file...),
			"code (org/code)  files 1/1 done  100 B of 100 B  10 tok  its plan ingest:plan:p1 failed ('sched status ingest:plan:p1' says why), so any files it had not queued yet are not ingested: " +
				"'sched retry ingest:plan:p1' queues those the store lacks, none twice"},
	} {
		snap := &scheduler.Snapshot{At: at.Add(time.Hour), Tasks: c.tasks}
		var line string
		for _, d := range snap.Datasets() {
			if d.Store == "code" {
				line = datasetLine(d, snap, time.Time{})
			}
		}
		if line != c.want {
			t.Errorf("%s: %q\nwant %q", c.name, line, c.want)
		}
	}
}

// A segment whose process outlasts the grace of its worker's SIGTERM is
// killed: its task's line in `sched status <id>` and `sched runs`, and
// its run's line, say so and that the steps since its last checkpoint are
// lost, where the task read "the task's process was stopped: signal:
// killed" and the run "stopped by its worker's shutdown at a step
// boundary". A worker started again resumes the run from that checkpoint.
// The process is held stopped (SIGSTOP), as a step longer than the grace
// holds it: it can end only by the worker's kill.
func TestASegmentKilledAtItsWorkersGraceSaysTheStepsAreLost(t *testing.T) {
	t.Parallel()
	env, rdb, q := trainingSetup(t)
	ctx := context.Background()
	w := startWorker(t, append(env, "KILN_SHUTDOWN_GRACE=1s"), "--queues", "gpu=1")
	if _, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"}); err != nil {
		t.Fatal(err)
	}
	id := waitRunningSegment(t, q)
	// Past its first checkpoint: a checkpoint to resume from.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		st, _, err := scheduler.ReadRunState(ctx, rdb, "eta")
		if err != nil {
			t.Fatal(err)
		}
		if st.Checkpoint > 0 && st.Step > st.Checkpoint {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the segment trained past no checkpoint in a minute (step %d, checkpoint %d)", st.Step, st.Checkpoint)
		}
	}
	freezeChildren(t, w.Process.Pid)
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker on SIGTERM: %v", err)
	}
	st, _, err := scheduler.ReadRunState(ctx, rdb, "eta")
	if err != nil {
		t.Fatal(err)
	}
	said := fmt.Sprintf("interrupted by worker shutdown: its process outlasted the worker's grace (KILN_SHUTDOWN_GRACE, 1s) and was killed, "+
		"losing the steps since its last checkpoint (it had reached step %d of 1000000; object storage's newest checkpoint: step %d)", st.Step, st.Checkpoint)
	status, _, _ := sched(t, env, "status", id)
	if !strings.Contains(status, fmt.Sprintf("%q", said)) {
		t.Errorf("sched status of the segment killed at its worker's grace:\n%q\nwant\n%q", status, said)
	}
	out, _, _ := sched(t, env, "runs")
	runs := lineWith(out, "  "+id+"  ")
	if want := "  " + id + "  interrupted  by a worker's shutdown: its process outlasted the worker's grace (KILN_SHUTDOWN_GRACE, 1s) and was killed, losing the steps since its last checkpoint"; !strings.Contains(runs, want) ||
		!strings.Contains(runs, "; re-queued (no retry used)") {
		t.Errorf("sched runs of the segment killed at its worker's grace:\n%q\nwant\n%q, then re-queued", runs, want)
	}
	out, _, _ = sched(t, env, "status")
	if line := lineWith(out, "eta  interrupted"); !strings.Contains(line, "by its worker's shutdown, its process killed before it stopped: the steps after its last checkpoint are lost; it resumes from that checkpoint (no retry used)") {
		t.Errorf("the run's line after its segment was killed at its worker's grace:\n%q\nwant it to say the steps after its checkpoint are lost", line)
	}
	for what, line := range map[string]string{"status": status, "runs": runs} {
		for _, bad := range []string{"signal: killed", "context canceled", "step boundary"} {
			if strings.Contains(line, bad) {
				t.Errorf("sched %s of the segment killed at its worker's grace says %q: %q", what, bad, line)
			}
		}
	}

	// Taken up again, from the checkpoint.
	startWorker(t, env, "--queues", "gpu=1")
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		now, _, err := scheduler.ReadRunState(ctx, rdb, "eta")
		if err != nil {
			t.Fatal(err)
		}
		if now.Step > st.Step {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run trained no step past %d in two minutes of a worker started again", st.Step)
		}
	}
}

package main

import (
	"context"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// A run's name given to `sched cancel` or `sched retry`, where a task's id
// goes ("stop a run" is typed 'sched cancel pilot'), is named as a run, as
// `sched status` names it, with what to type instead: the command with the
// id of its live or last segment, or 'sched enqueue train' where it has
// none. Both said "task not found in queues". A run is known by its state
// in Redis, by a segment in the queues alone (queued where another runs
// file is read), or by the runs known here (a preset never started); any
// other name is still a task not found.
func TestCancelAndRetryOfARunNameSayWhatToType(t *testing.T) {
	t.Parallel()
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + t.TempDir()}
	ctx := context.Background()
	q := scheduler.NewClient(asynq.RedisClientOpt{Addr: r.Addr})
	defer q.Close()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	// Run pilot trained to a checkpoint at step 40; its next segment waits.
	if err := rdb.HSet(ctx, scheduler.RunStateKey("pilot"), "step", "40", "total", "100", "checkpoint", "40").Err(); err != nil {
		t.Fatal(err)
	}
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "pilot", FromStep: 40})
	if err != nil {
		t.Fatal(err)
	}
	seg := info.ID

	head := `"pilot" is a run, not a task id`
	wantRefused(t, env, head+": its segment "+seg+" is queued: 'sched cancel "+seg+"' withdraws it, and it does not run (it resumes from its last checkpoint with 'sched enqueue train pilot')", "cancel", "pilot")
	wantRefused(t, env, head+": its segment "+seg+" is queued already: nothing to retry ('sched status "+seg+"' follows it)", "retry", "pilot")
	wantRefused(t, env, head+": 'sched runs' and 'sched status' show its progress, 'sched results pilot' its figures; 'sched status "+seg+"' shows its live segment", "status", "pilot")

	if out, errOut, code := sched(t, env, "cancel", seg); code != 0 {
		t.Fatalf("cancel %s: exit %d %q %q", seg, code, out, errOut)
	}
	wantRefused(t, env, head+": its last segment "+seg+" was cancelled by sched cancel: 'sched retry "+seg+"' runs it again, resuming the run from its last checkpoint", "retry", "pilot")
	wantRefused(t, env, head+", and no segment of it is queued or running: nothing to cancel (its last segment "+seg+" was cancelled: 'sched retry "+seg+"' runs it again)", "cancel", "pilot")
	wantRefused(t, env, "'sched status "+seg+"' shows its last segment", "status", "pilot")

	// Known by its queued segment alone: no state, and no runs entry here.
	other, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "elsewhere"})
	if err != nil {
		t.Fatal(err)
	}
	wantRefused(t, env, `"elsewhere" is a run, not a task id: its segment `+other.ID+" is queued: 'sched cancel "+other.ID+"' withdraws it, and it does not run ('sched enqueue train elsewhere' queues it again)", "cancel", "elsewhere")
	// A preset that never started.
	wantRefused(t, env, `"demo" is a run, not a task id, and no segment of it is queued or running: nothing to cancel (it has not started: 'sched enqueue train demo' starts it)`, "cancel", "demo")
	wantRefused(t, env, `"demo" is a run, not a task id: nothing of it to retry (it has not started: 'sched enqueue train demo' starts it)`, "retry", "demo")
	// Not a run: the task is not found, as before.
	for _, verb := range []string{"cancel", "retry"} {
		wantRefused(t, env, `task "nosuch" not found in queues`, verb, "nosuch")
	}
	// Nothing above was cancelled or queued by a run's name.
	if ts, err := q.Task(ctx, other.ID); err != nil || ts.State != "pending" {
		t.Errorf("segment of run elsewhere after 'sched cancel elsewhere': %+v, %v; want it left queued", ts, err)
	}
	if ts, err := q.Task(ctx, seg); err != nil || ts.State != "archived" {
		t.Errorf("segment of run pilot after 'sched retry pilot': %+v, %v; want it left archived", ts, err)
	}
}

// A run that trains is told to be stopped by its segment's id, and that it
// resumes from the checkpoint of its stop step; a done run has nothing to
// retry and says how it trains further.
func TestARunNamedForATaskSaysWhatItsSegmentDoes(t *testing.T) {
	task := scheduler.TaskStatus{ID: "train:segment:abc", Kind: scheduler.KindTrainSegment, Queue: "gpu", State: "active"}
	training := runView{RunState: scheduler.RunState{Run: "pilot", Step: 12, Total: 100, Checkpoint: -1}, HasState: true, Task: &task}
	training.classify()
	if got, want := runInstead(training, "cancel"), `"pilot" is a run, not a task id: its segment train:segment:abc is training: 'sched cancel train:segment:abc' stops it (it resumes from its last checkpoint with 'sched enqueue train pilot')`; got != want {
		t.Errorf("cancel of a training run:\n%s\nwant\n%s", got, want)
	}
	if got, want := runInstead(training, "retry"), "its segment train:segment:abc is training already: nothing to retry ('sched status train:segment:abc' follows it)"; !strings.HasSuffix(got, want) {
		t.Errorf("retry of a training run: %q; want it to end %q", got, want)
	}
	last := scheduler.TaskStatus{ID: "train:segment:def", Kind: scheduler.KindTrainSegment, Queue: "gpu", State: "completed"}
	done := runView{RunState: scheduler.RunState{Run: "pilot", Step: 100, Total: 100, Checkpoint: 100, Done: true}, HasState: true, Task: &last}
	done.classify()
	if got, want := runInstead(done, "retry"), `"pilot" is a run, not a task id: nothing of it to retry (it is done at step 100 of 100; a longer run is 'sched enqueue train pilot' after its total is raised)`; got != want {
		t.Errorf("retry of a done run:\n%s\nwant\n%s", got, want)
	}
}

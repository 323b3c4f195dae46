package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

// waitState waits for task id to reach state (asynq moves it).
func waitState(t *testing.T, c *Client, id string, state asynq.TaskState) *asynq.TaskInfo {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ti, err := c.Find(context.Background(), id)
		if err == nil && ti.State == state {
			return ti
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s did not become %s within a minute: %+v %v", id, state, ti, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Work that failed, was cancelled or finished can always be queued again:
// a worker's enqueue redoes what was archived and leaves what completed; a
// person's (Again) redoes both and starts a waiting retry now; only work
// pending or running is a duplicate. The cancel mark of a cancelled task
// does not follow its id into the new run.
func TestWorkCanAlwaysBeQueuedAgain(t *testing.T) {
	c, opt := newTestClient(t)
	ctx := context.Background()

	// A real asynq server runs the gpu queue; its handler fails for now
	// (a one-hour back-off) or succeeds, as the test says.
	var outcome atomic.Value
	outcome.Store("ok")
	var runs atomic.Int32
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{QueueGPU: 1},
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 20 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		runs.Add(1)
		if outcome.Load() == "later" {
			return errors.New("object storage unreachable")
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()

	a := TrainSegment{Run: "pilot", Tokenizer: "t"}
	info, err := c.Enqueue(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	waitState(t, c, id, asynq.TaskStateCompleted)

	// Completed: a worker's enqueue is a duplicate, a person's runs it again.
	var dup *DuplicateError
	if _, err := c.Enqueue(ctx, a); !errors.As(err, &dup) || dup.State != "completed" {
		t.Fatalf("a worker's enqueue of completed work: %v; want a duplicate (completed)", err)
	}
	outcome.Store("later")
	s, err := c.Again(ctx, a)
	if err != nil || s.Was != "completed" || s.Info == nil || s.Info.ID != id {
		t.Fatalf("Again of completed work: %+v %v; want it queued again under %s", s, err, id)
	}
	// Failing for now: waiting out a one-hour back-off. Again runs it now.
	ti := waitState(t, c, id, asynq.TaskStateRetry)
	if ti.LastErr == "" {
		t.Fatalf("retry task has no last error: %+v", ti)
	}
	outcome.Store("ok")
	before := runs.Load()
	if s, err := c.Again(ctx, a); err != nil || s.Was != "retry" || s.LastErr == "" {
		t.Fatalf("Again of work waiting to retry: %+v %v", s, err)
	}
	waitState(t, c, id, asynq.TaskStateCompleted)
	if runs.Load() != before+1 {
		t.Fatalf("the retry ran %d times after Again; want once", runs.Load()-before)
	}

	// Cancelled while waiting (archived, with a cancel mark as a running
	// task's cancel leaves): a worker's enqueue queues it again, without
	// the mark.
	srv.Stop()
	if s, err := c.Again(ctx, a); err != nil || s.Was != "completed" {
		t.Fatalf("Again: %+v %v", s, err)
	}
	if _, err := c.Again(ctx, a); !errors.As(err, &dup) || dup.State != "pending" {
		t.Fatalf("Again of pending work: %v; want a duplicate (pending)", err)
	}
	if live, err := c.LiveSegment(ctx, "pilot"); err != nil || live == nil || live.ID != id {
		t.Fatalf("LiveSegment(pilot) = %+v, %v; want the pending task %s", live, err, id)
	}
	if live, err := c.LiveSegment(ctx, "long"); err != nil || live != nil {
		t.Fatalf("LiveSegment(long) = %+v, %v; want none", live, err)
	}
	if st, err := c.Cancel(ctx, id); err != nil || st != "withdrawn" {
		t.Fatalf("cancel: %s %v", st, err)
	}
	if err := c.rdb.Set(ctx, cancelKey(id), 1, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enqueue(ctx, a); err != nil {
		t.Fatalf("a worker's enqueue of archived work: %v; want it queued again", err)
	}
	if IsCancelled(ctx, c.rdb, id) {
		t.Error("the cancel mark of the cancelled task applies to the work queued again")
	}
	if live, err := c.LiveSegment(ctx, "pilot"); err != nil || live == nil {
		t.Fatalf("LiveSegment after the re-queue: %+v %v", live, err)
	}

	// Failed for good (archived by the worker): Retry by id runs it again.
	outcome.Store("final")
	srv2 := asynq.NewServer(opt, asynq.Config{Concurrency: 1, Queues: map[string]int{QueueGPU: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 20 * time.Millisecond, IsFailure: func(error) bool { return true }})
	if err := srv2.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		if outcome.Load() == "final" {
			return asynq.SkipRetry
		}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv2.Shutdown()
	waitState(t, c, id, asynq.TaskStateArchived)
	outcome.Store("ok")
	if s, err := c.Retry(ctx, id); err != nil || s.Was != "archived" {
		t.Fatalf("Retry of an archived task: %+v %v", s, err)
	}
	waitState(t, c, id, asynq.TaskStateCompleted)
	if _, err := c.Retry(ctx, "train:segment:0000"); err == nil {
		t.Error("Retry of an unknown id succeeded")
	}
}

// Live work is what will still happen: queued, running, scheduled or
// waiting to retry, and not what was archived or completed.
func TestLiveWorkIsFoundByWhatItMakes(t *testing.T) {
	c, _ := newTestClient(t)
	ctx := context.Background()
	if ti, err := c.LiveTokenizer(ctx, "mix"); err != nil || ti != nil {
		t.Fatalf("LiveTokenizer on an empty Redis: %+v %v", ti, err)
	}
	if n, err := c.LiveIngest(ctx, "code"); err != nil || n != 0 {
		t.Fatalf("LiveIngest on an empty Redis: %d %v", n, err)
	}
	sample, err := c.Enqueue(ctx, TokenizerSample{Name: "mix", Dataset: "a"})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.Enqueue(ctx, IngestPlan{Dataset: "d", Store: "code"})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []Args{IngestShard{Dataset: "d", Path: "a", Store: "code"}, IngestAppend{Store: "code", ShardID: "x"},
		IngestShard{Dataset: "e", Path: "b", Store: "prose"}, TokenizerTrain{Name: "other"}} {
		if _, err := c.Enqueue(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if ti, err := c.LiveTokenizer(ctx, "mix"); err != nil || ti == nil || ti.ID != sample.ID {
		t.Errorf("LiveTokenizer(mix) = %+v %v; want the sampling task", ti, err)
	}
	if ti, err := c.LiveTokenizer(ctx, "other"); err != nil || ti == nil || ti.Type != KindTokenizerTrain {
		t.Errorf("LiveTokenizer(other) = %+v %v; want the training task", ti, err)
	}
	if n, err := c.LiveIngest(ctx, "code"); err != nil || n != 3 {
		t.Errorf("LiveIngest(code) = %d %v; want its plan, shard and append", n, err)
	}
	if _, err := c.Cancel(ctx, plan.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, sample.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := c.LiveIngest(ctx, "code"); err != nil || n != 2 {
		t.Errorf("LiveIngest(code) after cancelling the plan = %d %v; want 2", n, err)
	}
	if ti, err := c.LiveTokenizer(ctx, "mix"); err != nil || ti != nil {
		t.Errorf("LiveTokenizer(mix) after its cancel = %+v %v; want none", ti, err)
	}
}

package scheduler

import (
	"context"
	"testing"
	"time"
)

// A segment cancelled as it waited, with a report of its wait, is queued
// again under the same id (the same work): by `sched enqueue train` over
// its archived record, or after that record was dropped (a done run whose
// refused extension is dropped, then queued again). Neither its cancel
// mark nor its last report is the new task's: the mark left behind made a
// worker archive the new task for a cancel nobody typed, and the report
// had status read it waiting for what the old one waited for.
func TestATaskQueuedAgainUnderItsIDIsNew(t *testing.T) {
	c, _ := newTestClient(t)
	ctx := context.Background()
	seg := TrainSegment{Run: "r", FromStep: 20, TotalSteps: 40}
	cancelWaiting := func() string {
		t.Helper()
		info, err := c.Enqueue(ctx, seg)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteProgress(ctx, c.Redis(), Progress{TaskID: info.ID, Kind: KindTrainSegment, State: "waiting", Message: "waiting for the worker's entry"}, time.Hour); err != nil {
			t.Fatal(err)
		}
		if s, err := c.Cancel(ctx, info.ID); err != nil || s != "withdrawn" {
			t.Fatalf("cancel %s: %s, %v", info.ID, s, err)
		}
		return info.ID
	}
	isNew := func(how, id string) {
		t.Helper()
		ts, err := c.Task(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if ts.State != "pending" || ts.Cancelled || ts.HasProgress || IsCancelled(ctx, c.Redis(), id) {
			t.Errorf("%s: %s, cancelled %v (mark %v), report %v %+v; want it pending, with no cancel and no report", how, ts.State, ts.Cancelled, IsCancelled(ctx, c.Redis(), id), ts.HasProgress, ts.Progress)
		}
	}

	id := cancelWaiting()
	s, err := c.Again(ctx, seg)
	if err != nil || s.Info.ID != id || !s.Cancelled {
		t.Fatalf("queued again over its archived record: %+v, %v; want %s, said to have been cancelled", s, err, id)
	}
	isNew("queued again over its archived record", id)
	if err := c.insp.DeleteTask(s.Info.Queue, id); err != nil {
		t.Fatal(err)
	}

	id = cancelWaiting()
	dropped, err := c.DropArchivedSegmentsFrom(ctx, "r", 20)
	if err != nil || len(dropped) != 1 || dropped[0] != id {
		t.Fatalf("dropped %v, %v; want [%s]", dropped, err, id)
	}
	if _, err := c.Again(ctx, seg); err != nil {
		t.Fatal(err)
	}
	isNew("queued again after its record was dropped", id)
}

package scheduler

import (
	"context"
	"testing"
)

// A segment of a run leaves it to a live segment of the same run queued
// to resume from a later step, or from the same step with a lower id:
// of any two, exactly one trains. Other runs' segments, and the segment
// itself, supersede nothing.
func TestSupersedingSegment(t *testing.T) {
	c, _ := newTestClient(t)
	ctx := context.Background()
	enqueue := func(a TrainSegment) string {
		t.Helper()
		ti, err := c.Enqueue(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return ti.ID
	}
	early := enqueue(TrainSegment{Run: "pilot", Tokenizer: "a", FromStep: 100})
	other := enqueue(TrainSegment{Run: "long", Tokenizer: "a", FromStep: 900})
	sup := func(id string, from int64) string {
		t.Helper()
		ti, err := c.SupersedingSegment(ctx, "pilot", id, from)
		if err != nil {
			t.Fatal(err)
		}
		if ti == nil {
			return ""
		}
		return ti.ID
	}
	if got := sup(early, 100); got != "" {
		t.Errorf("the run's only segment is superseded by %s", got)
	}
	later := enqueue(TrainSegment{Run: "pilot", Tokenizer: "a", FromStep: 200})
	if got := sup(early, 100); got != later {
		t.Errorf("the segment from step 100 is superseded by %q; want the one from step 200, %s", got, later)
	}
	if got := sup(later, 200); got != "" {
		t.Errorf("the segment from step 200 is superseded by %s; want none (run long's %s is another run's)", got, other)
	}
	twin := enqueue(TrainSegment{Run: "pilot", Tokenizer: "b", FromStep: 200})
	low, high := min(later, twin), max(later, twin)
	if got := sup(high, 200); got != low {
		t.Errorf("of two segments from step 200, %s is superseded by %q; want %s, of the lower id", high, got, low)
	}
	if got := sup(low, 200); got != "" {
		t.Errorf("of two segments from step 200, %s (the lower id) is superseded by %s", low, got)
	}
}

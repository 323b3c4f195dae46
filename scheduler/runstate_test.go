package scheduler

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestRunStateLine(t *testing.T) {
	if got := parseRunState("x", map[string]string{"step": "10", "total": "100", "loss": "3.5", "tok_per_s": "1000", "eta_s": "7200"}).String(); got != "x: step 10/100, loss 3.5000, 1000 tok/s, ETA 2h0m0s, no checkpoint yet" {
		t.Errorf("status line %q", got)
	}
	// The rate of several GPUs says how many; that of one says nothing.
	for gpus, want := range map[string]string{"2": "x: step 10/100, 2000 tok/s on 2 GPUs, ETA", "1": "x: step 10/100, 2000 tok/s, ETA"} {
		if got := parseRunState("x", map[string]string{"step": "10", "total": "100", "tok_per_s": "2000", "gpus": gpus, "eta_s": "60"}).String(); !strings.HasPrefix(got, want) {
			t.Errorf("gpus %s: status line %q, want it to begin %q", gpus, got, want)
		}
	}
}

// A run's newest segment is the live one, whatever step a finished one
// started from: enqueued again after a stop, a run may start from an
// earlier step than its cancelled segment records.
func TestRunTasksPrefersTheLiveSegment(t *testing.T) {
	seg := func(id string, from int64, state string, finished time.Time) TaskStatus {
		b, err := Encode(TrainSegment{Run: "r", FromStep: from})
		if err != nil {
			t.Fatal(err)
		}
		return TaskStatus{ID: id, Kind: KindTrainSegment, State: state, Payload: b, Finished: finished}
	}
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name  string
		tasks []TaskStatus
		want  string
	}{
		{"live over a later finished step", []TaskStatus{seg("cancelled", 400, "archived", t0), seg("live", 0, "pending", time.Time{})}, "live"},
		{"the later step among finished", []TaskStatus{seg("a", 100, "completed", t0.Add(time.Hour)), seg("b", 200, "archived", t0)}, "b"},
		{"the later finish at one step", []TaskStatus{seg("old", 100, "archived", t0), seg("new", 100, "completed", t0.Add(time.Minute))}, "new"},
	} {
		for _, order := range [][]TaskStatus{c.tasks, {c.tasks[1], c.tasks[0]}} {
			got := (&Snapshot{Tasks: order}).RunTasks()["r"].Task.ID
			if got != c.want {
				t.Errorf("%s: RunTasks chose %s, want %s", c.name, got, c.want)
			}
		}
	}
}

// A reason in a one-line listing carries no terminal escapes and not
// asynq's marker of a final error.
func TestOneLineIsPlainText(t *testing.T) {
	got := OneLine("\x1b[31mERROR\x1b[0m cancelled by sched cancel: context canceled (skip retry for the task)\nsecond line", 200)
	if want := "ERROR cancelled by sched cancel: context canceled"; got != want {
		t.Errorf("OneLine = %q, want %q", got, want)
	}
	if got := OneLine(asynq.ErrLeaseExpired.Error(), 200); !strings.Contains(got, "worker stopped answering") {
		t.Errorf("asynq's lease expiry reads %q", got)
	}
}

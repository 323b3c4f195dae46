package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// A cause that fails every file of an ingest fails thousands of tasks in
// an hour; status lists the newest few and says how many more there are,
// so that the rest of the report is not buried under them.
func TestStatusListsTheNewestFailuresAndCountsTheRest(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.Local)
	fails := func(n int) []scheduler.TaskStatus {
		var out []scheduler.TaskStatus
		for i := range n { // newest first, as Snapshot.Failures gives them
			out = append(out, scheduler.TaskStatus{ID: fmt.Sprintf("task-%d", i), Kind: scheduler.KindIngestShard, State: "archived",
				LastFailed: at.Add(-time.Duration(i) * time.Second), LastErr: "dataset is gated"})
		}
		return out
	}
	for _, c := range []struct {
		n    int
		more string
	}{
		{0, ""},
		{failuresShown, ""},
		{failuresShown + 1, "and 1 more in the last hour: 'sched runs --limit N' lists the N tasks that ended last\n"},
		{2500, "and 2490 more in the last hour: 'sched runs --limit N' lists the N tasks that ended last\n"},
	} {
		var out bytes.Buffer
		printFailures(&out, fails(c.n))
		lines := strings.SplitAfter(strings.TrimPrefix(out.String(), "\nFAILURES in the last hour\n"), "\n")
		shown := min(c.n, failuresShown)
		if c.n == 0 {
			if out.String() != "\nFAILURES in the last hour\nnone\n" {
				t.Fatalf("no failures: %q", out.String())
			}
			continue
		}
		for i := range shown {
			if !strings.Contains(lines[i], fmt.Sprintf("  task-%d  ", i)) {
				t.Fatalf("%d failures: line %d is %q, want task-%d, newest first", c.n, i, lines[i], i)
			}
		}
		if rest := strings.Join(lines[shown:], ""); rest != c.more {
			t.Fatalf("%d failures: after the %d shown %q, want %q", c.n, shown, rest, c.more)
		}
	}
}

// A task that waits to retry is counted alike under FAILURES and in
// sched runs: the same attempt of the same number, where FAILURES once
// counted asynq's retries ("retry 2 of 8") and runs the attempts
// ("attempt 2 of 9").
func TestAFailureAndItsRunCountTheSameAttempt(t *testing.T) {
	next := time.Date(2026, 12, 1, 12, 5, 0, 0, time.Local)
	task := scheduler.TaskStatus{ID: "task-1", Kind: scheduler.KindIngestShard, State: "retry", Retried: 2, MaxRetry: 8,
		LastFailed: next.Add(-time.Minute), NextRun: next, LastErr: "connection reset"}
	const want = "failed (attempt 2 of 9), retries at 12:05:00"
	if line := failureLine(task); !strings.Contains(line, want) {
		t.Fatalf("FAILURES: %q, want it to say %q", line, want)
	}
	if line := outcomeLine(task); !strings.Contains(line, want) {
		t.Fatalf("sched runs: %q, want it to say %q", line, want)
	}
}

package main

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kiln-lm/kiln/scheduler"
)

// A FAILURES line cuts a long error, and kiln's errors end with what to
// do: the line keeps that last clause after the cut, where it cut it off
// at 200 characters ("...its object tokens/bigstore2/shards/336344730cf2b383-sha2…").
// Where the last clause is too long to keep, the line says where the
// error is read whole, and `sched status <task-id>` does print it whole.
func TestAFailureLineKeepsItsRemedy(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.Local)
	const remedy = "enqueue the ingest again ('sched enqueue ingest'), which makes it again"
	damaged := `ingest:append: append shard "local/sha256-2d22c0ffee2d22c0ffee2d22c0ffee2d22c0ffee2d22c0ffee2d22c0ffee2d22" to token store bigstore2: ` +
		"its object tokens/bigstore2/shards/336344730cf2b383-sha256-2d22c0ffee2d22c0ffee2d22c0ffee2d22c0ffee2d22c0ffee2d22c0ffee2d22.tok " +
		"read 3 times, hashed each time to sha256 9fa5d00d9fa5d00d, not the d99e0bad d99e0bad it was made with; " + remedy + " (skip retry for the task)"
	task := scheduler.TaskStatus{ID: "ingest:append:7cc5e84ab6041d44a6f9", Kind: scheduler.KindIngestAppend, State: "archived", LastFailed: at, LastErr: damaged}

	line := failureLine(task)
	why := line[strings.Index(line, "failed for good (archived): ")+len("failed for good (archived): "):]
	if !strings.HasPrefix(why, `ingest:append: append shard "local/sha256-2d22`) || !strings.HasSuffix(why, "…; "+remedy) {
		t.Errorf("FAILURES line %q; want the error's start, cut, then its remedy %q", line, remedy)
	}
	if n := utf8.RuneCountInString(why); n > listErrRunes {
		t.Errorf("FAILURES line %q: its error is %d runes, want at most %d", line, n, listErrRunes)
	}

	// A last clause that would take most of the line: the line points to
	// the one command that prints the error whole.
	task.LastErr = "read shard: " + strings.Repeat("x", 300) + "; " + strings.Repeat("do this and that ", 10)
	line = failureLine(task)
	if want := "… ('sched status " + task.ID + "' says it whole)"; !strings.HasSuffix(line, want) {
		t.Errorf("FAILURES line %q; want it to end %q", line, want)
	}
	// sched status <task-id> prints its task's line with the error whole.
	task.LastErr = damaged
	whole := strings.TrimSuffix(damaged, " (skip retry for the task)")
	if one := taskLine(task, nil, at, false, taskErrRunes); !strings.HasSuffix(one, "last error: "+whole) {
		t.Errorf("sched status %s: %q; want the whole error %q", task.ID, one, whole)
	}
	// A short error is said as it is.
	task.LastErr = "dataset is gated; accept its terms"
	if line := failureLine(task); !strings.HasSuffix(line, ": dataset is gated; accept its terms") {
		t.Errorf("FAILURES line %q; want the short error whole", line)
	}
}

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/worker"
)

// A poison task's FAILURES line keeps what to do, `sched retry <id>`,
// when last words too long for the line are cut, and closes the
// parenthesis of those words.
func TestAPoisonTasksFailureLineKeepsTheRetry(t *testing.T) {
	const id = "train:segment:1fcba4492c380bb9669e"
	last := "exit status 1: ERROR\tcheckpoint upload failed\t{\"error\": \"s3 put " + strings.Repeat("x", 300) + "\"}"
	ts := scheduler.TaskStatus{ID: id, Kind: "train:segment", State: "archived", LastFailed: time.Now(),
		LastErr: (&worker.PoisonError{ID: id, Last: last}).Error()}
	line := failureLine(ts)
	const remedy = "; fix the cause, then `sched retry " + id + "`, which starts the count again"
	if !strings.Contains(line, "poison task: the worker died twice running it (last: exit status 1") || !strings.HasSuffix(line, "…)"+remedy) {
		t.Errorf("FAILURES line %q; want the poison task's cut failure, then %q", line, remedy)
	}
}

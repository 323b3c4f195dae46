package main

import (
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// A segment archived once its 9 attempts failed says, in every view, what
// resumes its run once the cause is mended ('sched enqueue train <run>',
// docs/operations.md "Resuming"), as a cancelled run's line does; and the
// run's line keeps the cause's own remedy, which this error gives after
// ": ", where it was cut mid-word ("free space on that disk, or lo…").
func TestASegmentArchivedWithItsRetriesSpentSaysWhatResumesIt(t *testing.T) {
	const remedy = "free space on that disk, or lower min_free_disk in a runs file"
	cause := "train:segment: run hb: local disk below min_free_disk: /data/runs/hb has 39.9 GiB free, below min_free_disk 40.0 TiB: " + remedy
	payload, err := scheduler.Encode(scheduler.TrainSegment{Run: "hb", Tokenizer: "go-4096", FromStep: 400, TotalSteps: 1000})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 7, 16, 0, 0, 0, time.Local)
	task := scheduler.TaskStatus{ID: "train:segment:9c1e0d2a4b6f8e0c1a3b", Kind: scheduler.KindTrainSegment, Queue: "gpu", State: "archived",
		Retried: 8, MaxRetry: 8, LastErr: cause + " (skip retry for the task)", LastFailed: now, Payload: payload}
	const resumes = "; once that is mended, 'sched enqueue train hb' resumes the run from its last checkpoint"

	v := runView{RunState: scheduler.RunState{Run: "hb", Step: 400, Total: 1000, Checkpoint: 400}, HasState: true, Task: &task}
	v.classify()
	if line := v.line(now); !strings.Contains(line, "  train:segment: run hb: local disk below min_free_disk") ||
		!strings.HasSuffix(line, "…: "+remedy+"; once that is mended, 'sched enqueue train hb' resumes it from its last checkpoint") {
		t.Errorf("the run's line %q; want the cause cut, its remedy %q whole, then what resumes the run", line, remedy)
	}
	if line := failureLine(task); !strings.HasSuffix(line, "failed for good (archived): "+cause+resumes) {
		t.Errorf("FAILURES line %q; want the cause, then what resumes the run", line)
	}
	if line := outcomeLine(task); !strings.Contains(line, "failed for good after 9 attempts: "+cause+resumes+"  ") {
		t.Errorf("sched runs line %q; want the cause, then what resumes the run", line)
	}
	if line := taskLine(task, nil, now, false, taskErrRunes); !strings.HasSuffix(line, "last error: "+cause+resumes) {
		t.Errorf("sched status %s: %q; want the cause, then what resumes the run", task.ID, line)
	}
	// Any other kind runs again by its id.
	other := task
	other.ID, other.Kind, other.Queue, other.Retried, other.MaxRetry = "ingest:append:77aa", scheduler.KindIngestAppend, "append", 10, 10
	if line := failureLine(other); !strings.HasSuffix(line, "; once that is mended, 'sched retry ingest:append:77aa' runs it again") {
		t.Errorf("FAILURES line %q; want what runs it again", line)
	}
	// A failure archived at once, which no retry mends, says what to do
	// in its own words; a run not begun is started, not resumed.
	task.Retried = 0
	if line := failureLine(task); strings.Contains(line, "once that is mended") {
		t.Errorf("FAILURES line of a task archived at its first attempt: %q; want its error alone", line)
	}
	task.Retried = 8
	fresh := runView{RunState: scheduler.RunState{Run: "hb", Step: 0, Total: 1000, Checkpoint: -1}, HasState: true, Task: &task}
	fresh.classify()
	if !strings.HasSuffix(fresh.Detail, "; once that is mended, 'sched enqueue train hb' starts it") {
		t.Errorf("the line of a run with no checkpoint: %q; want it told what starts it", fresh.Detail)
	}
}

// A message too long for its line keeps its last clause, what to do,
// where it follows a ": " (and no "; "), as after a "; "; a clause inside
// parentheses, another error's words, is not taken for the message's own.
func TestKeepRemedyAfterAColon(t *testing.T) {
	const id = "train:segment:abc"
	for _, c := range []struct {
		msg  string
		n    int
		want string
	}{
		{"a b c d e f g h i j k l m n o p: do this", 30, "a b c d e f g h i j …: do this"},
		{"wait for x (file y: line 3: bad; line 4: worse): mend it, and it goes on", 50, "wait for x (file y: line…): mend it, and it goes on"},
		{"a: b c d e f g h i j k l m n o p q r s t; do this (or: that)", 40, "a: b c d e f g h i …; do this (or: that)"},
	} {
		if got := keepRemedy(c.msg, c.n, id); got != c.want {
			t.Errorf("keepRemedy(%q, %d):\n%q\nwant\n%q", c.msg, c.n, got, c.want)
		}
	}
}

// A run waiting for a runs file that does not read keeps, on its line,
// the file's error and what to do, cut in the middle: a long path put what
// to do past the line's 240 runes.
func TestAWaitingRunsLineKeepsWhatToDo(t *testing.T) {
	now := time.Date(2026, 12, 7, 16, 0, 0, 0, time.Local)
	const todo = "mend it on the worker, and the run goes on from step 600 once it reads"
	msg := "waiting for this worker's KILN_RUNS to read (runs file /srv/kiln/" + strings.Repeat("configuration/", 8) + "runs.yaml: run dt3: " +
		`line 122: mapping key "min_free_disk" already defined at line 117): ` + todo
	task := scheduler.TaskStatus{ID: "train:segment:1", Kind: scheduler.KindTrainSegment, Queue: "gpu", State: "retry", LastErr: msg,
		NextRun: now.Add(30 * time.Second), HasProgress: true, Progress: scheduler.Progress{State: "waiting", Message: msg, Updated: now}}
	v := runView{RunState: scheduler.RunState{Run: "dt3", Step: 600, Total: 3000, Checkpoint: 600}, HasState: true, Task: &task}
	v.classify()
	if !strings.HasPrefix(v.Detail, "waiting for this worker's KILN_RUNS to read (runs file /srv/kiln/") || !strings.Contains(v.Detail, "…): "+todo+" (as of its last try") {
		t.Errorf("the waiting run's line says %q; want the wait's start, cut, then %q", v.Detail, todo)
	}
	if line := outcomeLine(task); !strings.Contains(line, "…): "+todo+"; looks again at ") {
		t.Errorf("sched runs says %q; want the wait's start, cut, then %q", line, todo)
	}
}

package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/internal/testsvc"
	"github.com/kiln-lm/kiln/scheduler"
)

// An ingest whose plan `sched cancel` stopped says so on its INGEST line,
// with the command that queues it again, where it read "files 0/0 done"
// (before the cancel it read "its plan failed" of a plan that failed). A
// plan cancelled after its files were ingested does not read "done": files
// it had not listed yet are in no task.
func TestStatusOfAnIngestWhosePlanWasCancelled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := dataDirWithTokenizer(t, dir, "tk")
	src := sourceDir(t, dir, twoFiles)
	r := testsvc.StartRedis(t)
	env := []string{"KILN_REDIS_URL=" + r.URL(0), "KILN_DATA_DIR=" + data, "KILN_LOCAL_ROOTS=" + src}
	dataset := "local:" + filepath.Join(src, "*")

	// No worker: the plan waits, and is cancelled before it queues a file.
	out, errOut, code := sched(t, env, "enqueue", "ingest", dataset, "--store", "code", "--tokenizer", "tk")
	plan := regexp.MustCompile(`ingest:plan:[0-9a-f]+`).FindString(out)
	if code != 0 || plan == "" {
		t.Fatalf("enqueue ingest: exit %d %q %q", code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "cancel", plan); code != 0 {
		t.Fatalf("cancel %s: exit %d %q %q", plan, code, out, errOut)
	}
	out, errOut, code = sched(t, env, "status")
	want := "code (" + dataset + ")  its plan " + plan + " was cancelled by sched cancel before it queued a file: 'sched retry " + plan + "' queues it again"
	if line := lineOf(out, "code ("); code != 0 || line != want {
		t.Fatalf("status after the plan's cancel: exit %d %q\nINGEST line %q\nwant       %q", code, errOut, line, want)
	}

	// Queued again as it says, it ingests both files.
	if out, errOut, code := sched(t, env, "retry", plan); code != 0 {
		t.Fatalf("retry %s: exit %d %q %q", plan, code, out, errOut)
	}
	w := startWorker(t, env, "--queues", "ingest=1,append=1")
	waitOutput(t, env, regexp.MustCompile(`(?m)^code \(.*\)  files 2/2 done  .*  done$`), time.Minute, "status")
	if err := w.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(); err != nil {
		t.Fatalf("worker on SIGTERM: %v", err)
	}
	// Its plan queued again with no worker, then cancelled: the files
	// ingested stay done, and the line says the plan was cancelled.
	if out, errOut, code := sched(t, env, "retry", plan); code != 0 {
		t.Fatalf("retry %s after the ingest: exit %d %q %q", plan, code, out, errOut)
	}
	if out, errOut, code := sched(t, env, "cancel", plan); code != 0 {
		t.Fatalf("cancel %s after the ingest: exit %d %q %q", plan, code, out, errOut)
	}
	out, errOut, code = sched(t, env, "status")
	line := lineOf(out, "code (")
	cancelled := "  its plan " + plan + " was cancelled by sched cancel, so any files it had not queued yet are not ingested: 'sched retry " + plan + "' queues those the store lacks, none twice"
	if code != 0 || !strings.HasPrefix(line, "code ("+dataset+")  files 2/2 done  ") || !strings.HasSuffix(line, cancelled) || strings.Contains(line, "  done  ") {
		t.Fatalf("status after a cancel of the plan of an ingest done: exit %d %q\nINGEST line %q\nwant files 2/2, not done, ending %q", code, errOut, line, cancelled)
	}
}

// The store's latest plan is the one its line speaks of: a cancel after an
// older plan of the same store failed reads cancelled, and a plan that
// completed after one cancelled reads done.
func TestDatasetLineSaysTheLatestPlansCancel(t *testing.T) {
	at := time.Date(2026, 12, 8, 10, 0, 0, 0, time.UTC)
	plan := func(id, state string, cancelled bool, maxTokens int64, end time.Time) scheduler.TaskStatus {
		a := scheduler.IngestPlan{Dataset: "org/code", Store: "code", Tokenizer: "tk"}
		a.Limits.MaxTokens = maxTokens
		payload, err := scheduler.Encode(a)
		if err != nil {
			t.Fatal(err)
		}
		return scheduler.TaskStatus{ID: id, Kind: scheduler.KindIngestPlan, Queue: "ingest", State: state, Cancelled: cancelled, Finished: end, Payload: payload}
	}
	// Of another store named after its dataset: not this store's.
	other, err := scheduler.Encode(scheduler.IngestPlan{Dataset: "org/prose", Tokenizer: "tk"})
	if err != nil {
		t.Fatal(err)
	}
	prose := scheduler.TaskStatus{ID: "ingest:plan:prose", Kind: scheduler.KindIngestPlan, Queue: "ingest", State: "archived", Cancelled: true, Finished: at.Add(time.Hour), Payload: other}
	for _, c := range []struct {
		name  string
		tasks []scheduler.TaskStatus
		want  string
	}{
		{"a cancel after a failure", []scheduler.TaskStatus{plan("ingest:plan:old", "archived", false, 0, at), plan("ingest:plan:new", "archived", true, 1000, at.Add(time.Minute)), prose},
			"code (org/code)  its plan ingest:plan:new was cancelled by sched cancel before it queued a file: 'sched retry ingest:plan:new' queues it again"},
		{"a failure after a cancel", []scheduler.TaskStatus{plan("ingest:plan:old", "archived", true, 0, at), plan("ingest:plan:new", "archived", false, 1000, at.Add(time.Minute)), prose},
			"code (org/code)  its plan ingest:plan:new failed before it queued a file ('sched status ingest:plan:new' says why): 'sched retry ingest:plan:new' queues it again"},
		{"a plan done after a cancel", []scheduler.TaskStatus{plan("ingest:plan:old", "archived", true, 0, at), plan("ingest:plan:new", "completed", false, 1000, at.Add(time.Minute)), prose},
			"code (org/code)  nothing to ingest: the store holds every file its latest plan listed"},
	} {
		snap := &scheduler.Snapshot{At: at.Add(2 * time.Hour), Tasks: c.tasks}
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

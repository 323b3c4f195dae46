package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// A training segment queued while its store is being ingested waits for
// it, and status says what it waits for, neither as an error on its line
// nor among the failures; once the ingest is gone and the segment trains,
// its line shows no "last error": the wait was none.
func TestStatusActiveSegmentShowsNoPastWait(t *testing.T) {
	t.Parallel()
	env, _, q := trainingSetupStore(t, "code")
	ctx := context.Background()
	// An ingest of the run's store, queued where no worker serves the
	// ingest queue: it stays live until it is cancelled.
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "a.jsonl"), []byte(`{"text":"package main"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env = append(env, "KILN_LOCAL_ROOTS="+src)
	out, errOut, code := sched(t, env, "ingest", "local:"+filepath.Join(src, "*.jsonl"), "--store", "code", "--tokenizer", "tk")
	m := regexp.MustCompile(`queued (ingest:plan:\S+)`).FindStringSubmatch(out)
	if code != 0 || m == nil {
		t.Fatalf("ingest: exit %d\n%s%s", code, out, errOut)
	}
	plan := m[1]
	startWorker(t, env, "--queues", "gpu=1")
	info, err := q.Enqueue(ctx, scheduler.TrainSegment{Run: "eta", Tokenizer: "tk", Engine: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	id := info.ID
	waiting := waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  retry  .*"waiting for the ingest of token store code`), time.Minute)
	if strings.Contains(waiting, "last error") {
		t.Errorf("a waiting segment's line calls its wait an error: %q", waiting)
	}
	if out, _, _ := sched(t, env, "status"); !strings.Contains(out, "FAILURES in the last hour\nnone\n") {
		t.Errorf("status lists a wait among the failures:\n%s", out)
	}

	if out, errOut, code := sched(t, env, "cancel", plan); code != 0 {
		t.Fatalf("cancel %s: exit %d\n%s%s", plan, code, out, errOut)
	}
	// Now, not at the wait's next look.
	if out, errOut, code := sched(t, env, "retry", id); code != 0 {
		t.Fatalf("retry %s: exit %d\n%s%s", id, code, out, errOut)
	}
	line := waitStatus(t, env, id, regexp.MustCompile(`^`+id+`  active  .*"run eta step \d+`), time.Minute)
	if strings.Contains(line, "last error") || strings.Contains(line, "waiting for") {
		t.Fatalf("the training segment's line shows its past wait: %q", line)
	}
}

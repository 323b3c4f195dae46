package worker

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
	"github.com/kiln-lm/kiln/store"
)

// A run under way whose runs file has a key written twice (any mistake
// yaml reports on lines of their own below "yaml: unmarshal errors:")
// waits, saying on one line the line at fault and what to do: every view
// of one line kept its first line, "yaml: unmarshal errors:", alone, and
// `sched status <task-id>` printed a "\n".
func TestAWaitForTheRunsFileSaysItsMistakeOnOneLine(t *testing.T) {
	runsFile := filepath.Join(t.TempDir(), "runs.yaml")
	if err := os.WriteFile(runsFile, []byte("pilot:\n  min_free_disk: 1GiB\n  min_free_disk: 2GiB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KILN_RUNS", runsFile)
	objects, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	e.handlers.Training = &Training{Redis: e.rdb, Objects: objects, Dir: t.TempDir(), WaitEvery: time.Hour,
		Enqueue: func(ctx context.Context, a scheduler.Args) error { _, err := e.c.Enqueue(ctx, a); return err }}
	e.serve(map[string]int{scheduler.QueueGPU: 1})

	id := e.enqueue(scheduler.TrainSegment{Run: "pilot", FromStep: 100})
	ts := e.waitFor(id, 30*time.Second, "waiting on the runs file", func(ts scheduler.TaskStatus) bool {
		return ts.HasProgress && ts.Progress.State == "waiting" || ts.State == "archived"
	})
	msg := ts.Progress.Message
	if ts.State == "archived" || strings.Contains(msg, "\n") || strings.Contains(msg, "yaml: unmarshal errors") ||
		!strings.Contains(msg, "run pilot: line 3: mapping key \"min_free_disk\" already defined at line 2") ||
		!strings.HasSuffix(msg, "): mend it on the worker, and the run goes on from step 100 once it reads") {
		t.Fatalf("a run under way with a key written twice in its runs file: %s, %q; want it waiting, saying on one line the line at fault and what to do", ts.State, msg)
	}
}

package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kiln-lm/kiln/scheduler"
)

// `sched runs` lists the newest tasks up to --limit and says how many
// earlier ones it left out and the --limit that lists them all, so that a
// user reading a month's tasks does not take the newest 50 for all of them.
func TestRunsSaysHowManyTasksItLeftOut(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	snap := &scheduler.Snapshot{At: at}
	for i := range 4 {
		snap.Tasks = append(snap.Tasks, scheduler.TaskStatus{ID: fmt.Sprintf("task-%d", i), Kind: scheduler.KindIngestShard,
			Queue: "ingest", State: "completed", Finished: at.Add(time.Duration(i) * time.Minute)})
	}
	for _, c := range []struct {
		limit int
		shown []string
		more  string
	}{
		{4, []string{"task-3", "task-2", "task-1", "task-0"}, ""},
		{3, []string{"task-3", "task-2", "task-1"}, "and 1 earlier task (--limit 4 lists it)\n"},
		{2, []string{"task-3", "task-2"}, "and 2 earlier tasks (--limit 4 lists them)\n"},
	} {
		var out bytes.Buffer
		printRuns(&out, snap, nil, storedRuns{}, c.limit)
		tasks := out.String()[strings.Index(out.String(), "TASKS\n")+len("TASKS\n"):]
		lines := strings.SplitAfter(tasks, "\n")
		for i, id := range c.shown {
			if !strings.Contains(lines[i], "  "+id+"  completed") {
				t.Fatalf("--limit %d: line %d is %q, want %s, newest first:\n%s", c.limit, i, lines[i], id, tasks)
			}
		}
		if rest := strings.Join(lines[len(c.shown):], ""); rest != c.more {
			t.Fatalf("--limit %d: after the tasks %q, want %q", c.limit, rest, c.more)
		}
	}
}

package main

import (
	"strings"
	"testing"
)

// sched runs --presets lists every run that can be enqueued: a --limit
// beside it is refused, as sched status refuses --interval without
// --watch, where it was taken and ignored.
func TestRunsPresetsRefusesLimit(t *testing.T) {
	t.Parallel()
	want := "sched: --limit 3: it limits the tasks 'sched runs' lists; --presets lists every run that can be enqueued: drop --limit, or --presets"
	if out, errOut, code := sched(t, nil, "runs", "--presets", "--limit", "3"); code != exitBadInput || strings.TrimSpace(errOut) != want || out != "" {
		t.Errorf("sched runs --presets --limit 3: exit %d\n%s%s\nwant exit 2 and %q", code, out, errOut, want)
	}
	if out, errOut, code := sched(t, nil, "runs", "--presets"); code != 0 || !strings.Contains(out, "pilot-cpu") {
		t.Errorf("sched runs --presets: exit %d\n%s%s", code, out, errOut)
	}
}

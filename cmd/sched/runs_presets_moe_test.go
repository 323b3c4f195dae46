package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sched runs --presets says which runs are a mixture of experts, with
// their experts and top k: a run differing from another only in its moe:
// read the same.
func TestRunsPresetsShowAMixtureOfExperts(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "runs.yaml")
	body := "moe-a:\n  model: tiny\n  total_steps: 300\n  checkpoint_every: 20\n  mixture: [{store: gosrc}]\n  moe: {experts: 4, d_ff: 64}\n" +
		"moe-b:\n  from: moe-a\n  moe: {top_k: 1}\n" +
		"moe-d:\n  from: moe-a\n  moe: ~\n"
	if err := os.WriteFile(file, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := sched(t, []string{"KILN_RUNS=" + file, "KILN_REDIS_URL=redis://127.0.0.1:1/0"}, "runs", "--presets")
	if code != 0 {
		t.Fatalf("sched runs --presets: exit %d\n%s%s", code, out, errOut)
	}
	for run, model := range map[string]string{"moe-a": "tiny+moe 4x2", "moe-b": "tiny+moe 4x1", "moe-d": "tiny", "pilot": "small"} {
		line := lineWith(out, run+"  ")
		if f := strings.Fields(line); len(f) < 2 || !strings.HasPrefix(strings.Join(f[1:], " "), model+" ") {
			t.Errorf("sched runs --presets lists %s as %q; want its model %q", run, line, model)
		}
	}
}

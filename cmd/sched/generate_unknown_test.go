package main

import (
	"strings"
	"testing"
)

// `sched generate --run` with a name no run has, and no checkpoint of
// that name in object storage, says the name is unknown and which runs
// are, as `sched results` does: it said the run had no checkpoint yet and
// to train it with 'sched enqueue train NAME', which then refused the
// name. A known run without a checkpoint is still told to train.
func TestGenerateOfAnUnknownRunSaysSo(t *testing.T) {
	t.Parallel()
	env := []string{"KILN_DATA_DIR=" + t.TempDir()}
	gen := []string{"generate", "--prompt", "func", "--engine", "cpu", "--run"}

	_, errOut, code := sched(t, env, append(gen, "r9")...)
	want := `no checkpoint in object storage for run "r9": no run of that name is known here (demo, long, pilot, pilot-cpu`
	if code != exitBadInput || !strings.Contains(errOut, want) || strings.Contains(errOut, "enqueue train") || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("generate --run r9: exit %d, %q; want exit 2 and one line with %q, and no 'enqueue train'", code, errOut, want)
	}
	wantRefused(t, env, "unknown run \"r9\"", "enqueue", "train", "r9", "--redis-url", "redis://127.0.0.1:1/0")

	wantRefused(t, env, "run pilot has no complete checkpoint in object storage (checkpoints/pilot/) yet: a run uploads one every checkpoint_every steps of its training ('sched runs' says where it is; 'sched enqueue train pilot' trains it)",
		append(gen, "pilot")...)
}

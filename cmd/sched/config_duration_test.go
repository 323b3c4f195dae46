package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A duration written in a YAML file as a bare number (shutdown_grace: 30
// in the config file, segment.max_duration: 90 in a KILN_RUNS file) is
// refused in one line that names the file, the key and what to write
// instead, where yaml's own "cannot unmarshal !!int `30`" named neither the
// key nor the unit missing; exit 2, as every refusal of bad input. A grace
// of 0 or less is refused as not positive, as one written with a unit is.
func TestDurationWithoutAUnitNamesTheFileAndTheKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := fileIn(t, dir)
	bare := file("bare.yaml", "log_format: json\nshutdown_grace: 30\n")
	quoted := file("quoted.yaml", "shutdown_grace: \"30\"\n")
	fraction := file("fraction.yaml", "shutdown_grace: 1.5\n")
	words := file("words.yaml", "shutdown_grace: 5 minutes\n")
	zero := file("zero.yaml", "shutdown_grace: 0\n")
	negative := file("negative.yaml", "shutdown_grace: -5\n")
	if err := os.MkdirAll(filepath.Join(dir, "xdg", "kiln"), 0o755); err != nil {
		t.Fatal(err)
	}
	xdgFile := file(filepath.Join("xdg", "kiln", "config.yaml"), "shutdown_grace: 45\n")
	runsFile := file("runs.yaml", "mine:\n  from: pilot\n  segment:\n    max_duration: 90\n")
	noRedis := "KILN_REDIS_URL=redis://127.0.0.1:1/0"
	for _, c := range []refusal{
		{nil, []string{"config", "--config", bare}, "config file " + bare + ": line 2: shutdown_grace: 30 has no unit: write 30s (or 5m, 1h)"},
		{[]string{"KILN_CONFIG=" + bare, noRedis}, []string{"worker"}, "config file " + bare + ": line 2: shutdown_grace: 30 has no unit: write 30s (or 5m, 1h)"},
		{[]string{"XDG_CONFIG_HOME=" + filepath.Join(dir, "xdg")}, []string{"config"}, "config file " + xdgFile + ": line 1: shutdown_grace: 45 has no unit: write 45s (or 5m, 1h)"},
		{nil, []string{"config", "--config", quoted}, "config file " + quoted + ": line 1: shutdown_grace: 30 has no unit: write 30s (or 5m, 1h)"},
		{nil, []string{"config", "--config", fraction}, "config file " + fraction + ": line 1: shutdown_grace: 1.5 has no unit: write 1.5s (or 5m, 1h)"},
		{nil, []string{"config", "--config", words}, "config file " + words + `: line 1: shutdown_grace: "5 minutes" is not a duration: write one such as 30s, 5m or 1h30m`},
		{nil, []string{"config", "--config", zero}, "config file " + zero + ": shutdown_grace: 0 " + graceHint},
		{nil, []string{"config", "--config", negative}, "config file " + negative + ": shutdown_grace: -5 " + graceHint},
		{[]string{"KILN_RUNS=" + runsFile}, []string{"config"}, "KILN_RUNS: runs file " + runsFile + ": run mine: line 4: segment.max_duration: 90 has no unit: write 90s (or 5m, 1h)"},
		{[]string{"KILN_RUNS=" + runsFile, noRedis}, []string{"runs", "--presets"}, "runs file " + runsFile + ": run mine: line 4: segment.max_duration: 90 has no unit: write 90s (or 5m, 1h)"},
	} {
		wantRefused(t, c.env, c.want, c.args...)
	}
	// Written with its unit, the same file reads.
	fixed := file("fixed.yaml", "shutdown_grace: 30s\n")
	if out, errOut, code := sched(t, nil, "config", "--config", fixed); code != 0 || !strings.Contains(out, "KILN_SHUTDOWN_GRACE  shutdown-grace   30s\n") {
		t.Errorf("sched config --config %s: exit %d\n%s%s", fixed, code, out, errOut)
	}
}

// A KILN_RUNS file that reads but holds a run that could never train (a
// store named twice in its mixture) is refused by sched config, naming the
// run and what is wrong, as sched enqueue train would refuse it; sched
// runs --presets lists it as invalid.
func TestConfigRefusesARunsFileOfARunThatCannotTrain(t *testing.T) {
	t.Parallel()
	runsFile := fileIn(t, t.TempDir())("runs.yaml", "twice:\n  from: pilot-cpu\n  mixture:\n    - {store: codea, weight: 1}\n    - {store: codea, weight: 2}\n")
	wantRefused(t, []string{"KILN_RUNS=" + runsFile}, `KILN_RUNS `+runsFile+`: run twice: mixture[1]: store "codea" is named twice`, "config")
	// An empty mixture is named as a runs file writes it, not as a flag of
	// another command.
	empty := fileIn(t, t.TempDir())("runs.yaml", "none:\n  from: pilot-cpu\n  mixture: []\n")
	wantRefused(t, []string{"KILN_RUNS=" + empty}, `run none: mixture is empty: name at least one token store (a runs entry's mixture: [{store: NAME, weight: 1}]`, "config")
	// A warmup as long as the run is refused for a new run only: the
	// listing says so, and sched config lets a run under way keep it.
	warm := fileIn(t, t.TempDir())("runs.yaml", "warm:\n  from: pilot-cpu\n  total_steps: 50\n  warmup: 100\n")
	if out, errOut, code := sched(t, []string{"KILN_RUNS=" + warm}, "config"); code != 0 {
		t.Errorf("sched config of a runs file whose run's warmup is its length: exit %d\n%s%s", code, out, errOut)
	}
	if out, errOut, code := sched(t, []string{"KILN_RUNS=" + warm, "KILN_REDIS_URL=redis://127.0.0.1:1/0"}, "runs", "--presets"); code != 0 ||
		!regexp.MustCompile(`(?m)^warm .*a new run of it is refused: warmup 100 is not shorter than the run's 50 steps`).MatchString(out) {
		t.Errorf("sched runs --presets: exit %d\n%s%s\nwant run warm said to be refused as a new run", code, out, errOut)
	}
	out, errOut, code := sched(t, []string{"KILN_RUNS=" + runsFile, "KILN_REDIS_URL=redis://127.0.0.1:1/0"}, "runs", "--presets")
	if code != 0 || !strings.Contains(out, "twice") || !strings.Contains(out, `invalid: run twice: mixture[1]: store "codea" is named twice`) {
		t.Errorf("sched runs --presets: exit %d\n%s%s\nwant the run listed as invalid", code, out, errOut)
	}
}

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A path the command was given is named once in its error, where the
// error of the file's reader, which names it too, came after the
// command's own "verify DIR:"; a checkpoint directory that is not there
// says so, where it said it held no config.json; and a run's directory of
// one checkpoint says "1 checkpoint".
func TestErrorsNameTheirPathOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	missing := filepath.Join(dir, "nonexistent")
	empty := filepath.Join(dir, "empty")
	run := filepath.Join(dir, "run")
	for _, d := range []string{empty, filepath.Join(run, "step-0000003")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("func main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"generate", "--checkpoint", missing, "--prompt", "x"},
			"sched: --checkpoint " + missing + " does not exist: give a checkpoint's directory"},
		{[]string{"generate", "--checkpoint", empty, "--prompt", "x"},
			"sched: load checkpoint " + empty + ": no config.json"},
		{[]string{"generate", "--checkpoint", run, "--prompt", "x"},
			"sched: --checkpoint " + run + " is a run's directory of 1 checkpoint: give the checkpoint, " + filepath.Join(run, "step-0000003") + ", or --run run for"},
		{[]string{"verify", "--golden", empty, "--engine", "cpu"},
			"sched: verify " + empty + ": golden directory has no config.json"},
		{[]string{"tokenize", "--tokenizer-file", missing + ".json", "--in", in, "--out", filepath.Join(dir, "ids.bin")},
			"sched: --tokenizer-file " + missing + ".json: cannot read the tokenizer: no such file or directory"},
	} {
		_, errOut, code := sched(t, nil, c.args...)
		if code != exitBadInput || !strings.HasPrefix(errOut, c.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("sched %v: exit %d, %q; want exit 2 and one line beginning %q", c.args, code, errOut, c.want)
		}
	}
}

package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/trainer/results"
)

// A fresh run shorter than log_every logs no step, yet trains: it reports
// the steps and the checkpoint it made, not that there was nothing to
// train, and says why it wrote no TensorBoard event file.
func TestTrainShorterThanLogEveryReportsItsSteps(t *testing.T) {
	t.Parallel()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	out := filepath.Join(t.TempDir(), "run")
	got, errOut, code := sched(t, nil, "train", "--model", "tiny", "--tokens", store, "--engine", "cpu", "--precision", "fp32",
		"--seq", "32", "--batch", "2", "--steps", "2", "--out", out, "--tokenizer-file", tokJSON)
	if code != 0 {
		t.Fatalf("train --steps 2: exit %d\n%s%s", code, got, errOut)
	}
	if strings.Contains(got, "nothing to train") {
		t.Errorf("a fresh run of 2 steps says it had nothing to train:\n%s", got)
	}
	if !strings.Contains(got, "step 2, ") || !strings.Contains(got, "checkpoint "+filepath.Join(out, "step-0000002")) {
		t.Errorf("a fresh run of 2 steps does not report its step and checkpoint:\n%s", got)
	}
	if !strings.Contains(got, "no TensorBoard event file: none of steps 1 to 2 was logged (log_every 10") ||
		strings.Contains(got, "TensorBoard: tensorboard") {
		t.Errorf("want the missing TensorBoard file explained, and no command to view it:\n%s", got)
	}
	if events, _ := filepath.Glob(filepath.Join(out, results.TensorBoardDir, "*")); len(events) != 0 {
		t.Errorf("event files %v of a run that logged nothing", events)
	}
}

// A run on the CPU engine asked for bf16 (the default) says that it
// trained in fp32, which the CPU engine computes in: the checkpoint's
// run_config records what was asked, and nothing said otherwise.
func TestTrainOnTheCPUSaysItComputedInFP32(t *testing.T) {
	t.Parallel()
	tokJSON, sha := trainTestTokenizer(t, "func main() { return x } the quick brown fox\n")
	store := trainTestStoreBy(t, sha, 4096, 50000)
	for _, c := range []struct{ precision, want string }{
		{"bf16", "trained in fp32, not the bf16 asked: the CPU engine computes in fp32 only"},
		{"fp32", ""},
	} {
		got, errOut, code := sched(t, nil, "train", "--model", "tiny", "--tokens", store, "--engine", "cpu", "--precision", c.precision,
			"--seq", "32", "--batch", "2", "--steps", "2", "--out", filepath.Join(t.TempDir(), "run"), "--tokenizer-file", tokJSON)
		if code != 0 {
			t.Fatalf("train --precision %s: exit %d\n%s%s", c.precision, code, got, errOut)
		}
		if said := strings.Contains(got, "trained in fp32"); said != (c.want != "") || !strings.Contains(got, c.want) {
			t.Errorf("train --engine cpu --precision %s said:\n%s\nwant %q", c.precision, got, c.want)
		}
	}
	// Left at its default, the precision is not said to have been asked.
	got, errOut, code := sched(t, nil, "train", "--model", "tiny", "--tokens", store, "--engine", "cpu",
		"--seq", "32", "--batch", "2", "--steps", "2", "--out", filepath.Join(t.TempDir(), "run"), "--tokenizer-file", tokJSON)
	if code != 0 || !strings.Contains(got, "trained in fp32, not the default bf16: the CPU engine computes in fp32 only") {
		t.Errorf("train --engine cpu, no --precision: exit %d\n%s%s\nwant the default named as such", code, got, errOut)
	}
	// A resume with nothing left to train trained in no precision.
	out := filepath.Join(t.TempDir(), "run")
	args := []string{"train", "--model", "tiny", "--tokens", store, "--engine", "cpu", "--seq", "32", "--batch", "2", "--steps", "2", "--out", out, "--tokenizer-file", tokJSON}
	if got, errOut, code := sched(t, nil, args...); code != 0 {
		t.Fatalf("train: exit %d\n%s%s", code, got, errOut)
	}
	got, errOut, code = sched(t, nil, append(args, "--resume")...)
	if code != 0 || !strings.Contains(got, "nothing to train") || strings.Contains(got, "trained in") {
		t.Errorf("train --resume of a run at its end: exit %d\n%s%s\nwant nothing to train, and nothing said of a precision trained in", code, got, errOut)
	}
}

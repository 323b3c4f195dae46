package main

import (
	"strings"
	"testing"
)

// sched train names a bad --model or --precision by its flag, in sched
// bench's words, where it named the run configuration's YAML key (model:,
// precision) that no flag of the command line is called; and it does so
// before it asks for the run's length.
func TestTrainNamesABadModelOrPrecisionByItsFlag(t *testing.T) {
	t.Parallel()
	store := trainTestStore(t, 4096, 1000)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", "huge", "--steps", "5"}, `sched: --model: unknown model "huge": choose tiny, small or base`},
		{[]string{"--model", "huge"}, `sched: --model: unknown model "huge": choose tiny, small or base`},
		{[]string{"--precision", "fp16", "--steps", "5"}, `sched: --precision: unknown precision "fp16": choose fp32 or bf16`},
	} {
		args := append([]string{"train", "--tokens", store, "--engine", "cpu"}, c.args...)
		_, errOut, code := sched(t, nil, args...)
		if code != exitBadInput || strings.TrimSpace(errOut) != c.want {
			t.Errorf("sched %v: exit %d, %q; want exit 2 and %q", args, code, errOut, c.want)
		}
	}
	// What sched bench says of the same.
	for _, c := range []struct{ flag, value, want string }{
		{"--model", "huge", `sched: --model: unknown model "huge"`},
		{"--precision", "fp16", `sched: --precision: unknown precision "fp16"`},
	} {
		if _, errOut, code := sched(t, nil, "bench", "--engine", "cpu", c.flag, c.value); code != exitBadInput || !strings.HasPrefix(errOut, c.want) {
			t.Errorf("sched bench %s %s: exit %d, %q; want %q", c.flag, c.value, code, errOut, c.want)
		}
	}
}

// sched train --help says what a --run-config file holds in the words of
// the runs file a user writes, not by the Go type it is read into.
func TestTrainHelpSaysWhatARunConfigHolds(t *testing.T) {
	t.Parallel()
	out, errOut, code := sched(t, nil, "train", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	i := strings.Index(out, "--run-config string")
	if i < 0 {
		t.Fatalf("no --run-config in the help:\n%s", out)
	}
	line, _, _ := strings.Cut(out[i:], "\n")
	if strings.Contains(line, "trainer.") || strings.Contains(line, "RunConfig") || !strings.Contains(line, "model, seq, batch") || !strings.Contains(line, "KILN_RUNS entry") {
		t.Errorf("--run-config's help: %q; want the YAML's keys, as a KILN_RUNS entry's, and no Go type", line)
	}
}

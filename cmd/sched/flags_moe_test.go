package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sched train --moe and sched bench --moe refuse a flag alike, in a runs
// file's words after the flag: bench named config.json's keys
// (num_local_experts) and offered 0 experts (dense), which --moe refuses,
// and both took top_k=0 or d_ff=0 for the default, where "zero sizes are
// refused, not defaulted".
func TestMoEFlagRefusedAlikeByTrainAndBench(t *testing.T) {
	t.Parallel()
	rc := filepath.Join(t.TempDir(), "rc.yaml")
	if err := os.WriteFile(rc, []byte("model: tiny\nseq: 32\nmixture: [{store: /absent}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{
		"experts=4,top_k=0":  `--moe "experts=4,top_k=0": top_k is 0: give a positive value, or leave top_k out for its default (2)`,
		"experts=4,d_ff=0":   `--moe "experts=4,d_ff=0": d_ff is 0: give a positive value, or leave d_ff out for its default (the dense SwiGLU's width)`,
		"experts=0":          `--moe "experts=0": moe.experts must be at least 2, got 0`,
		"experts=1":          `--moe "experts=1": moe.experts must be at least 2, got 1`,
		"experts=4,top_k=5":  `--moe "experts=4,top_k=5": moe.top_k must be between 1 and moe.experts (4), got 5`,
		"experts=4,d_ff=-64": `--moe "experts=4,d_ff=-64": moe.d_ff must be at least 1, got -64`,
	} {
		for _, args := range [][]string{
			{"train", "--steps", "1", "--tokens", "/absent", "--moe", flag},
			// The flag's mistake, not the file's: the file was named.
			{"train", "--steps", "1", "--run-config", rc, "--moe", flag},
			{"bench", "--engine", "cpu", "--model", "tiny", "--batch", "1", "--seq", "8", "--steps", "1", "--precision", "fp32", "--moe", flag},
		} {
			out, errOut, code := sched(t, nil, args...)
			if line := strings.TrimSpace(errOut); code != exitBadInput || line != "sched: "+want {
				t.Errorf("sched %s: exit %d\n%s%s\nwant exit 2 and %q", strings.Join(args, " "), code, out, errOut, "sched: "+want)
			}
		}
	}
}

// sched train --run-config refuses a moe: with nothing under it, naming
// the file and the line: it trained a dense model without a word.
func TestTrainRefusesAnEmptyMoE(t *testing.T) {
	t.Parallel()
	rc := filepath.Join(t.TempDir(), "rc.yaml")
	if err := os.WriteFile(rc, []byte("model: tiny\nseq: 32\nbatch: 2\ntotal_steps: 2\nmixture: [{store: /absent}]\nmoe:\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, nil, "run config "+rc+": line 6: moe is empty: give its experts under it", "train", "--run-config", rc)
}

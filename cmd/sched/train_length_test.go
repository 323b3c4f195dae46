package main

import (
	"os"
	"path/filepath"
	"testing"
)

// --steps and --total-tokens give the run's length two ways, and the one
// given on the command line wins over the --run-config file's whichever way
// the file wrote it: the file's total_steps no longer wins over
// --total-tokens, as RunConfig.WithDefaults would have it.
func TestTrainLengthFlagReplacesTheRunConfigs(t *testing.T) {
	for _, c := range []struct {
		file   string
		flags  []string
		steps  int   // the run's steps once defaults are filled
		tokens int64 // total_tokens as resolved
	}{
		// 2 x 1 x 32 = 64 tokens a step: 2000 tokens is ceil(2000 / 64) steps.
		{"total_steps: 5", []string{"--total-tokens", "2000"}, 32, 2000},
		{"total_tokens: 2000", []string{"--steps", "3"}, 3, 0},
		{"total_steps: 5", []string{"--steps", "7"}, 7, 0},
		// No flag: the file's length, as it wrote it.
		{"total_steps: 5", nil, 5, 0},
		{"total_tokens: 640", nil, 10, 640},
	} {
		path := filepath.Join(t.TempDir(), "rc.yaml")
		body := "model: tiny\nseq: 32\nbatch: 2\naccumulate: 1\nmixture: [{store: /data/x}]\n" + c.file + "\n"
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		var f trainFlags
		cmd := newTrainCmdFor(&f)
		if err := cmd.ParseFlags(append([]string{"--run-config", path}, c.flags...)); err != nil {
			t.Fatal(err)
		}
		rc, err := trainRunConfig(cmd, &f)
		if err != nil {
			t.Errorf("%s %v: %v", c.file, c.flags, err)
			continue
		}
		if steps := rc.WithDefaults().TotalSteps; steps != c.steps || rc.TotalTokens != c.tokens {
			t.Errorf("%s %v: %d steps, total_tokens %d; want %d steps, total_tokens %d", c.file, c.flags, steps, rc.TotalTokens, c.steps, c.tokens)
		}
	}
}

package trainer

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func isBadInput(err error) bool {
	var b interface{ BadInput() bool }
	return errors.As(err, &b) && b.BadInput()
}

func TestLoadRunConfigReadsEveryKeyAndFillsDefaults(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.yaml")
	yaml := `model: small
seq: 512
batch: 4
accumulate: 8
lr: 6e-4
warmup: 200
total_tokens: 1000000
weight_decay: 0.1
eval_every: 50
checkpoint_every: 100
seed: 7
engine: cpu
precision: fp32
mixture:
  - {store: /data/code, weight: 0.7}
  - {store: /data/web}
`
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := LoadRunConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Model != "small" || c.Seq != 512 || c.Batch != 4 || c.Accumulate != 8 || c.LR != 6e-4 ||
		c.Warmup != 200 || c.WeightDecay != 0.1 || c.Seed != 7 || c.Engine != "cpu" || c.Precision != "fp32" {
		t.Errorf("fields not read: %+v", c)
	}
	// 1e6 tokens at 4 x 8 x 512 = 16384 tokens per step: 62 steps, rounded up.
	if c.TotalSteps != 62 {
		t.Errorf("total_steps derived from total_tokens = %d, want 62", c.TotalSteps)
	}
	if c.Floor != 0.1 || c.Clip != 1 || c.Beta2 != 0.95 || c.LogEvery != 10 {
		t.Errorf("defaults not applied: %+v", c)
	}
	if len(c.Mixture) != 2 || c.Mixture[0].Weight != 0.7 || c.Mixture[1].Weight != 1 {
		t.Errorf("mixture = %+v, want code 0.7 and web 1", c.Mixture)
	}
}

func TestLoadRunConfigRejectsUnknownKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.yaml")
	if err := os.WriteFile(path, []byte("model: tiny\nlearning_rate: 1e-3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadRunConfig(path)
	if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "learning_rate") || !strings.Contains(err.Error(), path) {
		t.Fatalf("want a bad-input error naming the file and the key, got %v", err)
	}
}

func TestValidateNamesTheField(t *testing.T) {
	ok := RunConfig{Model: "tiny", TotalSteps: 10, Mixture: []MixtureEntry{{Store: "s"}}}
	for _, tc := range []struct {
		edit func(*RunConfig)
		want string
	}{
		{func(c *RunConfig) { c.Model = "huge" }, "unknown model"},
		{func(c *RunConfig) { c.Seq = 5000 }, "seq 5000"},
		{func(c *RunConfig) { c.TotalSteps = 0 }, "total_steps or total_tokens"},
		{func(c *RunConfig) { c.Floor = 2 }, "floor"},
		{func(c *RunConfig) { c.Beta1 = 1 }, "beta1"},
		{func(c *RunConfig) { c.Precision = "fp8" }, "precision"},
		{func(c *RunConfig) { c.Mixture = nil }, "--tokens"},
		{func(c *RunConfig) { c.Mixture[0].Weight = -1 }, "mixture[0]"},
		{func(c *RunConfig) { c.Mixture[0].Weight = math.Inf(1) }, "mixture[0]"},
		{func(c *RunConfig) { c.LR = math.NaN() }, "lr NaN"},
		{func(c *RunConfig) { c.LR = math.Inf(1) }, "lr +Inf"},
		{func(c *RunConfig) { c.Floor = math.NaN() }, "floor NaN"},
		{func(c *RunConfig) { c.Clip = math.NaN() }, "clip NaN"},
		{func(c *RunConfig) { c.WeightDecay = math.Inf(1) }, "weight_decay +Inf"},
		{func(c *RunConfig) { c.Beta2 = math.NaN() }, "beta2 NaN"},
		{func(c *RunConfig) { c.Eps = math.Inf(1) }, "eps +Inf"},
		{func(c *RunConfig) { c.Engine = "tpu" }, "engine \"tpu\""},
	} {
		c := ok
		c.Mixture = append([]MixtureEntry(nil), ok.Mixture...)
		tc.edit(&c)
		err := c.WithDefaults().Validate()
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want a bad-input error containing %q, got %v", tc.want, err)
		}
	}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Errorf("valid config rejected: %v", err)
	}
}

func TestParseMixtureEntry(t *testing.T) {
	e, err := ParseMixtureEntry("/data/code=0.7")
	if err != nil || e.Store != "/data/code" || e.Weight != 0.7 {
		t.Errorf("got %+v, %v", e, err)
	}
	e, err = ParseMixtureEntry("/data/web")
	if err != nil || e.Store != "/data/web" || e.Weight != 1 {
		t.Errorf("got %+v, %v", e, err)
	}
	for _, bad := range []string{"", "=1", "/x=abc", "/x=0", "/x=-2"} {
		if _, err := ParseMixtureEntry(bad); err == nil || !isBadInput(err) {
			t.Errorf("%q: want a bad-input error, got %v", bad, err)
		}
	}
}

// A size written as 0 in the YAML is refused by key, not taken as absent.
func TestLoadRunConfigRefusesZeroSizes(t *testing.T) {
	for _, key := range []string{"seq", "batch", "accumulate"} {
		path := filepath.Join(t.TempDir(), "run.yaml")
		os.WriteFile(path, []byte("model: tiny\n"+key+": 0\n"), 0o644)
		_, err := LoadRunConfig(path)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), key+" is 0") {
			t.Errorf("%s: 0: got %v, want a bad-input error naming it", key, err)
		}
	}
	path := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(path, []byte("model: tiny\nbatch: 4\n"), 0o644)
	if c, err := LoadRunConfig(path); err != nil || c.Batch != 4 {
		t.Errorf("batch 4: %+v, %v", c, err)
	}
}

package trainer

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
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
	if c.FloorOr() != 0.1 || c.ClipOr() != 1 || c.Beta2 != 0.95 || c.LogEvery != 10 {
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
		{func(c *RunConfig) { c.Floor = Float(2) }, "floor"},
		{func(c *RunConfig) { c.Beta1 = 1 }, "beta1"},
		{func(c *RunConfig) { c.Precision = "fp8" }, "precision"},
		{func(c *RunConfig) { c.Mixture = nil }, "--tokens"},
		{func(c *RunConfig) { c.Mixture[0].Weight = -1 }, "mixture[0]"},
		{func(c *RunConfig) { c.Mixture[0].Weight = math.Inf(1) }, "mixture[0]"},
		{func(c *RunConfig) { c.Mixture = []MixtureEntry{{Store: "s", Weight: 1}, {Store: "s", Weight: 2}} }, `mixture[1]: store "s" is named twice`},
		{func(c *RunConfig) { c.LR = math.NaN() }, "lr NaN"},
		{func(c *RunConfig) { c.LR = math.Inf(1) }, "lr +Inf"},
		{func(c *RunConfig) { c.Floor = Float(math.NaN()) }, "floor NaN"},
		{func(c *RunConfig) { c.Clip = Float(math.NaN()) }, "clip NaN"},
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
	// Two stores in one flag: the flag is repeated instead.
	if _, err := ParseMixtureEntry("a=0.7,b=0.3"); err == nil || !strings.Contains(err.Error(), "repeat --tokens for each, --tokens a=0.7 --tokens b=0.3") {
		t.Errorf("two stores in one --tokens: %v; want the repeated flag shown", err)
	}
}

// An empty --out is refused by name, before anything is made.
func TestAnEmptyRunDirectoryIsRefused(t *testing.T) {
	if err := makeRunDir(" "); err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "give --out a directory") {
		t.Errorf("an empty run directory: %v; want bad input naming --out", err)
	}
}

// A size written as 0 in the YAML is refused by key, not taken as absent.
func TestLoadRunConfigRefusesZeroSizes(t *testing.T) {
	for _, key := range []string{"seq", "batch", "accumulate", "lr", "eps", "eval_batches"} {
		path := filepath.Join(t.TempDir(), "run.yaml")
		os.WriteFile(path, []byte("model: tiny\neval_every: 10\n"+key+": 0\n"), 0o644)
		_, err := LoadRunConfig(path)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), key+" is 0") {
			t.Errorf("%s: 0: got %v, want a bad-input error naming it", key, err)
		}
	}
	path := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(path, []byte("model: tiny\nmixture:\n  - {store: /a, weight: 1}\n  - {store: /b, weight: 0.0}\n"), 0o644)
	if _, err := LoadRunConfig(path); err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "mixture[1] weight is 0") {
		t.Errorf("weight 0: got %v, want a bad-input error naming it", err)
	}
	os.WriteFile(path, []byte("model: tiny\nbatch: 4\n"), 0o644)
	if c, err := LoadRunConfig(path); err != nil || c.Batch != 4 {
		t.Errorf("batch 4: %+v, %v", c, err)
	}
}

// floor: 0 (a cosine to zero) and clip: 0 (no clipping) are values, not
// "absent": they survive the defaults, a checkpoint's JSON and a queue's
// payload, where a plain float's 0 became 0.1 and 1.0.
func TestZeroFloorAndClipAreKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.yaml")
	os.WriteFile(path, []byte("model: tiny\nfloor: 0\nclip: 0\ntotal_steps: 10\n"), 0o644)
	c, err := LoadRunConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(c.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	var back RunConfig
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	back = back.WithDefaults()
	if back.FloorOr() != 0 || back.ClipOr() != 0 {
		t.Errorf("floor %g, clip %g after the defaults and a JSON round trip; want 0 and 0 (%s)", back.FloorOr(), back.ClipOr(), b)
	}
	if lr := LearningRate(10, 1e-3, 0, 10, back.FloorOr()); lr != 0 {
		t.Errorf("the rate at the run's end with floor 0 is %g; want 0", lr)
	}
	// Left out, they take the defaults; a checkpoint written before they
	// were pointers reads as it did.
	var old RunConfig
	if err := json.Unmarshal([]byte(`{"model":"tiny","floor":0.1,"clip":1}`), &old); err != nil || old.FloorOr() != 0.1 || old.ClipOr() != 1 {
		t.Errorf("an older state's floor and clip: %v, %v, %v", old.Floor, old.Clip, err)
	}
	if d := (RunConfig{}).WithDefaults(); d.FloorOr() != 0.1 || d.ClipOr() != 1 {
		t.Errorf("defaults: floor %g, clip %g", d.FloorOr(), d.ClipOr())
	}
}

// A run's moe key turns the preset's SwiGLU into Mixtral's experts, with
// top_k, d_ff and aux_coef defaulted when absent.
func TestRunConfigMoE(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.yaml")
	yaml := "model: small\ntotal_steps: 10\nmixture: [{store: /data/code}]\nmoe: {experts: 8, top_k: 2, d_ff: 352, aux_coef: 0.02}\n"
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
	mc, err := c.ModelConfig()
	if err != nil {
		t.Fatal(err)
	}
	if mc.Experts != 8 || mc.ExpertsPerTok != 2 || mc.Intermediate != 352 || mc.RouterAuxCoef != 0.02 || mc.Hidden != 512 || mc.Layers != 8 {
		t.Errorf("model config %+v", mc)
	}
	// Defaults: top 2, the preset's width, coefficient 0.02; aux_coef 0
	// turns the load-balancing loss off.
	m, err := ParseMoE("experts=4")
	if err != nil {
		t.Fatal(err)
	}
	d := RunConfig{Model: "tiny", MoE: m}.WithDefaults()
	if d.MoE.TopK != 2 || d.MoE.DFF != model.Presets["tiny"].Intermediate || *d.MoE.AuxCoef != DefaultAuxCoef {
		t.Errorf("defaults %+v", *d.MoE)
	}
	m, err = ParseMoE("experts=8,top_k=1,d_ff=96,aux_coef=0")
	if err != nil {
		t.Fatal(err)
	}
	d = RunConfig{Model: "tiny", MoE: m}.WithDefaults()
	if mc, err := d.ModelConfig(); err != nil || mc.RouterAuxCoef != 0 || mc.ExpertsPerTok != 1 || mc.Intermediate != 96 {
		t.Errorf("aux_coef 0: %+v, %v", mc, err)
	}
	// A dense run's stored configuration says nothing of experts.
	b, _ := json.Marshal(testRun(1).WithDefaults())
	if strings.Contains(string(b), "moe") {
		t.Errorf("dense run config mentions moe: %s", b)
	}
}

func TestBadMoESettings(t *testing.T) {
	for flag, want := range map[string]string{
		"":                     "is not KEY=VALUE",
		"top_k=2":              "experts is missing",
		"experts=8,experts=4":  "given twice",
		"experts=8,top_k=two":  "top_k=two is not a number",
		"experts=8,capacity=1": `unknown key "capacity"`,
		"experts=8,aux_coef=":  "is not KEY=VALUE",
	} {
		_, err := ParseMoE(flag)
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--moe") {
			t.Errorf("--moe %q: %v, want bad input naming %q", flag, err, want)
		}
	}
	nan := math.NaN()
	neg := -0.5
	for _, c := range []struct {
		m    MoEConfig
		want string
	}{
		{MoEConfig{Experts: 1}, "moe.experts must be at least 2"},
		{MoEConfig{Experts: 4, TopK: 5}, "moe.top_k must be between 1 and moe.experts (4)"},
		{MoEConfig{Experts: 4, DFF: -3}, "moe.d_ff must be at least 1"},
		{MoEConfig{Experts: 4, AuxCoef: &nan}, "moe.aux_coef"},
		{MoEConfig{Experts: 4, AuxCoef: &neg}, "moe.aux_coef"},
	} {
		rc := testRun(1)
		m := c.m
		rc.MoE = &m
		err := rc.WithDefaults().Validate()
		if err == nil || !isBadInput(err) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: %v, want one line naming %q", c.m, err, c.want)
		}
	}
}

// A small CPU run with experts learns: a sequence whose next token follows
// from the last is fitted, the loss falling well below its start, and the
// checkpoint is Mixtral's.
func TestMoERunLowersTheLoss(t *testing.T) {
	requireCPU(t)
	mc := model.Presets["tiny"]
	d := &sliceData{ids: make([]int32, 20000), eval: make([]int32, 2000)}
	for i := range d.ids {
		d.ids[i] = int32(i * 7 % 61)
	}
	copy(d.eval, d.ids)
	rc := testRun(30)
	rc.LR, rc.Warmup, rc.EvalEvery = 1e-2, 2, 0
	rc.MoE = &MoEConfig{Experts: 4, TopK: 2, DFF: 48}
	out := t.TempDir()
	res, got, err := runCollect(t, context.Background(), Config{Run: rc, Out: out, Data: d}, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Done || len(got) != 30 {
		t.Fatalf("run: %+v, %d lines", res, len(got))
	}
	first, last := got[1].LossOr(0), got[30].LossOr(0)
	t.Logf("loss %.3f at step 1, %.3f at step 30", first, last)
	// Every line reports the load-balancing loss beside the loss, and each
	// expert's share of the routing.
	for step, m := range got {
		var sum float64
		for _, s := range m.ExpertShare {
			sum += s
		}
		if m.AuxLoss == nil || len(m.ExpertShare) != 4 || math.Abs(sum-1) > 1e-9 {
			t.Fatalf("step %d: aux_loss %v, expert_share %v; want both, the shares of 4 experts summing to 1", step, m.AuxLoss, m.ExpertShare)
		}
	}
	if !(last < first/2) {
		t.Errorf("loss %v -> %v over 30 steps: not learning", first, last)
	}
	b, err := os.ReadFile(filepath.Join(out, "step-0000030", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := model.ParseConfig(b)
	if err != nil || c.Experts != 4 || c.ExpertsPerTok != 2 || c.Intermediate != 48 || c.RouterAuxCoef != DefaultAuxCoef || c.Hidden != mc.Hidden {
		t.Errorf("checkpoint config %+v, %v:\n%s", c, err, b)
	}
	if !strings.Contains(string(b), "MixtralForCausalLM") {
		t.Errorf("checkpoint config is not Mixtral's:\n%s", b)
	}
}

// gpus takes a number or all in YAML, JSON and on the command line; a run
// whose step the GPUs cannot share, or several GPUs on the CPU engine, is
// refused in one line naming what to change.
func TestGPUsSetting(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		yaml string
		want GPUCount
		bad  bool
	}{
		{"gpus: 2", 2, false},
		{"gpus: all", GPUCount(model.AllGPUs), false},
		{"", 0, false},
		{"gpus: two", 0, true},
		{"gpus: 0", 0, true},
		{"gpus: -3", 0, true},
	} {
		path := filepath.Join(dir, "run.yaml")
		if err := os.WriteFile(path, []byte("model: tiny\naccumulate: 4\n"+c.yaml+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		rc, err := LoadRunConfig(path)
		if c.bad {
			if !isBadInput(err) || !strings.Contains(err.Error(), "gpus") {
				t.Errorf("%q: %v; want bad input naming gpus", c.yaml, err)
			}
			continue
		}
		if err != nil || rc.GPUs != c.want {
			t.Errorf("%q: gpus %v, %v; want %v", c.yaml, rc.GPUs, err, c.want)
		}
		b, err := json.Marshal(rc)
		if err != nil {
			t.Fatal(err)
		}
		var back RunConfig
		if err := json.Unmarshal(b, &back); err != nil || back.GPUs != rc.GPUs {
			t.Errorf("%q: JSON %s read back as gpus %v, %v", c.yaml, b, back.GPUs, err)
		}
	}
	base := RunConfig{Model: "tiny", Batch: 2, Accumulate: 6, TotalSteps: 10, Mixture: []MixtureEntry{{Store: "s"}}}
	for _, c := range []struct {
		gpus   GPUCount
		engine string
		want   string
	}{
		{4, "cuda", "accumulate 6 is not a multiple of gpus 4"},
		{2, "cpu", "needs the cuda engine"},
	} {
		rc := base
		rc.GPUs, rc.Engine = c.gpus, c.engine
		err := rc.WithDefaults().Validate()
		if !isBadInput(err) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("gpus %d engine %s: %v; want one line with %q", c.gpus, c.engine, err, c.want)
		}
	}
	for _, ok := range []GPUCount{0, 1, 2, 3, 6, GPUCount(model.AllGPUs)} {
		rc := base
		rc.GPUs, rc.Engine = ok, "cuda"
		if err := rc.WithDefaults().Validate(); err != nil {
			t.Errorf("gpus %v with accumulate 6: %v", ok, err)
		}
	}
}

// A size written without a value (lr: null, or lr: alone) is said to be
// empty, where it was said to be 0, which nobody wrote.
func TestLoadRunConfigSaysAnEmptyValueIsEmpty(t *testing.T) {
	for _, body := range []string{"model: tiny\nlr: null\n", "model: tiny\nlr:\n"} {
		path := filepath.Join(t.TempDir(), "run.yaml")
		os.WriteFile(path, []byte(body), 0o644)
		if _, err := LoadRunConfig(path); err == nil || !isBadInput(err) || !strings.Contains(err.Error(), "line 2: lr is empty: give a positive value, or leave it out") {
			t.Errorf("%q: %v; want a bad-input error saying lr is empty", body, err)
		}
	}
}

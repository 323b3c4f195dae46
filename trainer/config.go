// Package trainer is kiln's training loop: the learning-rate schedule,
// micro-batches with gradient accumulation, evaluation, metrics and
// checkpoints that resume bit-for-bit. It sees the model only through
// model.Engine, so the CPU reference and the CUDA engine run the same loop.
package trainer

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/internal/yamlstrict"
	"github.com/kiln-lm/kiln/model"
)

// RunConfig is what a run trains, on what, and how; it is read from YAML
// (`sched train --run-config FILE`) and stored in every checkpoint, so that a
// resumed run continues with the same settings. Zero values take the
// defaults of WithDefaults.
type RunConfig struct {
	// Model is a preset name (tiny, small, base).
	Model string `yaml:"model" json:"model"`
	// Seq is the number of positions per sequence (the window is Seq+1 ids).
	Seq int `yaml:"seq" json:"seq"`
	// Batch is the number of sequences per micro-batch.
	Batch int `yaml:"batch" json:"batch"`
	// Accumulate is the number of micro-batches per optimizer step.
	Accumulate int `yaml:"accumulate" json:"accumulate"`

	// LR is the peak learning rate; Warmup the number of warmup steps;
	// Floor the end of the cosine decay as a fraction of LR (0: decay to
	// zero). Floor and Clip are pointers because their 0 means something:
	// nil is "not given", which WithDefaults fills.
	LR     float64  `yaml:"lr" json:"lr"`
	Warmup int      `yaml:"warmup" json:"warmup"`
	Floor  *float64 `yaml:"floor" json:"floor"`

	// TotalSteps is the length of the run in optimizer steps; when zero it
	// is derived from TotalTokens. The cosine decays over the whole run.
	TotalSteps  int   `yaml:"total_steps" json:"total_steps"`
	TotalTokens int64 `yaml:"total_tokens" json:"total_tokens"`

	// Clip is the global gradient norm's bound; 0 disables clipping.
	Clip        *float64 `yaml:"clip" json:"clip"`
	WeightDecay float64  `yaml:"weight_decay" json:"weight_decay"`
	Beta1       float64  `yaml:"beta1" json:"beta1"`
	Beta2       float64  `yaml:"beta2" json:"beta2"`
	Eps         float64  `yaml:"eps" json:"eps"`

	// EvalEvery, CheckpointEvery and LogEvery count optimizer steps; zero
	// disables evaluation or periodic checkpoints, and leaves LogEvery at
	// its default, 10 (every step is 1). EvalBatches is the
	// number of held-out micro-batches one evaluation averages.
	EvalEvery       int `yaml:"eval_every" json:"eval_every"`
	EvalBatches     int `yaml:"eval_batches" json:"eval_batches"`
	CheckpointEvery int `yaml:"checkpoint_every" json:"checkpoint_every"`
	LogEvery        int `yaml:"log_every" json:"log_every"`

	// Seed fixes the initial weights and the data order.
	Seed uint64 `yaml:"seed" json:"seed"`
	// Engine is cpu, cuda or auto; Precision fp32 or bf16.
	Engine    string `yaml:"engine" json:"engine"`
	Precision string `yaml:"precision" json:"precision"`

	// Mixture lists the token stores and their sampling weights.
	Mixture []MixtureEntry `yaml:"mixture" json:"mixture"`

	// MoE replaces every layer's SwiGLU of the preset with Mixtral's sparse
	// mixture of experts; absent, the preset's dense model.
	MoE *MoEConfig `yaml:"moe,omitempty" json:"moe,omitempty"`

	// GPUs is how many GPUs of the host train the run data-parallel (a
	// number or all); unset, the worker's KILN_GPUS, else one. It is not
	// part of the run's identity: a run resumes on another number of GPUs
	// with the same data order.
	GPUs GPUCount `yaml:"gpus,omitempty" json:"gpus,omitempty"`
}

// GPUCount is a number of GPUs, or every GPU the process sees
// (model.AllGPUs), which the settings write as "all". Zero is unset.
type GPUCount int

// ParseGPUs reads a GPU count as the settings write it: a number from 1
// to model.MaxGPUs, or all in any case (compose, which reserves the GPUs
// for KILN_GPUS, takes ALL as all).
func ParseGPUs(s string) (GPUCount, error) { return ParseGPUsOf("gpus", s) }

// ParseGPUsOf is ParseGPUs for the setting name (--gpus, KILN_GPUS), which
// its refusal names.
func ParseGPUsOf(name, s string) (GPUCount, error) {
	v := strings.TrimSpace(s)
	if strings.EqualFold(v, "all") {
		return GPUCount(model.AllGPUs), nil
	}
	n, err := strconv.Atoi(v)
	if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-") {
		n, err = model.MaxGPUs+1, nil
	}
	switch {
	case err != nil || n < 1:
		return 0, badInput(fmt.Errorf("%s %q: give a number of GPUs (1 or more), or all", name, s))
	case n > model.MaxGPUs:
		return 0, badInput(fmt.Errorf("%s %q: %s", name, s, tooManyGPUs))
	}
	return GPUCount(n), nil
}

// tooManyGPUs says why a count above model.MaxGPUs is refused.
var tooManyGPUs = fmt.Sprintf("more than one host's GPUs: a run trains on the GPUs of one host, and NCCL joins at most %d there: give 1 to %d, or all",
	model.MaxGPUs, model.MaxGPUs)

func (g GPUCount) String() string { return model.GPUsString(int(g)) }

// UnmarshalYAML takes a number or all.
func (g *GPUCount) UnmarshalYAML(n *yaml.Node) error {
	v, err := ParseGPUs(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*g = v
	return nil
}

// MarshalYAML writes all or the number.
func (g GPUCount) MarshalYAML() (any, error) {
	if g == GPUCount(model.AllGPUs) {
		return "all", nil
	}
	return int(g), nil
}

// UnmarshalJSON takes a number or "all".
func (g *GPUCount) UnmarshalJSON(b []byte) error {
	v, err := ParseGPUs(strings.Trim(string(b), `"`))
	if err != nil {
		return err
	}
	*g = v
	return nil
}

// MarshalJSON writes "all" or the number.
func (g GPUCount) MarshalJSON() ([]byte, error) {
	if g == GPUCount(model.AllGPUs) {
		return []byte(`"all"`), nil
	}
	return []byte(strconv.Itoa(int(g))), nil
}

// MoEConfig is a run's mixture of experts: Experts SwiGLU experts per
// layer, each DFF wide, TopK of them a token, and the load-balancing loss
// at AuxCoef (Mixtral's router_aux_loss_coef; 0 turns it off).
type MoEConfig struct {
	Experts int      `yaml:"experts" json:"experts"`
	TopK    int      `yaml:"top_k" json:"top_k"`
	DFF     int      `yaml:"d_ff" json:"d_ff"`
	AuxCoef *float64 `yaml:"aux_coef" json:"aux_coef"`
}

// String writes m as ParseMoE reads it, leaving out what is unset; empty
// for no experts.
func (m *MoEConfig) String() string {
	if m == nil {
		return ""
	}
	s := fmt.Sprintf("experts=%d", m.Experts)
	if m.TopK != 0 {
		s += fmt.Sprintf(",top_k=%d", m.TopK)
	}
	if m.DFF != 0 {
		s += fmt.Sprintf(",d_ff=%d", m.DFF)
	}
	if m.AuxCoef != nil {
		s += ",aux_coef=" + strconv.FormatFloat(*m.AuxCoef, 'g', -1, 64)
	}
	return s
}

// DefaultAuxCoef is the load-balancing coefficient when aux_coef is absent.
const DefaultAuxCoef = 0.02

// ParseMoE reads the command line's experts=N,top_k=K,d_ff=F,aux_coef=C
// (any subset but experts; the rest take WithDefaults' values, and a
// top_k or d_ff of 0 is refused), checking each as a runs file's moe: is
// checked.
func ParseMoE(s string) (*MoEConfig, error) {
	m := &MoEConfig{}
	bad := func(format string, args ...any) error {
		return badInput(fmt.Errorf("--moe %q: "+format+" (give experts=N,top_k=K,d_ff=F,aux_coef=C)", append([]any{s}, args...)...))
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return nil, bad("%q is not KEY=VALUE", kv)
		}
		if seen[k] {
			return nil, bad("%s is given twice", k)
		}
		seen[k] = true
		var err error
		switch k {
		case "experts":
			m.Experts, err = strconv.Atoi(v)
		case "top_k":
			m.TopK, err = strconv.Atoi(v)
		case "d_ff":
			m.DFF, err = strconv.Atoi(v)
		case "aux_coef":
			var f float64
			f, err = strconv.ParseFloat(v, 64)
			m.AuxCoef = &f
		default:
			return nil, bad("unknown key %q", k)
		}
		if err != nil {
			return nil, bad("%s=%s is not a number", k, v)
		}
	}
	// A 0 would read as absent and take the default (withDefaults), a
	// value nobody gave, as a runs file's moe.top_k: 0 is refused
	// (CheckZerosWritten).
	for _, z := range []struct {
		key, dflt string
		v         int
	}{{"top_k", "2", m.TopK}, {"d_ff", "the dense SwiGLU's width", m.DFF}} {
		if seen[z.key] && z.v == 0 {
			return nil, badInput(fmt.Errorf("--moe %q: %s is 0: give a positive value, or leave %s out for its default (%s)", s, z.key, z.key, z.dflt))
		}
	}
	if !seen["experts"] {
		return nil, bad("experts is missing")
	}
	// Checked here, in a runs file's words, so that sched train and sched
	// bench refuse the flag alike and by its name (train's run check would
	// put a --run-config file's name on it). d_ff's default, the model's
	// SwiGLU width, is not known yet, and is positive.
	if err := m.withDefaults(1).check(); err != nil {
		return nil, badInput(fmt.Errorf("--moe %q: %w", s, err))
	}
	return m, nil
}

// MixtureEntry is one token store and its share of the training windows.
type MixtureEntry struct {
	Store  string  `yaml:"store" json:"store"`
	Weight float64 `yaml:"weight" json:"weight"`
}

// ParseMixtureEntry reads the command line's STORE[=WEIGHT] (weight 1 when
// absent).
func ParseMixtureEntry(s string) (MixtureEntry, error) {
	store, w, ok := strings.Cut(s, "=")
	e := MixtureEntry{Store: store, Weight: 1}
	if store == "" {
		return e, badInput(fmt.Errorf("--tokens %q: give a token store directory, optionally =WEIGHT", s))
	}
	if ok {
		v, err := strconv.ParseFloat(w, 64)
		if err != nil || !(v > 0) || math.IsInf(v, 0) {
			hint := ""
			if strings.Contains(w, ",") {
				hint = " (one store a flag: repeat --tokens for each, --tokens a=0.7 --tokens b=0.3)"
			}
			return e, badInput(fmt.Errorf("--tokens %q: the weight after = must be a finite positive number%s", s, hint))
		}
		e.Weight = v
	}
	return e, nil
}

// WithDefaults returns c with every zero field set to its default, the one
// place defaults are decided.
func (c RunConfig) WithDefaults() RunConfig {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	deff := func(p *float64, v float64) {
		if *p == 0 {
			*p = v
		}
	}
	if c.Model == "" {
		c.Model = "tiny"
	}
	def(&c.Seq, 256)
	def(&c.Batch, 8)
	def(&c.Accumulate, 1)
	deff(&c.LR, 3e-4)
	if c.Floor == nil {
		c.Floor = Float(0.1)
	}
	if c.Clip == nil {
		c.Clip = Float(1.0)
	}
	deff(&c.Beta1, 0.9)
	deff(&c.Beta2, 0.95)
	deff(&c.Eps, 1e-8)
	def(&c.EvalBatches, 4)
	def(&c.LogEvery, 10)
	if c.TotalSteps == 0 && c.TotalTokens > 0 {
		per := int64(c.TokensPerStep())
		c.TotalSteps = int((c.TotalTokens + per - 1) / per)
	}
	if c.Engine == "" {
		c.Engine = "auto"
	}
	if c.Precision == "" {
		c.Precision = "bf16"
	}
	for i := range c.Mixture {
		deff(&c.Mixture[i].Weight, 1)
	}
	if c.MoE != nil {
		ff := 0
		if mc, err := model.Preset(c.Model); err == nil {
			ff = mc.Intermediate
		}
		m := c.MoE.withDefaults(ff)
		c.MoE = &m
	}
	return c
}

// withDefaults is m with its absent fields set: top_k 2, d_ff the dense
// SwiGLU's width ff (left 0 when ff is), aux_coef DefaultAuxCoef.
func (m MoEConfig) withDefaults(ff int) MoEConfig {
	if m.TopK == 0 {
		m.TopK = 2
	}
	if m.DFF == 0 {
		m.DFF = ff
	}
	if m.AuxCoef == nil {
		v := DefaultAuxCoef
		m.AuxCoef = &v
	}
	return m
}

// Apply puts m's experts in place of c's SwiGLU, its absent fields taking
// their defaults (d_ff: c's SwiGLU width), and checks the result: m first,
// in a run's words (sched bench --moe, a bench shape), then the model.
func (m MoEConfig) Apply(c model.Config) (model.Config, error) {
	m = m.withDefaults(c.Intermediate)
	if err := m.check(); err != nil {
		return c, err
	}
	c.Experts, c.ExpertsPerTok, c.Intermediate, c.RouterAuxCoef = m.Experts, m.TopK, m.DFF, *m.AuxCoef
	if err := c.Validate(); err != nil {
		return c, badInput(fmt.Errorf("moe: %w", err))
	}
	return c, nil
}

// Float is a pointer to v, for the settings whose 0 is a value.
func Float(v float64) *float64 { return &v }

// FloorOr is Floor, 0 when not given (WithDefaults gives it).
func (c RunConfig) FloorOr() float64 { return orZero(c.Floor) }

// ClipOr is Clip, 0 (no clipping) when not given (WithDefaults gives it).
func (c RunConfig) ClipOr() float64 { return orZero(c.Clip) }

func orZero(p *float64) float64 {
	if p == nil {
		return 0
	}
	return *p
}

// CheckWarmup refuses, as bad input, a warmup as long as the run or
// longer: its learning rate would rise for the whole run and never decay,
// which trains without error and ends far from where the schedule meant
// to. A new run is held to it (sched train, sched enqueue train); a run
// already under way resumes as it began. It expects c.WithDefaults().
func (c RunConfig) CheckWarmup() error {
	if c.TotalSteps > 0 && c.Warmup >= c.TotalSteps {
		return badInput(fmt.Errorf("warmup %d is not shorter than the run's %d steps: the learning rate would rise for the whole run and never decay; give a warmup under %d steps (a few percent of the run is usual)",
			c.Warmup, c.TotalSteps, c.TotalSteps))
	}
	return nil
}

// TokensPerStep is the number of target tokens one optimizer step trains on.
func (c RunConfig) TokensPerStep() int { return c.Batch * c.Accumulate * c.Seq }

// LengthInTokens reports whether c's length is its total_tokens: its
// total_steps is not given, or is the one WithDefaults derives from
// total_tokens at c's tokens a step, which a change of seq, batch or
// accumulate changes with them.
func (c RunConfig) LengthInTokens() bool {
	per := int64(c.TokensPerStep())
	return c.TotalTokens > 0 && (c.TotalSteps == 0 || per > 0 && int64(c.TotalSteps) == (c.TotalTokens+per-1)/per)
}

// Validate reports the first field that makes c unusable, by its YAML name.
// It expects c.WithDefaults().
func (c RunConfig) Validate() error {
	mc, err := model.Preset(c.Model)
	if err != nil {
		return badInput(fmt.Errorf("model: %w", err))
	}
	for _, f := range []struct {
		key string
		v   float64
	}{{"lr", c.LR}, {"floor", c.FloorOr()}, {"clip", c.ClipOr()}, {"weight_decay", c.WeightDecay}, {"beta1", c.Beta1}, {"beta2", c.Beta2}, {"eps", c.Eps}} {
		// NaN passes every range check below, and an infinite rate or
		// epsilon would train to NaN a few steps in.
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) {
			return badInput(fmt.Errorf("%s %g: give a finite number", f.key, f.v))
		}
	}
	var msg string
	switch {
	case c.Seq < 1 || c.Seq > mc.MaxPositions:
		msg = fmt.Sprintf("seq %d is out of range: model %s takes 1 to %d positions", c.Seq, c.Model, mc.MaxPositions)
	case c.Batch < 1:
		msg = fmt.Sprintf("batch must be at least 1, got %d", c.Batch)
	case c.Accumulate < 1:
		msg = fmt.Sprintf("accumulate must be at least 1, got %d", c.Accumulate)
	case !(c.LR > 0):
		msg = fmt.Sprintf("lr must be positive, got %g", c.LR)
	case c.Warmup < 0:
		msg = fmt.Sprintf("warmup must not be negative, got %d", c.Warmup)
	case c.FloorOr() < 0 || c.FloorOr() > 1:
		msg = fmt.Sprintf("floor is a fraction of lr between 0 and 1, got %g", c.FloorOr())
	case c.TotalSteps < 0:
		msg = fmt.Sprintf("total_steps must be positive, got %d", c.TotalSteps)
	case c.TotalTokens < 0:
		msg = fmt.Sprintf("total_tokens must be positive, got %d", c.TotalTokens)
	case c.TotalSteps == 0:
		msg = "set total_steps or total_tokens: the run needs a length for its cosine decay"
	case c.ClipOr() < 0:
		msg = fmt.Sprintf("clip must not be negative (0 disables clipping), got %g", c.ClipOr())
	case c.WeightDecay < 0:
		msg = fmt.Sprintf("weight_decay must not be negative, got %g", c.WeightDecay)
	case c.Beta1 < 0 || c.Beta1 >= 1 || c.Beta2 < 0 || c.Beta2 >= 1:
		msg = fmt.Sprintf("beta1 (%g) and beta2 (%g) must lie in [0, 1)", c.Beta1, c.Beta2)
	case !(c.Eps > 0):
		msg = fmt.Sprintf("eps must be positive, got %g", c.Eps)
	case c.EvalEvery < 0 || c.CheckpointEvery < 0 || c.LogEvery < 0 || c.EvalBatches < 0:
		msg = "eval_every, eval_batches, checkpoint_every and log_every must not be negative"
	case c.Engine != "cpu" && c.Engine != "cuda" && c.Engine != "auto":
		msg = fmt.Sprintf("engine %q: choose cpu, cuda or auto", c.Engine)
	case c.Precision != "fp32" && c.Precision != "bf16":
		msg = fmt.Sprintf("precision %q: choose fp32 or bf16", c.Precision)
	case len(c.Mixture) == 0:
		msg = "mixture is empty: name at least one token store (a runs entry's mixture: [{store: NAME, weight: 1}], sched train's --tokens STORE[=WEIGHT])"
	case c.GPUs < GPUCount(model.AllGPUs):
		msg = fmt.Sprintf("gpus %d: give a number of GPUs (1 or more), or all", int(c.GPUs))
	case c.GPUs > model.MaxGPUs:
		msg = fmt.Sprintf("gpus %d: %s", int(c.GPUs), tooManyGPUs)
	}
	if err := model.CheckGPUs(c.Engine, int(c.GPUs)); msg == "" && err != nil {
		msg = err.Error()
	}
	if msg != "" {
		return badInput(errors.New(msg))
	}
	named := map[string]bool{}
	for i, m := range c.Mixture {
		if m.Store == "" || !(m.Weight > 0) || math.IsInf(m.Weight, 0) {
			return badInput(fmt.Errorf("mixture[%d]: needs a store and a finite positive weight, got %q weight %g", i, m.Store, m.Weight))
		}
		if named[m.Store] {
			return badInput(fmt.Errorf("mixture[%d]: store %q is named twice: name it once, with the sum of its weights", i, m.Store))
		}
		named[m.Store] = true
	}
	if c.GPUs > 1 {
		if _, err := NewGlobalBatch(c.Batch, c.Accumulate, int(c.GPUs)); err != nil {
			return err
		}
	}
	if c.MoE != nil {
		return c.MoE.check()
	}
	return nil
}

// check reports the first of m's fields out of range, by the key a runs
// file and --moe both write (moe.top_k, top_k=), in the same words for
// either. It expects m with its defaults (withDefaults): the model's own
// check (model.Config.Validate) would name config.json's keys, and say 0
// experts is a dense model, which --moe and moe: refuse.
func (m MoEConfig) check() error {
	var msg string
	switch {
	case m.Experts < 2:
		msg = fmt.Sprintf("moe.experts must be at least 2, got %d", m.Experts)
	case m.TopK < 1 || m.TopK > m.Experts:
		msg = fmt.Sprintf("moe.top_k must be between 1 and moe.experts (%d), got %d", m.Experts, m.TopK)
	case m.DFF < 1:
		msg = fmt.Sprintf("moe.d_ff must be at least 1, got %d", m.DFF)
	case m.AuxCoef == nil || !(*m.AuxCoef >= 0) || math.IsInf(*m.AuxCoef, 0):
		msg = fmt.Sprintf("moe.aux_coef must be a finite number >= 0, got %v", derefOr(m.AuxCoef))
	}
	if msg != "" {
		return badInput(errors.New(msg))
	}
	return nil
}

func derefOr(p *float64) any {
	if p == nil {
		return "nothing"
	}
	return *p
}

// ModelConfig is the Llama configuration of c's preset, with Mixtral's
// experts in place of its SwiGLU when c.MoE is set. It expects
// c.WithDefaults().
func (c RunConfig) ModelConfig() (model.Config, error) {
	mc, err := model.Preset(c.Model)
	if err != nil {
		return mc, badInput(fmt.Errorf("model: %w", err))
	}
	if c.MoE != nil {
		return c.MoE.Apply(mc)
	}
	return mc, nil
}

// LoadRunConfig reads a YAML run configuration; unknown keys are an error,
// so that a misspelt setting is not silently ignored.
func LoadRunConfig(path string) (RunConfig, error) {
	var c RunConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return c, badInput(fmt.Errorf("run config: %w", err))
	}
	if err := yamlstrict.Unmarshal(b, &c); err != nil {
		return c, badInput(fmt.Errorf("run config %s: %w", path, err))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err == nil && len(doc.Content) > 0 {
		if err := CheckZerosWritten(doc.Content[0], c); err != nil {
			return c, badInput(fmt.Errorf("run config %s: %w", path, err))
		}
		if err := CheckMoEWritten(doc.Content[0], false); err != nil {
			return c, badInput(fmt.Errorf("run config %s: %w", path, err))
		}
	}
	return c, nil
}

// zeroValues are the values of a run that WithDefaults reads as absent
// when 0, and whose 0 cannot mean anything: written out, a 0 would silently
// become the default, and the run would train with a value nobody wrote.
// Not here: counts whose 0 means something (eval_every: no evaluation,
// and eval_batches beside it), and floor and clip, whose 0 is kept.
var zeroValues = []struct {
	key string
	get func(RunConfig) float64
	// instead says what to write for what a 0 might have meant.
	instead string
}{
	{"seq", func(c RunConfig) float64 { return float64(c.Seq) }, ""},
	{"batch", func(c RunConfig) float64 { return float64(c.Batch) }, ""},
	{"accumulate", func(c RunConfig) float64 { return float64(c.Accumulate) }, ""},
	{"moe.top_k", func(c RunConfig) float64 { return float64(c.moeOr().TopK) }, ""},
	{"moe.d_ff", func(c RunConfig) float64 { return float64(c.moeOr().DFF) }, ""},
	{"lr", func(c RunConfig) float64 { return c.LR }, ""},
	{"eps", func(c RunConfig) float64 { return c.Eps }, ""},
	// With eval_every 0 beside it, no evaluation is what both say.
	{"eval_batches", func(c RunConfig) float64 {
		if c.EvalEvery == 0 {
			return 1
		}
		return float64(c.EvalBatches)
	}, "; for no evaluation, set eval_every: 0"},
}

// CheckZerosWritten refuses, naming its line, a value that body (a run's
// YAML, decoded into c) writes as 0 where 0 reads as absent: no later check
// can tell it from a value left out. A store's weight of 0 would weigh 1.
func CheckZerosWritten(body *yaml.Node, c RunConfig) error {
	for _, z := range zeroValues {
		// Present in the file and 0 once decoded, so that 00 or 0.0 is 0 too.
		if n := LookupYAML(body, strings.Split(z.key, ".")...); n != nil && z.get(c) == 0 {
			what := "0"
			if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
				what = "empty" // lr: (or null, ~), which decodes as 0
			}
			return fmt.Errorf("line %d: %s is %s: give a positive value, or leave it out%s", n.Line, z.key, what, z.instead)
		}
	}
	if n := LookupYAML(body, "mixture"); n != nil && n.Kind == yaml.SequenceNode {
		for i, e := range n.Content {
			if w := LookupYAML(e, "weight"); w != nil && i < len(c.Mixture) && c.Mixture[i].Weight == 0 {
				return fmt.Errorf("line %d: mixture[%d] weight is 0: leave the store out of the mixture instead, or give it a positive weight", w.Line, i)
			}
		}
	}
	return nil
}

// CheckMoEWritten refuses, naming its line, a moe: that body (a run's
// YAML) writes with nothing under it (or null, ~): it decodes as no
// experts, and the keys under it forgotten would train a dense run
// without a word, where moe: {} and an empty lr: are refused. Where the
// run inherits experts (inherits: a runs file's from:, or the preset it
// overrides), it turns them off, which nothing else in the file can say.
func CheckMoEWritten(body *yaml.Node, inherits bool) error {
	if n := LookupYAML(body, "moe"); n != nil && n.Kind == yaml.ScalarNode && n.Tag == "!!null" && !inherits {
		return fmt.Errorf("line %d: moe is empty: give its experts under it (moe: {experts: 4}, top_k, d_ff and aux_coef optional), or leave it out for a dense model", n.Line)
	}
	return nil
}

// moeOr is c's experts, or sizes other than 0 where the run has none.
func (c RunConfig) moeOr() MoEConfig {
	if c.MoE == nil {
		return MoEConfig{TopK: -1, DFF: -1}
	}
	return *c.MoE
}

// LookupYAML is the value node at path through body's mappings, or nil.
func LookupYAML(body *yaml.Node, path ...string) *yaml.Node {
	n := body
	for _, key := range path {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
			}
		}
		n = next
	}
	return n
}

// inputError marks an error as the caller's to fix; cmd/sched maps it to
// exit code 2.
type inputError struct{ err error }

func (e inputError) Error() string  { return e.err.Error() }
func (e inputError) Unwrap() error  { return e.err }
func (e inputError) BadInput() bool { return true }

func badInput(err error) error { return inputError{err} }

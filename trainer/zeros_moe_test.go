package trainer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-lm/kiln/model"
)

// --moe's top_k=0 or d_ff=0 is refused, naming the key and what to give,
// as a runs file's moe.top_k: 0 is: it read as absent and took the
// default, a value nobody gave.
func TestMoEFlagRefusesZeroSizes(t *testing.T) {
	for flag, want := range map[string]string{
		"experts=4,top_k=0": `--moe "experts=4,top_k=0": top_k is 0: give a positive value, or leave top_k out for its default (2)`,
		"experts=4,d_ff=0":  `--moe "experts=4,d_ff=0": d_ff is 0: give a positive value, or leave d_ff out for its default (the dense SwiGLU's width)`,
		"experts=4,d_ff=00": `--moe "experts=4,d_ff=00": d_ff is 0:`,
	} {
		m, err := ParseMoE(flag)
		if err == nil || !isBadInput(err) || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("--moe %s: %+v, %v; want bad input starting %q", flag, m, err, want)
		}
	}
	// aux_coef=0 turns the load-balancing loss off: it is a value.
	if m, err := ParseMoE("experts=4,aux_coef=0"); err != nil || m.AuxCoef == nil || *m.AuxCoef != 0 {
		t.Errorf("--moe experts=4,aux_coef=0: %+v, %v", m, err)
	}
}

// --moe and the model it builds (sched bench --moe, a bench shape) are
// refused in a runs file's words, the keys a user writes: they named
// config.json's (num_local_experts, num_experts_per_tok) and, for one
// expert, offered 0 (dense), which --moe refuses.
func TestMoEIsCheckedInTheRunsWords(t *testing.T) {
	tiny := model.Presets["tiny"]
	for _, c := range []struct {
		flag string
		m    MoEConfig
	}{
		{"experts=0", MoEConfig{Experts: 0}},
		{"experts=1", MoEConfig{Experts: 1}},
		{"experts=4,top_k=5", MoEConfig{Experts: 4, TopK: 5}},
		{"experts=4,top_k=-1", MoEConfig{Experts: 4, TopK: -1}},
		{"experts=4,d_ff=-3", MoEConfig{Experts: 4, DFF: -3}},
		{"experts=4,aux_coef=-1", MoEConfig{Experts: 4, AuxCoef: Float(-1)}},
	} {
		run := RunConfig{Model: "tiny", Seq: 32, Batch: 1, TotalSteps: 1, Mixture: []MixtureEntry{{Store: "s"}}, MoE: &c.m}.WithDefaults()
		want := run.Validate()
		if want == nil || !strings.HasPrefix(want.Error(), "moe.") {
			t.Fatalf("%s: a run's check says %v; want it refused by a moe. key", c.flag, want)
		}
		if _, err := ParseMoE(c.flag); err == nil || !isBadInput(err) || err.Error() != `--moe "`+c.flag+`": `+want.Error() {
			t.Errorf("--moe %s: %v; want %q after the flag", c.flag, err, want)
		}
		if _, err := c.m.Apply(tiny); err == nil || !isBadInput(err) || err.Error() != want.Error() {
			t.Errorf("%s applied to tiny: %v; want %q, as a run's check says it", c.flag, err, want)
		}
	}
}

// A moe: with nothing under it is refused, naming its line, as moe: {}
// and an empty lr: are: it decoded as no experts, and a run whose keys
// under it were forgotten trained dense without a word.
func TestEmptyMoEIsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, empty := range []string{"moe:\n", "moe: ~\n", "moe: null\n"} {
		path := filepath.Join(dir, "rc.yaml")
		if err := os.WriteFile(path, []byte("model: tiny\nseq: 32\ntotal_steps: 2\nmixture: [{store: s}]\n"+empty), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadRunConfig(path)
		want := "run config " + path + ": line 5: moe is empty: give its experts under it (moe: {experts: 4}, top_k, d_ff and aux_coef optional), or leave it out for a dense model"
		if err == nil || !isBadInput(err) || err.Error() != want {
			t.Errorf("%q: %v; want %q", empty, err, want)
		}
	}
}

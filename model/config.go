// Package model holds the Llama architecture kiln trains: its configuration
// (transformers' config.json), its parameters under Hugging Face tensor
// names, safetensors I/O, the engine interface both engines implement, and
// the CPU reference engine every faster path is checked against.
package model

import (
	"fmt"
	"math"
)

// Config is a Llama configuration, or a Mixtral one when Experts > 0. Field
// names follow transformers' LlamaConfig and MixtralConfig; JSON reading and
// writing (including rope_parameters and the older rope_theta) lives in
// configjson.go.
type Config struct {
	VocabSize        int     // vocab_size
	Hidden           int     // hidden_size (d_model)
	Layers           int     // num_hidden_layers
	Heads            int     // num_attention_heads
	KVHeads          int     // num_key_value_heads
	HeadDim          int     // head_dim (Hidden/Heads when absent)
	Intermediate     int     // intermediate_size (SwiGLU width, d_ff)
	MaxPositions     int     // max_position_embeddings
	RopeTheta        float64 // rope_parameters.rope_theta (or rope_theta)
	RMSNormEps       float64 // rms_norm_eps
	TieEmbeddings    bool    // tie_word_embeddings
	BOSTokenID       int     // bos_token_id
	EOSTokenID       int     // eos_token_id
	InitializerRange float64 // initializer_range (std of the normal init)

	// Mixtral's sparse mixture of experts replaces every layer's SwiGLU when
	// Experts > 0: a router picks ExpertsPerTok of Experts SwiGLU experts a
	// token, each Intermediate wide (Mixtral's intermediate_size is the
	// expert's width). Zero Experts is a dense Llama model.
	Experts       int     // num_local_experts
	ExpertsPerTok int     // num_experts_per_tok (top-k)
	RouterAuxCoef float64 // router_aux_loss_coef; 0 when output_router_logits is off
}

// MoE reports whether c has a mixture-of-experts feed-forward.
func (c Config) MoE() bool { return c.Experts > 0 }

// Validate reports the first field that makes c unusable, by its JSON name.
func (c Config) Validate() error {
	switch {
	case c.VocabSize <= 0:
		return fmt.Errorf("vocab_size must be positive, got %d", c.VocabSize)
	case c.Hidden <= 0:
		return fmt.Errorf("hidden_size must be positive, got %d", c.Hidden)
	case c.Layers <= 0:
		return fmt.Errorf("num_hidden_layers must be positive, got %d", c.Layers)
	case c.Heads <= 0 || c.KVHeads <= 0:
		return fmt.Errorf("num_attention_heads (%d) and num_key_value_heads (%d) must be positive", c.Heads, c.KVHeads)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c.Heads, c.KVHeads)
	case c.HeadDim <= 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("head_dim must be positive and even, got %d", c.HeadDim)
	case c.Intermediate <= 0:
		return fmt.Errorf("intermediate_size must be positive, got %d", c.Intermediate)
	case c.RopeTheta <= 0:
		return fmt.Errorf("rope_theta must be positive, got %g", c.RopeTheta)
	case c.RMSNormEps <= 0:
		return fmt.Errorf("rms_norm_eps must be positive, got %g", c.RMSNormEps)
	case c.Experts < 0 || c.Experts == 1:
		return fmt.Errorf("num_local_experts must be 0 (dense) or at least 2, got %d", c.Experts)
	case c.Experts == 0 && (c.ExpertsPerTok != 0 || c.RouterAuxCoef != 0):
		return fmt.Errorf("num_experts_per_tok (%d) and router_aux_loss_coef (%g) need num_local_experts", c.ExpertsPerTok, c.RouterAuxCoef)
	case c.Experts > 0 && (c.ExpertsPerTok < 1 || c.ExpertsPerTok > c.Experts):
		return fmt.Errorf("num_experts_per_tok must be between 1 and num_local_experts (%d), got %d", c.Experts, c.ExpertsPerTok)
	case !(c.RouterAuxCoef >= 0) || math.IsInf(c.RouterAuxCoef, 0):
		return fmt.Errorf("router_aux_loss_coef must be a finite number >= 0, got %g", c.RouterAuxCoef)
	}
	return nil
}

// Presets are the model sizes selected with --model.
var Presets = map[string]Config{
	// tiny: for tests and `sched demo`, 0.35M parameters. Its width and depth
	// were chosen for the demo's two minutes on a 2-core CPU: at twice this
	// width and depth the CPU engine ran 2.6 times slower while the loss fell
	// no faster per token over the first 60k tokens of the Go standard
	// library (docs/benchmarks.md, demo section).
	"tiny": {VocabSize: 4096, Hidden: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, Intermediate: 176,
		MaxPositions: 1024, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: true, BOSTokenID: 1, EOSTokenID: 0, InitializerRange: 0.02},
	// small: 32.0M parameters, the pilot's model.
	"small": {VocabSize: 16384, Hidden: 512, Layers: 8, Heads: 8, KVHeads: 4, HeadDim: 64, Intermediate: 1408,
		MaxPositions: 4096, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: true, BOSTokenID: 1, EOSTokenID: 0, InitializerRange: 0.02},
	// base: 101.7M parameters.
	"base": {VocabSize: 32000, Hidden: 768, Layers: 16, Heads: 12, KVHeads: 4, HeadDim: 64, Intermediate: 1408,
		MaxPositions: 4096, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: true, BOSTokenID: 1, EOSTokenID: 0, InitializerRange: 0.02},
}

// Preset returns the named model size, or an error that lists the names.
func Preset(name string) (Config, error) {
	c, ok := Presets[name]
	if !ok {
		return Config{}, fmt.Errorf("unknown model %q: choose tiny, small or base", name)
	}
	return c, nil
}

package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// configJSON mirrors the fields of transformers' LlamaConfig and
// MixtralConfig that kiln reads.
// Pointers tell an absent field from a zero one, so that transformers'
// defaults can be applied exactly where it applies them.
type configJSON struct {
	ModelType          *string          `json:"model_type"`
	VocabSize          *int             `json:"vocab_size"`
	HiddenSize         *int             `json:"hidden_size"`
	NumHiddenLayers    *int             `json:"num_hidden_layers"`
	NumAttentionHeads  *int             `json:"num_attention_heads"`
	NumKeyValueHeads   *int             `json:"num_key_value_heads"`
	HeadDim            *int             `json:"head_dim"`
	IntermediateSize   *int             `json:"intermediate_size"`
	MaxPositions       *int             `json:"max_position_embeddings"`
	RopeTheta          *float64         `json:"rope_theta"`
	RopeParameters     *json.RawMessage `json:"rope_parameters"`
	RopeScaling        *json.RawMessage `json:"rope_scaling"`
	RMSNormEps         *float64         `json:"rms_norm_eps"`
	TieWordEmbeddings  *bool            `json:"tie_word_embeddings"`
	BOSTokenID         json.RawMessage  `json:"bos_token_id"`
	EOSTokenID         json.RawMessage  `json:"eos_token_id"`
	InitializerRange   *float64         `json:"initializer_range"`
	HiddenAct          *string          `json:"hidden_act"`
	AttentionBias      *bool            `json:"attention_bias"`
	MLPBias            *bool            `json:"mlp_bias"`
	PretrainingTP      *int             `json:"pretraining_tp"`
	AttentionDropout   *float64         `json:"attention_dropout"`
	QuantizationConfig *json.RawMessage `json:"quantization_config"`
	NumLocalExperts    *int             `json:"num_local_experts"`
	NumExpertsPerTok   *int             `json:"num_experts_per_tok"`
	RouterAuxLossCoef  *float64         `json:"router_aux_loss_coef"`
	OutputRouterLogits *bool            `json:"output_router_logits"`
	RouterJitterNoise  *float64         `json:"router_jitter_noise"`
	SlidingWindow      *int             `json:"sliding_window"`
}

// ReadConfig reads a transformers config.json.
func ReadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read model config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return Config{}, &FormatError{Path: path, Msg: err.Error()}
	}
	return c, nil
}

// ParseConfig decodes a transformers LlamaConfig or MixtralConfig (by
// model_type; absent means llama). Absent fields take transformers'
// defaults (head_dim = hidden_size / num_attention_heads,
// num_key_value_heads = num_attention_heads, tie_word_embeddings false,
// rope_theta 10000, rms_norm_eps 1e-6, initializer_range 0.02; for Mixtral
// its own: 8 key/value heads, rope_theta 1e6, rms_norm_eps 1e-5, 8 experts,
// top 2, router_aux_loss_coef 0.001, output_router_logits false). The
// router's coefficient is kept only when output_router_logits is on, since
// transformers adds the load-balancing loss only then. Options kiln does not
// implement (rope scaling, biases, activations other than silu, a sliding
// window, router jitter) are rejected by name rather than silently computed
// differently.
func ParseConfig(b []byte) (Config, error) {
	var j configJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return Config{}, fmt.Errorf("config.json is not valid JSON (%w): it is damaged or not a model's config; copy the one saved with the weights", err)
	}
	mixtral := j.ModelType != nil && *j.ModelType == "mixtral"
	if j.ModelType != nil && *j.ModelType != "llama" && !mixtral {
		return Config{}, fmt.Errorf("model_type %q is not supported: kiln implements llama and mixtral only", *j.ModelType)
	}
	if j.HiddenAct != nil && *j.HiddenAct != "silu" {
		return Config{}, fmt.Errorf("hidden_act %q is not supported: kiln implements silu (SwiGLU) only", *j.HiddenAct)
	}
	if j.AttentionBias != nil && *j.AttentionBias {
		return Config{}, fmt.Errorf("attention_bias true is not supported: kiln's projections have no bias")
	}
	if j.MLPBias != nil && *j.MLPBias {
		return Config{}, fmt.Errorf("mlp_bias true is not supported: kiln's projections have no bias")
	}
	if j.PretrainingTP != nil && *j.PretrainingTP != 1 {
		return Config{}, fmt.Errorf("pretraining_tp %d is not supported: set it to 1", *j.PretrainingTP)
	}
	if j.QuantizationConfig != nil && string(*j.QuantizationConfig) != "null" {
		return Config{}, fmt.Errorf("quantization_config is not supported: kiln reads unquantized F32/BF16 weights only")
	}
	required := []struct {
		name string
		v    *int
	}{
		{"vocab_size", j.VocabSize}, {"hidden_size", j.HiddenSize}, {"num_hidden_layers", j.NumHiddenLayers},
		{"num_attention_heads", j.NumAttentionHeads}, {"intermediate_size", j.IntermediateSize},
	}
	for _, r := range required {
		if r.v == nil {
			return Config{}, fmt.Errorf("config.json lacks %s", r.name)
		}
	}
	c := Config{
		VocabSize:        *j.VocabSize,
		Hidden:           *j.HiddenSize,
		Layers:           *j.NumHiddenLayers,
		Heads:            *j.NumAttentionHeads,
		KVHeads:          *j.NumAttentionHeads,
		Intermediate:     *j.IntermediateSize,
		MaxPositions:     2048,
		RopeTheta:        10000,
		RMSNormEps:       1e-6,
		BOSTokenID:       1,
		EOSTokenID:       2,
		InitializerRange: 0.02,
	}
	if mixtral {
		c.KVHeads, c.RopeTheta, c.RMSNormEps, c.MaxPositions = 8, 1e6, 1e-5, 4096*32
		if err := parseMoE(&j, &c); err != nil {
			return Config{}, err
		}
	}
	if j.NumKeyValueHeads != nil {
		c.KVHeads = *j.NumKeyValueHeads
	}
	if j.HeadDim != nil {
		c.HeadDim = *j.HeadDim
	} else if c.Heads > 0 {
		c.HeadDim = c.Hidden / c.Heads
	}
	if j.MaxPositions != nil {
		c.MaxPositions = *j.MaxPositions
	}
	if j.RMSNormEps != nil {
		c.RMSNormEps = *j.RMSNormEps
	}
	if j.TieWordEmbeddings != nil {
		c.TieEmbeddings = *j.TieWordEmbeddings
	}
	if j.InitializerRange != nil {
		c.InitializerRange = *j.InitializerRange
	}
	if j.RopeTheta != nil {
		c.RopeTheta = *j.RopeTheta
	}
	for _, rp := range []struct {
		name string
		raw  *json.RawMessage
	}{{"rope_parameters", j.RopeParameters}, {"rope_scaling", j.RopeScaling}} {
		if rp.raw == nil || string(*rp.raw) == "null" {
			continue
		}
		theta, ok, err := parseRopeParameters(rp.name, *rp.raw)
		if err != nil {
			return Config{}, err
		}
		if ok {
			c.RopeTheta = theta
		}
	}
	var err error
	if c.BOSTokenID, err = tokenID("bos_token_id", j.BOSTokenID, c.BOSTokenID); err != nil {
		return Config{}, err
	}
	if c.EOSTokenID, err = tokenID("eos_token_id", j.EOSTokenID, c.EOSTokenID); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// parseMoE reads MixtralConfig's expert fields into c.
func parseMoE(j *configJSON, c *Config) error {
	c.Experts, c.ExpertsPerTok = 8, 2
	if j.NumLocalExperts != nil {
		c.Experts = *j.NumLocalExperts
	}
	if j.NumExpertsPerTok != nil {
		c.ExpertsPerTok = *j.NumExpertsPerTok
	}
	coef := 0.001
	if j.RouterAuxLossCoef != nil {
		coef = *j.RouterAuxLossCoef
	}
	if j.OutputRouterLogits != nil && *j.OutputRouterLogits {
		c.RouterAuxCoef = coef
	}
	if j.RouterJitterNoise != nil && *j.RouterJitterNoise != 0 {
		return fmt.Errorf("router_jitter_noise %g is not supported: set it to 0.0", *j.RouterJitterNoise)
	}
	if j.SlidingWindow != nil {
		return fmt.Errorf("sliding_window %d is not supported: kiln attends to every earlier position; set it to null", *j.SlidingWindow)
	}
	return nil
}

// parseRopeParameters reads rope_parameters (transformers 5) or the older
// rope_scaling. Only rope_type "default" is implemented; anything else would
// change every attention score, so it is refused with the keys named.
func parseRopeParameters(field string, raw json.RawMessage) (theta float64, ok bool, err error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return 0, false, fmt.Errorf("%s must be an object: %w", field, err)
	}
	var unknown []string
	for k, v := range m {
		switch k {
		case "rope_type", "type":
			if s, _ := v.(string); s != "default" {
				return 0, false, fmt.Errorf("%s.%s %v is not supported: kiln implements rope_type \"default\" only", field, k, v)
			}
		case "rope_theta":
			f, isNum := v.(float64)
			if !isNum {
				return 0, false, fmt.Errorf("%s.rope_theta must be a number, got %v", field, v)
			}
			theta, ok = f, true
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return 0, false, fmt.Errorf("%s has options kiln does not implement: %s (only rope_type \"default\" and rope_theta)", field, strings.Join(unknown, ", "))
	}
	return theta, ok, nil
}

// tokenID reads a token id that transformers allows to be null, an integer
// or a list of integers (Llama 3 lists several EOS ids); kiln keeps the first.
func tokenID(field string, raw json.RawMessage, def int) (int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return def, nil
	}
	var id int
	if err := json.Unmarshal(raw, &id); err == nil {
		return id, nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return ids[0], nil
	}
	return 0, fmt.Errorf("%s must be an integer or a list of integers, got %s", field, raw)
}

// MarshalConfig encodes c as transformers' save_pretrained writes a
// LlamaConfig, or a MixtralConfig when c has experts: sorted keys,
// two-space indent. It writes rope_parameters for transformers 5 and the
// top-level rope_theta that transformers 4 reads.
func MarshalConfig(c Config) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	m := sharedConfigMap(c)
	if c.MoE() {
		for k, v := range map[string]any{
			"architectures":        []string{"MixtralForCausalLM"},
			"model_type":           "mixtral",
			"num_experts_per_tok":  c.ExpertsPerTok,
			"num_local_experts":    c.Experts,
			"output_router_logits": c.RouterAuxCoef > 0,
			"router_aux_loss_coef": pyFloat(c.RouterAuxCoef),
			"router_jitter_noise":  pyFloat(0),
			"sliding_window":       nil,
		} {
			m[k] = v
		}
		return encodeConfig(m)
	}
	for k, v := range map[string]any{
		"architectures":  []string{"LlamaForCausalLM"},
		"attention_bias": false,
		"mlp_bias":       false,
		"model_type":     "llama",
		"pretraining_tp": 1,
	} {
		m[k] = v
	}
	return encodeConfig(m)
}

// sharedConfigMap holds the keys LlamaConfig and MixtralConfig write
// alike. For a model with experts, MixtralConfig's save_pretrained adds
// the experts' keys, and the load-balancing loss is on
// (output_router_logits) exactly when its coefficient is, so that
// transformers trains a kiln checkpoint as kiln did.
func sharedConfigMap(c Config) map[string]any {
	return map[string]any{
		"attention_dropout":       pyFloat(0),
		"bos_token_id":            c.BOSTokenID,
		"dtype":                   "float32",
		"eos_token_id":            c.EOSTokenID,
		"head_dim":                c.HeadDim,
		"hidden_act":              "silu",
		"hidden_size":             c.Hidden,
		"initializer_range":       pyFloat(c.InitializerRange),
		"intermediate_size":       c.Intermediate,
		"max_position_embeddings": c.MaxPositions,
		"num_attention_heads":     c.Heads,
		"num_hidden_layers":       c.Layers,
		"num_key_value_heads":     c.KVHeads,
		"pad_token_id":            nil,
		"rms_norm_eps":            pyFloat(c.RMSNormEps),
		"rope_parameters":         map[string]any{"rope_theta": pyFloat(c.RopeTheta), "rope_type": "default"},
		"rope_theta":              pyFloat(c.RopeTheta),
		"tie_word_embeddings":     c.TieEmbeddings,
		"use_cache":               true,
		"vocab_size":              c.VocabSize,
	}
}

// pyFloat is a float field of a transformers config, written as Python's
// json writes a float: with a decimal point even when integral (0.0,
// 10000.0). transformers 5 checks a config's fields by type, and refuses a
// float field written as an integer (router_jitter_noise: 0).
type pyFloat float64

func (f pyFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, fmt.Errorf("config value %v is not a JSON number", v)
	}
	// Python's repr: the shortest digits, in exponent form below 1e-4 and
	// from 1e16 (1e-05, 1e+16: Go's 'e' form, a signed exponent of at least
	// two digits), else positional with at least one decimal.
	if x := math.Abs(v); x != 0 && (x < 1e-4 || x >= 1e16) {
		return strconv.AppendFloat(nil, v, 'e', -1, 64), nil
	}
	b := strconv.AppendFloat(nil, v, 'f', -1, 64)
	if !bytes.ContainsRune(b, '.') {
		b = append(b, ".0"...)
	}
	return b, nil
}

func encodeConfig(m map[string]any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteConfig writes c as config.json at path (through a temporary file and
// a rename, so that a crash never leaves half a config).
func WriteConfig(path string, c Config) error {
	b, err := MarshalConfig(c)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return writeFileAtomic(path, b)
}

// writeFileAtomic writes b to a temporary file beside path, syncs it and
// renames it into place.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

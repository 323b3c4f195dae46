package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadGoldenConfigs(t *testing.T) {
	c, err := ReadConfig(filepath.Join("testdata", "golden", "hd64", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{VocabSize: 512, Hidden: 128, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 64, Intermediate: 352,
		MaxPositions: 256, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: false, BOSTokenID: 1, EOSTokenID: 2, InitializerRange: 0.02}
	if c != want {
		t.Errorf("got %+v\nwant %+v", c, want)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	for name, c := range Presets {
		b, err := MarshalConfig(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseConfig(b)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, b)
		}
		if got != c {
			t.Errorf("%s: round trip gives %+v, want %+v", name, got, c)
		}
		if !strings.Contains(string(b), `"rope_type": "default"`) {
			t.Errorf("%s: no rope_parameters written:\n%s", name, b)
		}
	}
}

// transformers 4 wrote rope_theta at the top level and no head_dim; both
// still load, with head_dim = hidden_size / num_attention_heads.
func TestOlderConfigFields(t *testing.T) {
	c, err := ParseConfig([]byte(`{"model_type":"llama","vocab_size":100,"hidden_size":64,"num_hidden_layers":1,
		"num_attention_heads":4,"intermediate_size":128,"rope_theta":500000.0,"rope_scaling":null,"eos_token_id":[7,8]}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.RopeTheta != 500000 || c.HeadDim != 16 || c.KVHeads != 4 || c.EOSTokenID != 7 || c.TieEmbeddings || c.RMSNormEps != 1e-6 {
		t.Errorf("got %+v", c)
	}
}

func TestConfigRejectsWhatIsNotImplemented(t *testing.T) {
	base := `"vocab_size":100,"hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":128`
	cases := map[string]string{
		`"rope_parameters":{"rope_type":"llama3","rope_theta":10000,"factor":8}`:  "rope_type llama3",
		`"rope_parameters":{"rope_type":"default","rope_theta":10000,"factor":8}`: "factor",
		`"rope_scaling":{"type":"linear","factor":2}`:                             "rope_scaling.type linear",
		`"hidden_act":"gelu"`:     "hidden_act",
		`"attention_bias":true`:   "attention_bias",
		`"num_key_value_heads":3`: "num_key_value_heads",
	}
	for extra, want := range cases {
		_, err := ParseConfig([]byte("{" + base + "," + extra + "}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming %q", extra, err, want)
		}
	}
	if _, err := ParseConfig([]byte(`{"hidden_size":64}`)); err == nil || !strings.Contains(err.Error(), "vocab_size") {
		t.Errorf("missing vocab_size: %v", err)
	}
}

// The Mixtral golden's config.json (MixtralConfig as transformers 5.17
// saves it) reads as a Llama layout with experts; kiln writes it back as a
// MixtralConfig that reads the same.
func TestMixtralConfig(t *testing.T) {
	c, err := ReadConfig(filepath.Join("testdata", "golden", "moe", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{VocabSize: 512, Hidden: 128, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 64, Intermediate: 96,
		MaxPositions: 256, RopeTheta: 10000, RMSNormEps: 1e-5, TieEmbeddings: false, BOSTokenID: 1, EOSTokenID: 2, InitializerRange: 0.02,
		Experts: 8, ExpertsPerTok: 2, RouterAuxCoef: 0.02}
	if c != want {
		t.Fatalf("got %+v\nwant %+v", c, want)
	}
	b, err := MarshalConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"MixtralForCausalLM"`, `"model_type": "mixtral"`, `"num_local_experts": 8`, `"num_experts_per_tok": 2`,
		`"router_aux_loss_coef": 0.02`, `"output_router_logits": true`, `"intermediate_size": 96`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("written config lacks %s:\n%s", key, b)
		}
	}
	if got, err := ParseConfig(b); err != nil || got != c {
		t.Errorf("round trip: %+v, %v; want %+v", got, err, c)
	}
	// Every value the golden's file holds is written as transformers
	// writes it, floats with their decimal point: transformers 5 refuses
	// router_jitter_noise: 0 (an int) in a float field.
	var golden, ours map[string]json.RawMessage
	gb, err := os.ReadFile(filepath.Join("testdata", "golden", "moe", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(gb, &golden); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ours); err != nil {
		t.Fatal(err)
	}
	for k, v := range golden {
		switch k {
		case "transformers_version", "head_dim": // not written; head_dim is written as the number it defaults to
			continue
		case "rope_parameters":
			var g, o map[string]json.RawMessage
			json.Unmarshal(v, &g)
			json.Unmarshal(ours[k], &o)
			if string(g["rope_theta"]) != string(o["rope_theta"]) {
				t.Errorf("rope_parameters.rope_theta: written %s, transformers writes %s", o["rope_theta"], g["rope_theta"])
			}
			continue
		}
		if got := strings.Join(strings.Fields(string(ours[k])), ""); got != strings.Join(strings.Fields(string(v)), "") {
			t.Errorf("%s: written %s, transformers writes %s", k, ours[k], v)
		}
	}
	// A dense config says nothing of experts.
	dense, _ := MarshalConfig(Presets["small"])
	for _, key := range []string{"experts", "router", "mixtral"} {
		if strings.Contains(string(dense), key) {
			t.Errorf("dense config mentions %q:\n%s", key, dense)
		}
	}
	// Without output_router_logits transformers adds no load-balancing
	// loss, and neither does kiln; MixtralConfig's defaults fill the rest.
	c, err = ParseConfig([]byte(`{"model_type":"mixtral","vocab_size":100,"hidden_size":64,"num_hidden_layers":1,
		"num_attention_heads":8,"intermediate_size":32,"router_aux_loss_coef":0.02}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Experts != 8 || c.ExpertsPerTok != 2 || c.RouterAuxCoef != 0 || c.KVHeads != 8 || c.RopeTheta != 1e6 || c.RMSNormEps != 1e-5 {
		t.Errorf("defaults: %+v", c)
	}
}

func TestMixtralConfigRejects(t *testing.T) {
	base := `"model_type":"mixtral","vocab_size":100,"hidden_size":64,"num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":32`
	cases := map[string]string{
		`"num_local_experts":1`:                                 "num_local_experts",
		`"num_local_experts":4,"num_experts_per_tok":5`:         "num_experts_per_tok",
		`"num_experts_per_tok":0`:                               "num_experts_per_tok",
		`"router_aux_loss_coef":-1,"output_router_logits":true`: "router_aux_loss_coef",
		`"router_jitter_noise":0.1`:                             "router_jitter_noise",
		`"sliding_window":4096`:                                 "sliding_window",
	}
	for extra, want := range cases {
		_, err := ParseConfig([]byte("{" + base + "," + extra + "}"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming %q", extra, err, want)
		}
	}
	bad := Presets["tiny"]
	bad.ExpertsPerTok = 2
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "num_local_experts") {
		t.Errorf("top-k without experts: %v", err)
	}
}

// Float fields are written as Python writes them, which transformers'
// typed configs read back as floats.
func TestConfigFloatsAsPythonWritesThem(t *testing.T) {
	for v, want := range map[float64]string{0: "0.0", 1e4: "10000.0", 1e6: "1000000.0", 1e-5: "1e-05", 1e-6: "1e-06",
		0.02: "0.02", 1e-4: "0.0001", 1e16: "1e+16", 2.5e-7: "2.5e-07", 123.25: "123.25"} {
		b, err := pyFloat(v).MarshalJSON()
		if err != nil || string(b) != want {
			t.Errorf("%v: %s, %v; want %s", v, b, err, want)
		}
	}
}

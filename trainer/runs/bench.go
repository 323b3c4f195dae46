package runs

import (
	_ "embed"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/kiln-lm/kiln/model"
	"github.com/kiln-lm/kiln/trainer"
)

//go:embed bench.yaml
var benchYAML []byte

// Shape is one configuration of the bench sweep: a model preset, or a
// dense configuration given by vocabulary, width and depth, at a batch and
// sequence length.
type Shape struct {
	Model  string `yaml:"model,omitempty" json:"model,omitempty"`
	Vocab  int    `yaml:"vocab,omitempty" json:"vocab,omitempty"`
	DModel int    `yaml:"d_model,omitempty" json:"d_model,omitempty"`
	Layers int    `yaml:"layers,omitempty" json:"layers,omitempty"`
	Batch  int    `yaml:"batch" json:"batch"`
	Seq    int    `yaml:"seq" json:"seq"`
	// Accumulate is the micro-batches of a step over all GPUs (0: one a
	// GPU), as a run's accumulate; Precision the engine's (empty: bf16).
	Accumulate int    `yaml:"accumulate,omitempty" json:"accumulate,omitempty"`
	Precision  string `yaml:"precision,omitempty" json:"precision,omitempty"`
	// MoE puts Mixtral's experts in every layer, as `sched train --moe`
	// takes them (experts=N[,top_k=K,d_ff=F]).
	MoE string `yaml:"moe,omitempty" json:"moe,omitempty"`
}

// Sweep returns the bench sweep's shapes in table order.
func Sweep() []Shape {
	var s []Shape
	if err := yaml.Unmarshal(benchYAML, &s); err != nil {
		panic(fmt.Sprintf("embedded bench.yaml: %v", err))
	}
	return s
}

// Config is the model the shape measures. A dense configuration takes the
// small preset's recipe (head_dim 64, two query heads per key/value head
// group of four, SwiGLU width 1408, the seed plan's d_ff) and changes only
// what the shape names.
func (s Shape) Config() (model.Config, error) {
	c, err := s.dense()
	if err != nil || s.MoE == "" {
		return c, err
	}
	m, err := trainer.ParseMoE(s.MoE)
	if err == nil {
		c, err = m.Apply(c)
	}
	if err != nil {
		return c, fmt.Errorf("bench shape %s: %w", s, err)
	}
	return c, nil
}

// dense is the shape's model without experts.
func (s Shape) dense() (model.Config, error) {
	if s.Model != "" {
		return model.Preset(s.Model)
	}
	c, _ := model.Preset("small")
	if s.Vocab <= 0 || s.DModel <= 0 || s.Layers <= 0 || s.DModel%64 != 0 {
		return c, fmt.Errorf("bench shape %s: needs a model name, or vocab, layers and a d_model that is a multiple of 64", s)
	}
	c.VocabSize, c.Hidden, c.Layers = s.Vocab, s.DModel, s.Layers
	c.Heads = s.DModel / 64
	c.KVHeads = 4
	if c.Heads%c.KVHeads != 0 {
		c.KVHeads = c.Heads
	}
	return c, c.Validate()
}

func (s Shape) String() string {
	more := ""
	if s.MoE != "" {
		more = " moe " + s.MoE
	}
	if s.Accumulate > 1 {
		more += fmt.Sprintf(" accumulate %d", s.Accumulate)
	}
	if s.Precision != "" {
		more += " " + s.Precision
	}
	if s.Model != "" {
		return fmt.Sprintf("%s %dx%d%s", s.Model, s.Batch, s.Seq, more)
	}
	return fmt.Sprintf("v%d d%d L%d %dx%d%s", s.Vocab, s.DModel, s.Layers, s.Batch, s.Seq, more)
}

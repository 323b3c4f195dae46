package model

import "fmt"

// TensorSpec names one parameter tensor and its shape, as transformers
// stores it (row-major; linear weights are [out, in]).
type TensorSpec struct {
	Name  string
	Shape []int
}

// Elements is the number of values in the tensor.
func (s TensorSpec) Elements() int {
	n := 1
	for _, d := range s.Shape {
		n *= d
	}
	return n
}

// Specs lists every parameter of c in a fixed order (the order of the flat
// parameter buffer both engines use): embed_tokens, then per layer
// input_layernorm, q, k, v, o, post_attention_layernorm, gate, up, down
// (with experts: the router, then each expert's w1, w2, w3 under the names
// Mixtral's save_pretrained writes), then norm, then lm_head when the
// embeddings are untied.
func (c Config) Specs() []TensorSpec {
	d, q, kv := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	specs := []TensorSpec{{"model.embed_tokens.weight", []int{c.VocabSize, d}}}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		specs = append(specs,
			TensorSpec{p + "input_layernorm.weight", []int{d}},
			TensorSpec{p + "self_attn.q_proj.weight", []int{q, d}},
			TensorSpec{p + "self_attn.k_proj.weight", []int{kv, d}},
			TensorSpec{p + "self_attn.v_proj.weight", []int{kv, d}},
			TensorSpec{p + "self_attn.o_proj.weight", []int{d, q}},
			TensorSpec{p + "post_attention_layernorm.weight", []int{d}},
		)
		if c.MoE() {
			specs = append(specs, TensorSpec{p + "block_sparse_moe.gate.weight", []int{c.Experts, d}})
			for x := 0; x < c.Experts; x++ {
				ep := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, x)
				specs = append(specs,
					TensorSpec{ep + "w1.weight", []int{c.Intermediate, d}},
					TensorSpec{ep + "w2.weight", []int{d, c.Intermediate}},
					TensorSpec{ep + "w3.weight", []int{c.Intermediate, d}},
				)
			}
			continue
		}
		specs = append(specs,
			TensorSpec{p + "mlp.gate_proj.weight", []int{c.Intermediate, d}},
			TensorSpec{p + "mlp.up_proj.weight", []int{c.Intermediate, d}},
			TensorSpec{p + "mlp.down_proj.weight", []int{d, c.Intermediate}},
		)
	}
	specs = append(specs, TensorSpec{"model.norm.weight", []int{d}})
	if !c.TieEmbeddings {
		specs = append(specs, TensorSpec{"lm_head.weight", []int{c.VocabSize, d}})
	}
	return specs
}

// NumParams is the number of trainable values (tied embeddings counted once).
func (c Config) NumParams() int {
	n := 0
	for _, s := range c.Specs() {
		n += s.Elements()
	}
	return n
}

// Params holds every parameter of a model in one flat FP32 buffer, laid out
// in Specs order, so that engines can copy it in one transfer and optimizers
// can treat it as one vector.
type Params struct {
	Config Config
	Data   []float32
	specs  []TensorSpec
	offset map[string]int
}

// NewParams allocates zeroed parameters for c.
func NewParams(c Config) *Params {
	p := &Params{Config: c, specs: c.Specs(), offset: map[string]int{}}
	n := 0
	for _, s := range p.specs {
		p.offset[s.Name] = n
		n += s.Elements()
	}
	p.Data = make([]float32, n)
	return p
}

// Specs lists the tensors in buffer order.
func (p *Params) Specs() []TensorSpec { return p.specs }

// NonFinite names the first tensor holding a NaN or an infinity, and the
// index of that value in it; ok is false when every value is finite. Weights
// of a training that diverged are such, and sample nothing but noise.
func (p *Params) NonFinite() (name string, at int, ok bool) {
	for _, s := range p.specs {
		for i, v := range p.Tensor(s.Name) {
			// v-v is 0 for every finite v, NaN for NaN and the infinities.
			if v-v != 0 {
				return s.Name, i, true
			}
		}
	}
	return "", 0, false
}

// Tensor returns the slice of Data holding the named tensor, or nil.
func (p *Params) Tensor(name string) []float32 {
	off, ok := p.offset[name]
	if !ok {
		return nil
	}
	for _, s := range p.specs {
		if s.Name == name {
			return p.Data[off : off+s.Elements()]
		}
	}
	return nil
}

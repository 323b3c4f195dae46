package model

import (
	"math/rand/v2"
	"strings"
)

// InitParams returns freshly initialised parameters for c, a function of c
// and seed alone: every linear and embedding weight is drawn from
// normal(0, initializer_range) (transformers' LlamaPreTrainedModel._init_weights)
// and every RMSNorm weight is one. Tensors are drawn in Specs order from one
// PCG stream, so the same seed gives bit-identical weights on every machine.
func InitParams(c Config, seed uint64) *Params {
	p := NewParams(c)
	r := rand.New(rand.NewPCG(seed, 0x6b696c6e)) // "kiln": fixes the stream for a seed
	std := c.InitializerRange
	for _, s := range p.Specs() {
		t := p.Tensor(s.Name)
		if strings.HasSuffix(s.Name, "norm.weight") {
			for i := range t {
				t[i] = 1
			}
			continue
		}
		for i := range t {
			t[i] = float32(r.NormFloat64() * std)
		}
	}
	return p
}

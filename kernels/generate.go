package kernels

import (
	"context"
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// Generate implements model.Engine: the prompt runs once, each new token
// then one row, attending to the cached keys and values. It returns the new
// tokens only (the stop token included), as the CPU engine does, and picks
// them with model.Sampler so that a seed draws the same on both engines.
func (e *Engine) Generate(ctx context.Context, prompt []int32, n int, stop int32, s model.Sampling) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("generate needs a prompt of at least one token")
	}
	if n < 0 {
		return nil, fmt.Errorf("generate: negative token count %d", n)
	}
	if _, err := e.checkRows(model.Batch{B: 1, T: len(prompt), Inputs: prompt}, false, true); err != nil {
		return nil, err
	}
	total := len(prompt) + n
	if total > e.positions {
		return nil, fmt.Errorf("prompt (%d) plus %d new tokens exceeds the %d positions the engine has rotary tables for", len(prompt), n, e.positions)
	}
	c := e.cfg
	V := c.VocabSize
	var out []int32
	err := e.th.do(func() error {
		g := &genState{cap: total}
		kvd := int64(c.KVHeads * c.HeadDim)
		var allocated []cuda.Ptr
		defer func() {
			for _, p := range allocated {
				_ = e.mem.free(p)
			}
		}()
		alloc := func(what string, bytes int64) (cuda.Ptr, error) {
			p, err := e.mem.alloc(what, bytes)
			if err == nil {
				allocated = append(allocated, p)
			}
			return p, err
		}
		for l := 0; l < c.Layers; l++ {
			k, err := alloc("KV cache", int64(total)*kvd*4)
			if err != nil {
				return err
			}
			v, err := alloc("KV cache", int64(total)*kvd*4)
			if err != nil {
				return err
			}
			g.k, g.v = append(g.k, k), append(g.v, v)
		}
		var err error
		if g.att, err = alloc("attention probabilities", int64(c.Heads)*int64(len(prompt))*int64(total)*4); err != nil {
			return err
		}
		if e.flash {
			// The prompt's rows are the most one forward takes.
			qd, rows := int64(c.Heads*c.HeadDim), int64(len(prompt))
			for _, b := range []struct {
				p *cuda.Ptr
				n int64
			}{{&g.q, qd}, {&g.y, qd}, {&g.kr, kvd}, {&g.vr, kvd}} {
				if *b.p, err = alloc("attention scratch", rows*b.n*4); err != nil {
					return err
				}
			}
		}
		sm := model.NewSampler(s)
		logits := make([]float32, V)
		tokens := prompt
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := e.stageIDs(tokens); err != nil {
				return err
			}
			if err := e.forwardGen(model.Batch{B: 1, T: len(tokens), Inputs: tokens}, g); err != nil {
				return err
			}
			if err := cuda.Download(e.dv, logits, e.a.logits); err != nil {
				return err
			}
			if len(out) == n {
				return nil
			}
			next := sm.Next(logits)
			out = append(out, next)
			if stop >= 0 && next == stop || len(out) == n {
				return nil
			}
			tokens = []int32{next}
		}
	})
	return out, err
}

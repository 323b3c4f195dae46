package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Sampler picks next tokens from logits as Sampling says. Both engines use
// it, so that a seed means the same draws on either.
type Sampler struct {
	s   Sampling
	rng *rand.Rand
	idx []int
	p   []float64
}

// NewSampler makes a sampler; its random stream depends only on s.Seed.
func NewSampler(s Sampling) *Sampler {
	return &Sampler{s: s, rng: rand.New(rand.NewPCG(s.Seed, 0x73616d70))} // "samp"
}

// Next returns the next token: the arg-max when Temperature is 0 (the lowest
// id on a tie), else a draw from softmax(logits / Temperature) restricted to
// the TopK largest logits when TopK > 0; ids at or past Vocab (when set)
// are never picked.
func (sm *Sampler) Next(logits []float32) int32 {
	if v := sm.s.Vocab; v > 0 && v < len(logits) {
		logits = logits[:v]
	}
	if sm.s.Temperature <= 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return int32(best)
	}
	sm.idx = sm.idx[:0]
	for i := range logits {
		sm.idx = append(sm.idx, i)
	}
	if k := sm.s.TopK; k > 0 && k < len(logits) {
		// Stable by id so that equal logits keep the same candidates.
		sort.SliceStable(sm.idx, func(a, b int) bool { return logits[sm.idx[a]] > logits[sm.idx[b]] })
		sm.idx = sm.idx[:k]
		sort.Ints(sm.idx)
	}
	m := math.Inf(-1)
	for _, i := range sm.idx {
		m = math.Max(m, float64(logits[i]))
	}
	sm.p = sm.p[:0]
	var sum float64
	for _, i := range sm.idx {
		e := math.Exp((float64(logits[i]) - m) / sm.s.Temperature)
		sm.p = append(sm.p, e)
		sum += e
	}
	r := sm.rng.Float64() * sum
	for j, e := range sm.p {
		r -= e
		if r < 0 {
			return int32(sm.idx[j])
		}
	}
	return int32(sm.idx[len(sm.idx)-1])
}

// kvCache holds every layer's rotated keys and values of the positions seen
// so far: (positions, KV*hd) per layer.
type kvCache struct {
	k, v [][]float32
	n    int
}

// Generate extends prompt by up to n tokens and returns the new tokens only
// (the stop token included when it ends the run). The prompt is run once
// through the model; each new token then costs one row of work, attending to
// the cached keys and values.
func (e *CPUEngine) Generate(ctx context.Context, prompt []int32, n int, stop int32, s Sampling) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("generate needs a prompt of at least one token")
	}
	if n < 0 {
		return nil, fmt.Errorf("generate: negative token count %d", n)
	}
	if err := e.checkBatch(Batch{B: 1, T: len(prompt), Inputs: prompt}, false); err != nil {
		return nil, err
	}
	c := e.cfg
	total := len(prompt) + n
	kvd := c.KVHeads * c.HeadDim
	cache := &kvCache{k: make([][]float32, c.Layers), v: make([][]float32, c.Layers)}
	for l := range cache.k {
		cache.k[l] = make([]float32, total*kvd)
		cache.v[l] = make([]float32, total*kvd)
	}
	e.rope.ensure(total)
	sm := NewSampler(s)
	var out []int32
	logits := e.decode(cache, prompt)
	for len(out) < n {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		next := sm.Next(logits)
		out = append(out, next)
		if stop >= 0 && next == stop || len(out) == n {
			break
		}
		logits = e.decode(cache, []int32{next})
	}
	return out, nil
}

// decode runs tokens at positions cache.n onward, appends their keys and
// values to the cache and returns the logits of the last token.
func (e *CPUEngine) decode(cache *kvCache, tokens []int32) []float32 {
	c := e.cfg
	n, d, H, hd := len(tokens), c.Hidden, c.Heads, c.HeadDim
	qd, kvd, F, group := H*hd, c.KVHeads*hd, c.Intermediate, H/c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	pos := make([]int, n)
	for i := range pos {
		pos[i] = cache.n + i
	}
	x := make([]float32, n*d)
	for i, id := range tokens {
		copy(x[i*d:(i+1)*d], e.pv.embed[int(id)*d:(int(id)+1)*d])
	}
	xn, r := make([]float32, n*d), make([]float32, n)
	q, att, o := make([]float32, n*qd), make([]float32, n*qd), make([]float32, n*d)
	var g, u []float32
	var ma *moeActs
	if c.MoE() {
		ma = newMoEActs(c, n)
	} else {
		g, u = make([]float32, n*F), make([]float32, n*F)
	}
	for l, w := range e.pv.layers {
		kc, vc := cache.k[l], cache.v[l]
		rmsNorm(xn, r, x, w.inNorm, n, d, c.RMSNormEps)
		linear(e.threads, q, xn, w.q, n, d, qd)
		newK, newV := kc[cache.n*kvd:(cache.n+n)*kvd], vc[cache.n*kvd:(cache.n+n)*kvd]
		linear(e.threads, newK, xn, w.k, n, d, kvd)
		linear(e.threads, newV, xn, w.v, n, d, kvd)
		e.rope.rope(q, pos, H, hd, false)
		e.rope.rope(newK, pos, c.KVHeads, hd, false)
		parallelFor(e.threads, n*H, func(lo, hi int) {
			p := make([]float32, cache.n+n)
			for ih := lo; ih < hi; ih++ {
				i, h := ih/H, ih%H
				kh, t := h/group, pos[ih/H]
				qt := q[i*qd+h*hd : i*qd+(h+1)*hd]
				for s := 0; s <= t; s++ {
					p[s] = dot(qt, kc[s*kvd+kh*hd:s*kvd+(kh+1)*hd]) * scale
				}
				softmaxRow(p[:t+1])
				outv := att[i*qd+h*hd : i*qd+(h+1)*hd]
				clear(outv)
				for s := 0; s <= t; s++ {
					axpy(p[s], vc[s*kvd+kh*hd:s*kvd+(kh+1)*hd], outv)
				}
			}
		})
		linear(e.threads, o, att, w.o, n, qd, d)
		for i := range x {
			x[i] += o[i]
		}
		rmsNorm(xn, r, x, w.postNorm, n, d, c.RMSNormEps)
		if c.MoE() {
			e.moeForward(w, xn, ma, o)
		} else {
			linear(e.threads, g, xn, w.gate, n, d, F)
			linear(e.threads, u, xn, w.up, n, d, F)
			swiglu(g, g, u)
			linear(e.threads, o, g, w.down, n, F, d)
		}
		for i := range x {
			x[i] += o[i]
		}
	}
	cache.n += n
	last := x[(n-1)*d : n*d]
	rmsNorm(xn[:d], r[:1], last, e.pv.norm, 1, d, c.RMSNormEps)
	logits := make([]float32, c.VocabSize)
	linear(e.threads, logits, xn[:d], e.pv.lmHead, 1, d, c.VocabSize)
	return logits
}

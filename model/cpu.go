package model

import (
	"fmt"
	"math"
	"runtime"
	"time"

	"github.com/kiln-lm/kiln/model/gemm"
)

func init() {
	Register("cpu", func(c Config, o Options) (Engine, error) { return NewCPUEngine(c, o) })
}

// layerView is one decoder layer's tensors inside a flat buffer (parameters
// or gradients): gate, up and down for a dense layer, router and experts
// for a mixture of experts.
type layerView struct {
	inNorm, q, k, v, o, postNorm, gate, up, down []float32
	router                                       []float32
	experts                                      []expertView
}

func viewLayers(p *Params) []layerView {
	ls := make([]layerView, p.Config.Layers)
	for l := range ls {
		t := func(s string) []float32 { return p.Tensor(fmt.Sprintf("model.layers.%d.%s.weight", l, s)) }
		ls[l] = layerView{
			inNorm: t("input_layernorm"), q: t("self_attn.q_proj"), k: t("self_attn.k_proj"),
			v: t("self_attn.v_proj"), o: t("self_attn.o_proj"), postNorm: t("post_attention_layernorm"),
		}
		if !p.Config.MoE() {
			ls[l].gate, ls[l].up, ls[l].down = t("mlp.gate_proj"), t("mlp.up_proj"), t("mlp.down_proj")
			continue
		}
		ls[l].router = t("block_sparse_moe.gate")
		for x := 0; x < p.Config.Experts; x++ {
			et := func(s string) []float32 { return t(fmt.Sprintf("block_sparse_moe.experts.%d.%s", x, s)) }
			ls[l].experts = append(ls[l].experts, expertView{w1: et("w1"), w2: et("w2"), w3: et("w3")})
		}
	}
	return ls
}

// modelView is the whole model's tensors inside a flat buffer. lmHead is the
// embedding itself when the embeddings are tied.
type modelView struct {
	embed, norm, lmHead []float32
	layers              []layerView
}

func viewModel(p *Params) modelView {
	v := modelView{embed: p.Tensor("model.embed_tokens.weight"), norm: p.Tensor("model.norm.weight"), layers: viewLayers(p)}
	v.lmHead = v.embed
	if !p.Config.TieEmbeddings {
		v.lmHead = p.Tensor("lm_head.weight")
	}
	return v
}

// layerActs are the activations one layer keeps for its backward pass.
type layerActs struct {
	x    []float32 // (N, d) residual stream entering the layer
	xn1  []float32 // (N, d) input_layernorm output
	r1   []float32 // (N) its 1/rms
	q    []float32 // (N, H*hd) after RoPE
	k, v []float32 // (N, KV*hd), k after RoPE
	p    []float32 // (B, H, T, T) attention probabilities, zero above the diagonal
	att  []float32 // (N, H*hd) attention output before o_proj
	x2   []float32 // (N, d) residual stream after attention
	xn2  []float32 // (N, d) post_attention_layernorm output
	r2   []float32 // (N)
	g, u []float32 // (N, F) gate and up projections
	h    []float32 // (N, F) silu(g) * u
	moe  *moeActs  // in place of g, u and h with experts
}

// acts are one micro-batch's activations.
type acts struct {
	B, T, N int
	pos     []int // (N) position of each row
	layers  []layerActs
	xL      []float32 // (N, d) residual stream after the last layer
	xf      []float32 // (N, d) final norm output
	rf      []float32 // (N)
	logits  []float32 // (N, V); the backward pass overwrites it with dlogits
	// With experts: the load-balancing loss and its gradient with respect
	// to each row's router probabilities, per expert (auxLoss).
	aux     float64
	auxGrad []float64
	counts  []float64 // (row, choice) pairs per expert, every layer
}

// CPUEngine is the reference engine: plain fp32 on the CPU, every op written
// out so that faster engines have something exact to be checked against.
type CPUEngine struct {
	cfg     Config
	threads int
	rope    *ropeTable

	p, g     *Params
	pv, gv   modelView
	opt      OptimizerState
	loss     float64
	aux      float64
	counts   []float64 // (row, choice) pairs per expert since ZeroGrad
	gradNorm float64

	a *acts // reused while the batch shape stays the same
}

// NewCPUEngine makes a CPU engine for c with zeroed parameters. o.Threads
// bounds the engine's own loops (attention, norms, loss, AdamW); the matrix
// products run on GOMAXPROCS threads. Results are the same bits for every
// thread count.
func NewCPUEngine(c Config, o Options) (*CPUEngine, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	threads := o.Threads
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	e := &CPUEngine{cfg: c, threads: threads, rope: newRopeTable(c.HeadDim, c.RopeTheta), counts: make([]float64, c.Experts)}
	e.p, e.g = NewParams(c), NewParams(c)
	e.pv, e.gv = viewModel(e.p), viewModel(e.g)
	n := len(e.p.Data)
	e.opt = OptimizerState{M: make([]float32, n), V: make([]float32, n)}
	return e, nil
}

func (e *CPUEngine) Name() string   { return "cpu" }
func (e *CPUEngine) Config() Config { return e.cfg }

func (e *CPUEngine) checkParams(p *Params) error {
	if len(p.Data) != len(e.p.Data) || p.Config.Layers != e.cfg.Layers || p.Config.TieEmbeddings != e.cfg.TieEmbeddings {
		return fmt.Errorf("parameters for another model: %d values, the engine's model has %d", len(p.Data), len(e.p.Data))
	}
	return nil
}

// SetParams copies p in and clears gradients and loss.
func (e *CPUEngine) SetParams(p *Params) error {
	if err := e.checkParams(p); err != nil {
		return err
	}
	copy(e.p.Data, p.Data)
	return e.ZeroGrad()
}

// Params copies the current parameters into p.
func (e *CPUEngine) Params(p *Params) error {
	if err := e.checkParams(p); err != nil {
		return err
	}
	copy(p.Data, e.p.Data)
	return nil
}

// SetOptimizerState copies s in.
func (e *CPUEngine) SetOptimizerState(s *OptimizerState) error {
	if len(s.M) != len(e.p.Data) || len(s.V) != len(e.p.Data) {
		return fmt.Errorf("optimizer state for another model: %d/%d moments, the model has %d parameters", len(s.M), len(s.V), len(e.p.Data))
	}
	e.opt.Step = s.Step
	copy(e.opt.M, s.M)
	copy(e.opt.V, s.V)
	return nil
}

// OptimizerState returns a copy of the AdamW state.
func (e *CPUEngine) OptimizerState() (*OptimizerState, error) {
	return &OptimizerState{Step: e.opt.Step, M: append([]float32(nil), e.opt.M...), V: append([]float32(nil), e.opt.V...)}, nil
}

// ZeroGrad clears gradients and the accumulated loss.
func (e *CPUEngine) ZeroGrad() error {
	clear(e.g.Data)
	e.loss, e.aux = 0, 0
	clear(e.counts)
	return nil
}

// Metrics returns the loss since ZeroGrad and the last gradient norm.
func (e *CPUEngine) Metrics() (StepMetrics, error) {
	return StepMetrics{Loss: e.loss, AuxLoss: e.aux, GradNorm: e.gradNorm, ExpertShare: Shares(e.counts)}, nil
}

// MetricsLater implements MetricsAhead: the CPU engine's step is complete
// when Step returns, so its metrics are taken at once, with the time: the
// caller waits for them only after it has computed the next step.
func (e *CPUEngine) MetricsLater() (func() (StepMetrics, error), error) {
	m, err := e.Metrics()
	m.At = time.Now()
	return func() (StepMetrics, error) { return m, err }, nil
}

// Grads copies the accumulated gradients into g.
func (e *CPUEngine) Grads(g *Params) error {
	if err := e.checkParams(g); err != nil {
		return err
	}
	copy(g.Data, e.g.Data)
	return nil
}

// Memory reports the engine's buffers: parameters, gradients, moments and
// the activations of the last batch shape.
func (e *CPUEngine) Memory() MemoryStats {
	n := int64(len(e.p.Data)) * 4 * 4
	if e.a != nil {
		n += e.a.bytes()
	}
	return MemoryStats{PeakAllocated: n, InUse: n}
}

// Close releases nothing: the CPU engine's memory belongs to the Go heap.
func (e *CPUEngine) Close() error {
	e.a = nil
	return nil
}

func (a *acts) bytes() int64 {
	n := len(a.xL) + len(a.xf) + len(a.rf) + len(a.logits)
	for _, l := range a.layers {
		n += len(l.x) + len(l.xn1) + len(l.r1) + len(l.q) + len(l.k) + len(l.v) + len(l.p) + len(l.att) +
			len(l.x2) + len(l.xn2) + len(l.r2) + len(l.g) + len(l.u) + len(l.h)
		if l.moe != nil {
			n += l.moe.floats()
		}
	}
	return int64(n) * 4
}

// checkBatch rejects a batch whose shape or ids the model cannot take,
// naming the first bad position.
func (e *CPUEngine) checkBatch(b Batch, needTargets bool) error {
	if b.B <= 0 || b.T <= 0 || len(b.Inputs) != b.B*b.T {
		return fmt.Errorf("batch of %d inputs does not match B=%d x T=%d", len(b.Inputs), b.B, b.T)
	}
	if needTargets && len(b.Targets) != b.B*b.T {
		return fmt.Errorf("batch of %d targets does not match B=%d x T=%d", len(b.Targets), b.B, b.T)
	}
	v := int32(e.cfg.VocabSize)
	for i, id := range b.Inputs {
		if id < 0 || id >= v {
			return fmt.Errorf("input token %d at position %d is outside the vocabulary [0, %d)", id, i, v)
		}
	}
	if needTargets {
		for i, id := range b.Targets {
			if id < -1 || id >= v {
				return fmt.Errorf("target token %d at position %d is outside the vocabulary [0, %d) (use -1 to ignore a position)", id, i, v)
			}
		}
	}
	return nil
}

func (e *CPUEngine) acts(B, T int) *acts {
	if e.a != nil && e.a.B == B && e.a.T == T {
		return e.a
	}
	c := e.cfg
	N, d, qd, kvd, F := B*T, c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.Intermediate
	a := &acts{B: B, T: T, N: N, pos: make([]int, N), layers: make([]layerActs, c.Layers)}
	for i := range a.pos {
		a.pos[i] = i % T
	}
	for l := range a.layers {
		a.layers[l] = layerActs{
			x: make([]float32, N*d), xn1: make([]float32, N*d), r1: make([]float32, N),
			q: make([]float32, N*qd), k: make([]float32, N*kvd), v: make([]float32, N*kvd),
			p: make([]float32, B*c.Heads*T*T), att: make([]float32, N*qd),
			x2: make([]float32, N*d), xn2: make([]float32, N*d), r2: make([]float32, N),
		}
		if c.MoE() {
			a.layers[l].moe = newMoEActs(c, N)
		} else {
			a.layers[l].g, a.layers[l].u, a.layers[l].h = make([]float32, N*F), make([]float32, N*F), make([]float32, N*F)
		}
	}
	a.xL, a.xf, a.rf = make([]float32, N*d), make([]float32, N*d), make([]float32, N)
	a.logits = make([]float32, N*c.VocabSize)
	e.rope.ensure(T)
	e.a = a
	return a
}

// forward runs the model over b and leaves every activation in e.a,
// ending with the logits.
func (e *CPUEngine) forward(b Batch) *acts {
	c := e.cfg
	a := e.acts(b.B, b.T)
	N, d, qd, kvd, F := a.N, c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.Intermediate
	x := a.layers[0].x
	for i, id := range b.Inputs {
		copy(x[i*d:(i+1)*d], e.pv.embed[int(id)*d:(int(id)+1)*d])
	}
	for l := range a.layers {
		la, w := &a.layers[l], e.pv.layers[l]
		e.rows(N, func(lo, hi int) {
			rmsNorm(la.xn1[lo*d:hi*d], la.r1[lo:hi], la.x[lo*d:hi*d], w.inNorm, hi-lo, d, c.RMSNormEps)
		})
		linear(e.threads, la.q, la.xn1, w.q, N, d, qd)
		linear(e.threads, la.k, la.xn1, w.k, N, d, kvd)
		linear(e.threads, la.v, la.xn1, w.v, N, d, kvd)
		e.rows(N, func(lo, hi int) {
			e.rope.rope(la.q[lo*qd:hi*qd], a.pos[lo:hi], c.Heads, c.HeadDim, false)
			e.rope.rope(la.k[lo*kvd:hi*kvd], a.pos[lo:hi], c.KVHeads, c.HeadDim, false)
		})
		e.attention(a, la)
		next := a.xL
		if l+1 < len(a.layers) {
			next = a.layers[l+1].x
		}
		linear(e.threads, la.x2, la.att, w.o, N, qd, d)
		e.rows(N, func(lo, hi int) {
			for i := lo * d; i < hi*d; i++ {
				la.x2[i] += la.x[i]
			}
			rmsNorm(la.xn2[lo*d:hi*d], la.r2[lo:hi], la.x2[lo*d:hi*d], w.postNorm, hi-lo, d, c.RMSNormEps)
		})
		if c.MoE() {
			e.moeForward(w, la.xn2, la.moe, next)
		} else {
			linear(e.threads, la.g, la.xn2, w.gate, N, d, F)
			linear(e.threads, la.u, la.xn2, w.up, N, d, F)
			e.rows(N, func(lo, hi int) { swiglu(la.h[lo*F:hi*F], la.g[lo*F:hi*F], la.u[lo*F:hi*F]) })
			linear(e.threads, next, la.h, w.down, N, F, d)
		}
		e.rows(N, func(lo, hi int) {
			for i := lo * d; i < hi*d; i++ {
				next[i] += la.x2[i]
			}
		})
	}
	e.rows(N, func(lo, hi int) {
		rmsNorm(a.xf[lo*d:hi*d], a.rf[lo:hi], a.xL[lo*d:hi*d], e.pv.norm, hi-lo, d, c.RMSNormEps)
	})
	linear(e.threads, a.logits, a.xf, e.pv.lmHead, N, d, c.VocabSize)
	if c.MoE() {
		a.aux, a.auxGrad, a.counts = auxLoss(c, a.layers, N)
	}
	return a
}

// rows splits n rows over the engine's threads.
func (e *CPUEngine) rows(n int, f func(lo, hi int)) { parallelFor(e.threads, n, f) }

// attention computes causal grouped-query attention for every (sequence,
// head) pair in parallel; query head h reads key/value head h/(H/KV). Each
// pair's scores and output are two matrix products (the scores' upper
// triangle computed and then zeroed, which at these sizes still beats
// row-by-row dot products several times over).
func (e *CPUEngine) attention(a *acts, la *layerActs) {
	c := e.cfg
	H, hd, T := c.Heads, c.HeadDim, a.T
	qd, kvd, group := H*hd, c.KVHeads*hd, H/c.KVHeads
	scale := float32(1 / math.Sqrt(float64(hd)))
	parallelFor(e.threads, a.B*H, func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			b, h := bh/H, bh%H
			q := la.q[b*T*qd+h*hd:]
			k, v := la.k[b*T*kvd+(h/group)*hd:], la.v[b*T*kvd+(h/group)*hd:]
			P := la.p[bh*T*T : (bh+1)*T*T]
			gemm.Sgemm(1, false, true, T, T, hd, q, qd, k, kvd, 0, P, T)
			for t := 0; t < T; t++ {
				row := P[t*T : (t+1)*T]
				for s := range row[:t+1] {
					row[s] *= scale
				}
				softmaxRow(row[:t+1])
				clear(row[t+1:])
			}
			gemm.Sgemm(1, false, false, T, hd, T, P, T, v, kvd, 0, la.att[b*T*qd+h*hd:], qd)
		}
	})
}

// attentionBack computes dq, dk, dv from datt. Work is split by (sequence,
// key/value head) so that the heads sharing a key/value head add their dk
// and dv contributions in a fixed order inside one goroutine. Per head:
// dV += Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP - rowsum(P ∘ dP)) x scale (zero
// above the diagonal, where P is), dQ = dS·K, dK += dSᵀ·Q.
func (e *CPUEngine) attentionBack(a *acts, la *layerActs, datt, dq, dk, dv []float32) {
	c := e.cfg
	H, KV, hd, T := c.Heads, c.KVHeads, c.HeadDim, a.T
	qd, kvd, group := H*hd, KV*hd, H/KV
	scale := float32(1 / math.Sqrt(float64(hd)))
	parallelFor(e.threads, a.B*KV, func(lo, hi int) {
		dS := make([]float32, T*T)
		for bk := lo; bk < hi; bk++ {
			b, kh := bk/KV, bk%KV
			for s := 0; s < T; s++ {
				clear(dk[(b*T+s)*kvd+kh*hd : (b*T+s)*kvd+(kh+1)*hd])
				clear(dv[(b*T+s)*kvd+kh*hd : (b*T+s)*kvd+(kh+1)*hd])
			}
			k, v := la.k[b*T*kvd+kh*hd:], la.v[b*T*kvd+kh*hd:]
			dkh, dvh := dk[b*T*kvd+kh*hd:], dv[b*T*kvd+kh*hd:]
			for h := kh * group; h < (kh+1)*group; h++ {
				bh := b*H + h
				P := la.p[bh*T*T : (bh+1)*T*T]
				dO, q := datt[b*T*qd+h*hd:], la.q[b*T*qd+h*hd:]
				gemm.Sgemm(1, true, false, T, hd, T, P, T, dO, qd, 1, dvh, kvd)
				gemm.Sgemm(1, false, true, T, T, hd, dO, qd, v, kvd, 0, dS, T)
				for t := 0; t < T; t++ {
					p, ds := P[t*T:t*T+t+1], dS[t*T:(t+1)*T]
					var sum float64
					for s, pv := range p {
						sum += float64(pv * ds[s])
					}
					fs := float32(sum)
					for s, pv := range p {
						ds[s] = pv * (ds[s] - fs) * scale
					}
					clear(ds[t+1:])
				}
				gemm.Sgemm(1, false, false, T, hd, T, dS, T, k, kvd, 0, dq[b*T*qd+h*hd:], qd)
				gemm.Sgemm(1, true, false, T, hd, T, dS, T, q, qd, 1, dkh, kvd)
			}
		}
	})
}

// lossAndGrad computes the mean cross-entropy over targets != -1 and, when
// grad is set, overwrites the logits with scale x its gradient. It returns
// the mean loss and the number of counted positions.
func (e *CPUEngine) lossAndGrad(a *acts, targets []int32, scale float32, grad bool) (float64, int, error) {
	V := e.cfg.VocabSize
	count := 0
	for _, t := range targets {
		if t >= 0 {
			count++
		}
	}
	if count == 0 {
		return 0, 0, fmt.Errorf("batch has no targets: every target is -1")
	}
	rowLoss := make([]float64, a.N)
	e.rows(a.N, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			z := a.logits[i*V : (i+1)*V]
			t := targets[i]
			if t < 0 {
				if grad {
					clear(z)
				}
				continue
			}
			m := float32(math.Inf(-1))
			for _, v := range z {
				m = max(m, v)
			}
			// One exponential a logit: kept in z when the gradient is
			// wanted, then scaled to softmax x k.
			var sum float64
			zt := z[t]
			if grad {
				sum = expSum(z, z, m)
			} else {
				for _, v := range z {
					sum += float64(exp32(v - m))
				}
			}
			lse := float64(m) + math.Log(sum)
			rowLoss[i] = lse - float64(zt)
			if grad {
				k := scale / float32(count)
				f := float32(float64(k) / sum)
				for j, v := range z {
					z[j] = v * f
				}
				z[t] -= k
			}
		}
	})
	var total float64
	for _, l := range rowLoss {
		total += l
	}
	return total / float64(count), count, nil
}

// ForwardBackward adds scale x the gradient of b's mean loss: the
// cross-entropy, plus router_aux_loss_coef x the load-balancing loss with
// experts (as MixtralForCausalLM's loss with output_router_logits).
func (e *CPUEngine) ForwardBackward(b Batch, scale float32) error {
	if err := e.checkBatch(b, true); err != nil {
		return err
	}
	a := e.forward(b)
	loss, _, err := e.lossAndGrad(a, b.Targets, scale, true)
	if err != nil {
		return err
	}
	e.loss += float64(scale) * (loss + e.cfg.RouterAuxCoef*a.aux)
	e.aux += float64(scale) * a.aux
	for x, n := range a.counts {
		e.counts[x] += n
	}
	e.backward(a, b, scale)
	return nil
}

// backward propagates the dlogits left in a.logits, and with experts the
// load-balancing loss at scale, into e.g.
func (e *CPUEngine) backward(a *acts, b Batch, scale float32) {
	c := e.cfg
	N, d, qd, kvd, F, V := a.N, c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim, c.Intermediate, c.VocabSize
	dlogits := a.logits
	linearBackW(e.threads, e.gv.lmHead, dlogits, a.xf, N, d, V)
	dxf := make([]float32, N*d)
	linearBackX(e.threads, dxf, dlogits, e.pv.lmHead, N, d, V, false)
	dx := make([]float32, N*d) // gradient of the residual stream
	// Norm weight gradients are summed over rows; per-range partial sums
	// would make the result depend on the thread count, so these stay serial.
	rmsNormBack(dx, e.gv.norm, dxf, a.xL, e.pv.norm, a.rf, N, d)

	var dh, dg, du []float32
	var ms *moeScratch
	var auxGrad []float32
	if c.MoE() {
		ms = newMoEScratch(c, N)
		auxGrad = make([]float32, c.Experts)
		for x, g := range a.auxGrad {
			auxGrad[x] = float32(float64(scale) * c.RouterAuxCoef * float64(c.Experts) * g)
		}
	} else {
		dh, dg, du = make([]float32, N*F), make([]float32, N*F), make([]float32, N*F)
	}
	dxn := make([]float32, N*d)
	datt := make([]float32, N*qd)
	dq := make([]float32, N*qd)
	dk := make([]float32, N*kvd)
	dv := make([]float32, N*kvd)
	for l := len(a.layers) - 1; l >= 0; l-- {
		la, w, gw := &a.layers[l], e.pv.layers[l], e.gv.layers[l]
		if c.MoE() {
			e.moeBack(w, gw, la.moe, la.xn2, dx, dxn, auxGrad, ms)
		} else {
			// MLP: next = x2 + down(silu(gate(xn2)) * up(xn2)).
			linearBackW(e.threads, gw.down, dx, la.h, N, F, d)
			linearBackX(e.threads, dh, dx, w.down, N, F, d, false)
			e.rows(N, func(lo, hi int) {
				swigluBack(dg[lo*F:hi*F], du[lo*F:hi*F], dh[lo*F:hi*F], la.g[lo*F:hi*F], la.u[lo*F:hi*F])
			})
			linearBackW(e.threads, gw.gate, dg, la.xn2, N, d, F)
			linearBackW(e.threads, gw.up, du, la.xn2, N, d, F)
			linearBackX(e.threads, dxn, dg, w.gate, N, d, F, false)
			linearBackX(e.threads, dxn, du, w.up, N, d, F, true)
		}
		rmsNormBack(dx, gw.postNorm, dxn, la.x2, w.postNorm, la.r2, N, d)
		// Attention: x2 = x + o(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))).
		linearBackW(e.threads, gw.o, dx, la.att, N, qd, d)
		linearBackX(e.threads, datt, dx, w.o, N, qd, d, false)
		e.attentionBack(a, la, datt, dq, dk, dv)
		e.rows(N, func(lo, hi int) {
			e.rope.rope(dq[lo*qd:hi*qd], a.pos[lo:hi], c.Heads, c.HeadDim, true)
			e.rope.rope(dk[lo*kvd:hi*kvd], a.pos[lo:hi], c.KVHeads, c.HeadDim, true)
		})
		linearBackW(e.threads, gw.q, dq, la.xn1, N, d, qd)
		linearBackW(e.threads, gw.k, dk, la.xn1, N, d, kvd)
		linearBackW(e.threads, gw.v, dv, la.xn1, N, d, kvd)
		linearBackX(e.threads, dxn, dq, w.q, N, d, qd, false)
		linearBackX(e.threads, dxn, dk, w.k, N, d, kvd, true)
		linearBackX(e.threads, dxn, dv, w.v, N, d, kvd, true)
		rmsNormBack(dx, gw.inNorm, dxn, la.x, w.inNorm, la.r1, N, d)
	}
	// Embedding rows are scattered by token id; a token repeated in the
	// batch adds its rows in position order.
	for i, id := range b.Inputs {
		axpy(1, dx[i*d:(i+1)*d], e.gv.embed[int(id)*d:(int(id)+1)*d])
	}
}

// Step clips the global gradient norm and applies one AdamW update with
// PyTorch's formula: p *= 1 - lr*wd (2-D and larger only);
// m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g*g;
// p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps).
func (e *CPUEngine) Step(o AdamW) error {
	g := e.g.Data
	// Fixed-size chunks summed in parallel, then added in chunk order: the
	// norm is the same for every thread count.
	const chunk = 1 << 14
	nChunks := (len(g) + chunk - 1) / chunk
	partial := make([]float64, nChunks)
	parallelFor(e.threads, nChunks, func(lo, hi int) {
		for ci := lo; ci < hi; ci++ {
			var s float64
			for _, v := range g[ci*chunk : min((ci+1)*chunk, len(g))] {
				s += float64(v) * float64(v)
			}
			partial[ci] = s
		}
	})
	var ss float64
	for _, s := range partial {
		ss += s
	}
	norm := math.Sqrt(ss)
	e.gradNorm = norm
	if math.IsNaN(norm) || math.IsInf(norm, 0) {
		return fmt.Errorf("gradient norm is %v: the step was skipped and the parameters are unchanged", norm)
	}
	coef := float32(1)
	if o.Clip > 0 {
		if c := o.Clip / (norm + 1e-6); c < 1 {
			coef = float32(c)
		}
	}
	e.opt.Step++
	t := float64(e.opt.Step)
	bc1 := 1 - math.Pow(o.Beta1, t)
	bc2 := 1 - math.Pow(o.Beta2, t)
	stepSize := float32(o.LR / bc1)
	bc2Sqrt := float32(math.Sqrt(bc2))
	w1, b2, w2, eps := float32(1-o.Beta1), float32(o.Beta2), float32(1-o.Beta2), float32(o.Eps)
	decay := float32(1 - o.LR*o.WeightDecay)
	off := 0
	for _, s := range e.p.Specs() {
		n := s.Elements()
		dec := float32(1)
		if len(s.Shape) >= 2 {
			dec = decay
		}
		base := off
		parallelFor(e.threads, n, func(lo, hi int) {
			p, gr := e.p.Data[base+lo:base+hi], g[base+lo:base+hi]
			m, v := e.opt.M[base+lo:base+hi], e.opt.V[base+lo:base+hi]
			for i := range p {
				gi := gr[i]
				if coef != 1 {
					gi *= coef
					gr[i] = gi
				}
				p[i] *= dec
				m[i] += w1 * (gi - m[i])
				v[i] = v[i]*b2 + w2*gi*gi
				denom := float32(math.Sqrt(float64(v[i])))/bc2Sqrt + eps
				p[i] += -stepSize * (m[i] / denom)
			}
		})
		off += n
	}
	return nil
}

// Logits runs the forward pass and returns a copy of the (B, T, V) logits.
func (e *CPUEngine) Logits(b Batch) ([]float32, error) {
	if err := e.checkBatch(b, false); err != nil {
		return nil, err
	}
	a := e.forward(b)
	return append([]float32(nil), a.logits...), nil
}

// EvalLoss returns b's mean cross-entropy without touching the gradients.
// The load-balancing loss of a model with experts is left out, so that
// held-out losses compare across dense and mixture-of-experts models.
func (e *CPUEngine) EvalLoss(b Batch) (float64, error) {
	if err := e.checkBatch(b, true); err != nil {
		return 0, err
	}
	a := e.forward(b)
	loss, _, err := e.lossAndGrad(a, b.Targets, 1, false)
	return loss, err
}

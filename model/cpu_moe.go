package model

// Mixtral's sparse mixture-of-experts block on the CPU engine. Each token's
// router logits go through a softmax over the experts; the top k
// probabilities, renormalised to sum to one, weight the outputs of the k
// SwiGLU experts the token is sent to. Rows are grouped by expert (tokens
// in order within each) so that every expert runs its three projections as
// plain GEMMs over its own rows, and every token sums its k outputs in
// ascending expert order, as transformers' index_add over the experts does.

// expertView is one expert's weights (or gradients): w1 the gate (F, d), w2
// the down projection (d, F), w3 the up projection (F, d).
type expertView struct{ w1, w2, w3 []float32 }

// moeActs are one layer's sparse-block activations over n rows.
type moeActs struct {
	n, k    int
	probs   []float32 // (n, E) router softmax
	sel     []int32   // (n, k) chosen experts, ascending
	wts     []float32 // (n, k) their renormalised weights
	row     []int32   // (n, k) each choice's row in the grouped buffers
	off     []int     // (E+1) first grouped row of each expert
	xg      []float32 // (n*k, d) the rows' inputs, grouped by expert
	g, u, h []float32 // (n*k, F) gate, up, silu(gate) * up
	y       []float32 // (n*k, d) expert outputs before weighting
}

func newMoEActs(c Config, n int) *moeActs {
	k, d, F, E := c.ExpertsPerTok, c.Hidden, c.Intermediate, c.Experts
	return &moeActs{
		n: n, k: k,
		probs: make([]float32, n*E), sel: make([]int32, n*k), wts: make([]float32, n*k), row: make([]int32, n*k),
		off: make([]int, E+1), xg: make([]float32, n*k*d),
		g: make([]float32, n*k*F), u: make([]float32, n*k*F), h: make([]float32, n*k*F), y: make([]float32, n*k*d),
	}
}

func (m *moeActs) floats() int {
	return len(m.probs) + 3*len(m.sel) + len(m.off) + len(m.xg) + len(m.g) + len(m.u) + len(m.h) + len(m.y)
}

// moeForward writes the sparse block's output for xn (n, d) into out (n, d)
// and keeps in m what the backward pass needs.
func (e *CPUEngine) moeForward(w layerView, xn []float32, m *moeActs, out []float32) {
	c := e.cfg
	n, k, d, F, E := m.n, m.k, c.Hidden, c.Intermediate, c.Experts
	linear(e.threads, m.probs, xn, w.router, n, d, E)
	e.rows(n, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			p := m.probs[t*E : (t+1)*E]
			softmaxRow(p)
			topK(p, m.sel[t*k:(t+1)*k], m.wts[t*k:(t+1)*k])
		}
	})
	// Group the rows by expert: counts, offsets, then each choice's row.
	clear(m.off)
	for _, x := range m.sel {
		m.off[x+1]++
	}
	for x := 0; x < E; x++ {
		m.off[x+1] += m.off[x]
	}
	next := append([]int(nil), m.off[:E]...)
	for i, x := range m.sel {
		m.row[i] = int32(next[x])
		next[x]++
	}
	e.rows(n, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			for s := 0; s < k; s++ {
				r := int(m.row[t*k+s])
				copy(m.xg[r*d:(r+1)*d], xn[t*d:(t+1)*d])
			}
		}
	})
	for x, ex := range w.experts {
		a, b := m.off[x], m.off[x+1]
		if a == b {
			continue
		}
		nx := b - a
		xg, g, u, h := m.xg[a*d:b*d], m.g[a*F:b*F], m.u[a*F:b*F], m.h[a*F:b*F]
		linear(e.threads, g, xg, ex.w1, nx, d, F)
		linear(e.threads, u, xg, ex.w3, nx, d, F)
		e.rows(nx, func(lo, hi int) { swiglu(h[lo*F:hi*F], g[lo*F:hi*F], u[lo*F:hi*F]) })
		linear(e.threads, m.y[a*d:b*d], h, ex.w2, nx, F, d)
	}
	e.rows(n, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			o := out[t*d : (t+1)*d]
			clear(o)
			for s := 0; s < k; s++ {
				r := int(m.row[t*k+s])
				axpy(m.wts[t*k+s], m.y[r*d:(r+1)*d], o)
			}
		}
	})
}

// topK picks the len(sel) largest probabilities of p (the lower expert on a
// tie), renormalises them to sum to one (the sum taken largest first, as
// over torch.topk's output) and stores them in ascending expert order.
func topK(p []float32, sel []int32, wts []float32) {
	k := len(sel)
	for s := 0; s < k; s++ {
		best := -1
		for x, v := range p {
			taken := false
			for _, y := range sel[:s] {
				if int(y) == x {
					taken = true
					break
				}
			}
			if !taken && (best < 0 || v > p[best]) {
				best = x
			}
		}
		sel[s] = int32(best)
		wts[s] = p[best]
	}
	var sum float32
	for _, v := range wts {
		sum += v
	}
	for s := range wts {
		wts[s] /= sum
	}
	for i := 1; i < k; i++ {
		for j := i; j > 0 && sel[j] < sel[j-1]; j-- {
			sel[j], sel[j-1] = sel[j-1], sel[j]
			wts[j], wts[j-1] = wts[j-1], wts[j]
		}
	}
}

// auxLoss is transformers' load_balancing_loss_func without an attention
// mask: the router rows of every layer taken together (L x N of them),
// f_e the share of (row, choice) pairs sent to expert e and P_e the mean
// router probability of e, aux = E x sum_e f_e x P_e. It returns aux and
// f_e / (L x N), the gradient of aux / E with respect to each row's
// probability of e (the choices themselves carry no gradient), and the
// (row, choice) pairs each expert received.
func auxLoss(c Config, layers []layerActs, n int) (float64, []float64, []float64) {
	E := c.Experts
	rows := float64(len(layers) * n)
	count, psum := make([]float64, E), make([]float64, E)
	for _, la := range layers {
		m := la.moe
		for x := 0; x < E; x++ {
			count[x] += float64(m.off[x+1] - m.off[x])
		}
		for t := 0; t < n; t++ {
			for x, v := range m.probs[t*E : (t+1)*E] {
				psum[x] += float64(v)
			}
		}
	}
	var aux float64
	grad := make([]float64, E)
	for x := 0; x < E; x++ {
		f := count[x] / rows
		aux += f * (psum[x] / rows)
		grad[x] = f / rows
	}
	return aux * float64(E), grad, count
}

// moeScratch is the sparse block's backward scratch, shared by the layers.
type moeScratch struct {
	dy, dxg    []float32 // (n*k, d)
	dh, dg, du []float32 // (n*k, F)
	dz         []float32 // (n, E)
}

func newMoEScratch(c Config, n int) *moeScratch {
	nk, d, F := n*c.ExpertsPerTok, c.Hidden, c.Intermediate
	return &moeScratch{
		dy: make([]float32, nk*d), dxg: make([]float32, nk*d),
		dh: make([]float32, nk*F), dg: make([]float32, nk*F), du: make([]float32, nk*F),
		dz: make([]float32, n*c.Experts),
	}
}

// moeBack takes dout, the gradient of the block's output (n, d), adds the
// weight gradients to gw and writes the gradient of its input xn into dxn.
// auxGrad (E) is the aux loss's gradient with respect to every row's router
// probability of each expert, already scaled by its coefficient.
func (e *CPUEngine) moeBack(w, gw layerView, m *moeActs, xn, dout, dxn []float32, auxGrad []float32, sc *moeScratch) {
	c := e.cfg
	n, k, d, F, E := m.n, m.k, c.Hidden, c.Intermediate, c.Experts
	dw := make([]float32, n*k)
	e.rows(n, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			g := dout[t*d : (t+1)*d]
			for s := 0; s < k; s++ {
				r := int(m.row[t*k+s])
				dw[t*k+s] = dot(g, m.y[r*d:(r+1)*d])
				dy := sc.dy[r*d : (r+1)*d]
				for j, v := range g {
					dy[j] = m.wts[t*k+s] * v
				}
			}
		}
	})
	for x := range w.experts {
		a, b := m.off[x], m.off[x+1]
		if a == b {
			continue
		}
		nx := b - a
		ex, gx := w.experts[x], gw.experts[x]
		dy, xg := sc.dy[a*d:b*d], m.xg[a*d:b*d]
		dh, dg, du := sc.dh[a*F:b*F], sc.dg[a*F:b*F], sc.du[a*F:b*F]
		linearBackW(e.threads, gx.w2, dy, m.h[a*F:b*F], nx, F, d)
		linearBackX(e.threads, dh, dy, ex.w2, nx, F, d, false)
		g, u := m.g[a*F:b*F], m.u[a*F:b*F]
		e.rows(nx, func(lo, hi int) {
			swigluBack(dg[lo*F:hi*F], du[lo*F:hi*F], dh[lo*F:hi*F], g[lo*F:hi*F], u[lo*F:hi*F])
		})
		linearBackW(e.threads, gx.w1, dg, xg, nx, d, F)
		linearBackW(e.threads, gx.w3, du, xg, nx, d, F)
		dxg := sc.dxg[a*d : b*d]
		linearBackX(e.threads, dxg, dg, ex.w1, nx, d, F, false)
		linearBackX(e.threads, dxg, du, ex.w3, nx, d, F, true)
	}
	e.rows(n, func(lo, hi int) {
		dp := make([]float32, E)
		for t := lo; t < hi; t++ {
			o := dxn[t*d : (t+1)*d]
			clear(o)
			for s := 0; s < k; s++ {
				r := int(m.row[t*k+s])
				axpy(1, sc.dxg[r*d:(r+1)*d], o)
			}
			// The weights are p_s / S over the chosen s, S their sum:
			// dp_s = (dw_s - sum_j dw_j w_j) / S.
			p := m.probs[t*E : (t+1)*E]
			sel, wts, dws := m.sel[t*k:(t+1)*k], m.wts[t*k:(t+1)*k], dw[t*k:(t+1)*k]
			var S, mean float32
			for s, x := range sel {
				S += p[x]
				mean += dws[s] * wts[s]
			}
			for x := range dp {
				dp[x] = auxGrad[x]
			}
			for s, x := range sel {
				dp[x] += (dws[s] - mean) / S
			}
			// Softmax: dz = p * (dp - sum_j p_j dp_j).
			var pdp float64
			for x, v := range p {
				pdp += float64(v * dp[x])
			}
			dz := sc.dz[t*E : (t+1)*E]
			for x, v := range p {
				dz[x] = v * (dp[x] - float32(pdp))
			}
		}
	})
	linearBackW(e.threads, gw.router, sc.dz, xn, n, d, E)
	linearBackX(e.threads, dxn, sc.dz, w.router, n, d, E, true)
}

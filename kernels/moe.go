package kernels

import (
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// Mixtral's sparse feed-forward on the device (moe.cu): the router, the
// grouping of the rows by expert and the expert GEMMs all read what the
// device wrote before them, so a layer's forward and backward pass never
// wait for the host and a step stays one recorded graph.

// Limits of moe.cu's kernels (MOE_MAXE, MOE_MAXK).
const (
	moeMaxExperts = 64
	moeMaxTopK    = 8
	// moeBlock is the assignments a block of the counting sort takes.
	moeBlock = 1024
)

// Spec offsets within a MoE layer: the router takes the dense gate's
// place, then each expert's w1 (gate), w2 (down), w3 (up).
const (
	sRouter  = sGate
	sExperts = sRouter + 1
)

// moeActs are the sparse block's buffers: per layer what the backward pass
// reads, then scratch shared by the layers.
type moeActs struct {
	probs []cuda.Ptr // L x (N, E) router softmax
	sel   []cuda.Ptr // L x (N, K) int32 chosen experts, ascending
	wts   []cuda.Ptr // L x (N, K) their renormalised weights
	rowOf []cuda.Ptr // L x (N, K) int32 each choice's grouped row
	tokOf []cuda.Ptr // L x (NK) int32 each grouped row's token
	off   []cuda.Ptr // L x (E+1) int32 each expert's first grouped row
	// fp32 precision: gate, up, silu(gate) x up and the expert outputs in
	// fp32. bf16: gate | up in one (NK, 2F) bf16 matrix as the dense
	// path's, h and y in bf16.
	g, u, h []cuda.Ptr // L x (NK, F)
	gub, hb []cuda.Ptr // L x (NK, 2F), L x (NK, F) bf16
	y       []cuda.Ptr // L x (NK, d), fp32 or bf16

	blockCnt, blockBase cuda.Ptr // (G, E) int32: the counting sort's per-block counts and first rows
	// The step's load-balancing tally over every layer: counts (int32)
	// and router probability sums per expert, the aux loss's gradient
	// per expert, and scale x aux since ZeroGrad (Metrics); shareAcc
	// sums countAcc over the micro-batches since ZeroGrad (fp32), for
	// Metrics' ExpertShare.
	countAcc, psumAcc, auxGrad, auxAcc, shareAcc cuda.Ptr

	dy     cuda.Ptr // (NK, d) fp32 or bf16: the expert outputs' gradient
	dh     cuda.Ptr // (NK, F) fp32 or bf16
	dg, du cuda.Ptr // (NK, F) fp32 (fp32 precision)
	dgub   cuda.Ptr // (NK, 2F) bf16 (bf16 precision)
	dxg    cuda.Ptr // (NK, d) fp32: the grouped rows' input gradient
	dz     cuda.Ptr // (N, E) fp32: the router logits' gradient
	dzb    cuda.Ptr // (N, E) bf16 copy (bf16 precision)
	// dwPart holds the fast weight-gradient kernel's partial sums
	// (moeMaxSplit, E, d x F) fp32; 0 where the fast kernels do not run.
	dwPart cuda.Ptr
}

// checkMoE refuses a mixture the kernels cannot run.
func checkMoE(c model.Config) error {
	if !c.MoE() {
		return nil
	}
	if c.Experts > moeMaxExperts || c.ExpertsPerTok > moeMaxTopK {
		return &model.EngineError{Msg: fmt.Sprintf("the CUDA engine takes at most %d experts and %d a token, the model has %d and %d: use --engine cpu",
			moeMaxExperts, moeMaxTopK, c.Experts, c.ExpertsPerTok)}
	}
	return nil
}

// moeGroups is the counting sort's blocks over NK assignments.
func moeGroups(NK int) int { return (NK + moeBlock - 1) / moeBlock }

// allocMoE allocates the sparse block's buffers for N rows.
func (e *Engine) allocMoE(N int) (*moeActs, error) {
	c := e.cfg
	L, E, K := c.Layers, int64(c.Experts), int64(c.ExpertsPerTok)
	n := int64(N)
	NK, d, F := n*K, int64(c.Hidden), int64(c.Intermediate)
	m := &moeActs{}
	set := &allocSet{mem: e.mem}
	one := set.one
	layer := func(what string, bytes int64) []cuda.Ptr { return set.layers(what, L, bytes) }
	const routing = "activations (experts' routing)"
	m.probs = layer(routing, n*E*4)
	m.sel, m.wts, m.rowOf = layer(routing, NK*4), layer(routing, NK*4), layer(routing, NK*4)
	m.tokOf, m.off = layer(routing, NK*4), layer(routing, (E+1)*4)
	G := int64(moeGroups(int(NK)))
	m.blockCnt, m.blockBase = one(routing, G*E*4), one(routing, G*E*4)
	m.countAcc, m.psumAcc, m.auxGrad, m.auxAcc = one("load-balancing tally", E*4), one("load-balancing tally", E*4), one("load-balancing tally", E*4), one("loss", 4)
	m.shareAcc = one("load-balancing tally", E*4)
	const acts, scratch = "activations (experts)", "gradient scratch (experts)"
	if e.bf16 {
		m.gub, m.hb, m.y = layer(acts, NK*2*F*2), layer(acts, NK*F*2), layer(acts, NK*d*2)
		m.dy, m.dh, m.dgub = one(scratch, NK*d*2), one(scratch, NK*F*2), one(scratch, NK*2*F*2)
		m.dzb = one(scratch, n*E*2)
	} else {
		m.g, m.u, m.h, m.y = layer(acts, NK*F*4), layer(acts, NK*F*4), layer(acts, NK*F*4), layer(acts, NK*d*4)
		m.dy, m.dh, m.dg, m.du = one(scratch, NK*d*4), one(scratch, NK*F*4), one(scratch, NK*F*4), one(scratch, NK*F*4)
	}
	m.dxg, m.dz = one(scratch, NK*d*4), one(scratch, n*E*4)
	if e.moeVec() {
		m.dwPart = one(scratch, moeMaxSplit*E*d*F*4)
	}
	return m, set.err
}

// expert returns the fp32 and bf16 address of expert 0's weight k (0 w1,
// 1 w2, 2 w3) in layer l, the gradient's, and the stride in values from
// one expert's to the next's.
func (e *Engine) expert(l, k int) (w operand, g cuda.Ptr, stride int64) {
	i := e.layerSpec(l, sExperts+k)
	return e.w(i), e.gw(i), 3 * int64(e.cfg.Intermediate) * int64(e.cfg.Hidden)
}

// moeVec says whether the bf16 expert GEMMs take the fast kernels, which
// copy 16-byte chunks: the model and expert widths must be multiples of 8
// (every row, column block and weight then starts 16-byte aligned). At
// small with 8 experts of d_ff 352, 32 x 1024 on an H200, the step went
// from 218k tok/s with the straightforward kernels to 943k with these
// (docs/benchmarks/cuda.md); the straightforward ones stay for other
// widths.
func (e *Engine) moeVec() bool {
	return e.bf16 && e.cfg.Hidden%8 == 0 && e.cfg.Intermediate%8 == 0 && !e.moeScalar
}

// moeVecRows is the fast kernels' output tile height (moe.cu VBM).
const moeVecRows = 128

// moeMaxSplit bounds how many parts the fast weight-gradient kernel splits
// an expert's rows into (the partial sums' scratch is that many gradients
// of every expert of a layer).
const moeMaxSplit = 4

// dwSplit is how many parts an expert's rows are split into for a weight
// gradient of `tiles` output tiles over all experts, NK grouped rows: up
// to about 8 blocks an SM, never parts of fewer than 256 rows on average
// (a part's fixed cost), at most moeMaxSplit. It depends on the shape
// alone, so a recorded step and an eager one split alike.
func (e *Engine) dwSplit(tiles, NK int) int {
	if e.moe.dwPart == 0 {
		return 1
	}
	s := (8*e.dv.SMs + tiles - 1) / tiles
	return max(1, min(s, moeMaxSplit, NK/(e.cfg.Experts*256)))
}

// gemmRows is the grouped GEMM over the experts' rows (moe.cu, rows form):
// C (NK x Ncols) = A[rows] (x K) times each expert's B, fp32 C (beta 0 or
// 1) or bf16 Cb. tok gathers A's rows by token.
func (e *Engine) gemmRows(l, NK, Ncols, K int, C, Cb cuda.Ptr, A operand, tok cuda.Ptr, B operand, strideB int64, lda, ldb, ldc int, bT bool, beta float32) error {
	return e.gemmRowsSplit(l, NK, Ncols, K, C, Cb, A, tok, B, strideB, lda, ldb, ldc, bT, beta, K, 0)
}

// gemmRowsSplit is gemmRows where B's rows from bsplit on are read bskip
// rows further on (the fast kernels only, with B read as (K, Ncols)).
func (e *Engine) gemmRowsSplit(l, NK, Ncols, K int, C, Cb cuda.Ptr, A operand, tok cuda.Ptr, B operand, strideB int64, lda, ldb, ldc int, bT bool, beta float32, bsplit, bskip int) error {
	if bskip != 0 && (bT || !e.moeVec()) {
		return fmt.Errorf("expert GEMM with B split at row %d: only the fast bf16 kernels read B that way", bsplit)
	}
	m := e.moe
	bt := 0
	if bT {
		bt = 1
	}
	grid := cuda.Dim3{X: blocks(int64(NK), 64) + e.cfg.Experts, Y: blocks(int64(Ncols), 64)}
	if e.moeVec() {
		grid.X = blocks(int64(NK), moeVecRows) + e.cfg.Experts
		name := "moe_gemm_rows_bf_nn"
		if bT {
			name = "moe_gemm_rows_bf_nt"
		}
		return e.launch3(name, grid, cuda.Dim3{X: 128}, C, Cb, A.bf, B.bf, tok, m.off[l], e.cfg.Experts, Ncols, K, lda, ldb, strideB, ldc, beta, bsplit, bskip)
	}
	if e.bf16 {
		return e.launch3("moe_gemm_rows_bf", grid, cuda.Dim3{X: 128}, C, Cb, A.bf, B.bf, tok, m.off[l], e.cfg.Experts, Ncols, K, lda, ldb, strideB, ldc, bt, beta)
	}
	return e.launch3("moe_gemm_rows_f32", grid, cuda.Dim3{X: 256}, C, Cb, A.f32, B.f32, tok, m.off[l], e.cfg.Experts, Ncols, K, lda, ldb, strideB, ldc, bt, beta)
}

// gemmDW adds each expert's A[rows]^T (M x its rows) times B[rows] (its
// rows x Ncols) to its weight gradient C + x strideC (moe.cu, dw form),
// over NK grouped rows in all.
func (e *Engine) gemmDW(l, NK, M, Ncols int, C cuda.Ptr, strideC int64, A operand, B operand, tok cuda.Ptr, lda, ldb int) error {
	grid := cuda.Dim3{X: blocks(int64(Ncols), 64), Y: blocks(int64(M), 64), Z: e.cfg.Experts}
	if e.moeVec() {
		grid.Y = blocks(int64(M), moeVecRows)
		E := e.cfg.Experts
		S := e.dwSplit(grid.X*grid.Y*E, NK)
		grid.Z = E * S
		if err := e.launch3("moe_gemm_dw_bf_v", grid, cuda.Dim3{X: 128}, C, e.moe.dwPart, A.bf, B.bf, tok, e.moe.off[l], M, Ncols, lda, ldb, strideC, E, S); err != nil {
			return err
		}
		if S == 1 {
			return nil
		}
		MN := int64(M) * int64(Ncols)
		return e.launch("moe_dw_reduce", blocks(int64(E)*MN, 256), 256, C, e.moe.dwPart, E, S, MN, strideC)
	}
	if e.bf16 {
		return e.launch3("moe_gemm_dw_bf", grid, cuda.Dim3{X: 128}, C, A.bf, B.bf, tok, e.moe.off[l], M, Ncols, lda, ldb, strideC)
	}
	return e.launch3("moe_gemm_dw_f32", grid, cuda.Dim3{X: 256}, C, A.f32, B.f32, tok, e.moe.off[l], M, Ncols, lda, ldb, strideC)
}

// moeStart clears the step's load-balancing tally before a forward pass.
func (e *Engine) moeStart() error {
	m := e.moe
	if err := e.zero(m.countAcc, int64(e.cfg.Experts)); err != nil {
		return err
	}
	return e.zero(m.psumAcc, int64(e.cfg.Experts))
}

// moeForward is layer l's sparse block over N rows: from the second norm's
// output (a.ln2 or a.ln2b) to the residual stream leaving the layer,
// a.resid[l+1] = a.mid[l] + the weighted expert outputs.
func (e *Engine) moeForward(l, N int) error {
	c, a, m := e.cfg, e.a, e.moe
	d, F, E, K := c.Hidden, c.Intermediate, c.Experts, c.ExpertsPerTok
	NK := N * K
	router := e.w(e.layerSpec(l, sRouter)).f32
	if err := e.launch("moe_route", blocks(int64(N), 8), 256, m.probs[l], m.sel[l], m.wts[l], a.ln2[l], at(a.ln2b, l), router, N, d, E, K); err != nil {
		return err
	}
	if err := e.launch("moe_probsum", E, 256, m.psumAcc, m.probs[l], N, E); err != nil {
		return err
	}
	G := moeGroups(NK)
	if err := e.launch("moe_count", G, moeBlock, m.blockCnt, m.sel[l], NK, E); err != nil {
		return err
	}
	if err := e.launch("moe_scan", 1, 64, m.off[l], m.blockBase, m.countAcc, m.blockCnt, G, E); err != nil {
		return err
	}
	if err := e.launch("moe_place", G, moeBlock, m.rowOf[l], m.tokOf[l], m.sel[l], m.blockBase, NK, K, E); err != nil {
		return err
	}
	w1, _, stride := e.expert(l, 0)
	w2, _, _ := e.expert(l, 1)
	w3, _, _ := e.expert(l, 2)
	x := actBF(a.ln2[l], at(a.ln2b, l))
	if e.bf16 {
		// gate | up, as the dense path's fused projection lays them out.
		if err := e.gemmRows(l, NK, F, d, 0, m.gub[l], x, m.tokOf[l], w1, stride, d, d, 2*F, true, 0); err != nil {
			return err
		}
		if err := e.gemmRows(l, NK, F, d, 0, bfAt(m.gub[l], F), x, m.tokOf[l], w3, stride, d, d, 2*F, true, 0); err != nil {
			return err
		}
		if err := e.launch3("swiglu_fwd_gu", e.swigluGrid(NK), cuda.Dim3{X: 256}, m.hb[l], m.gub[l], NK, F); err != nil {
			return err
		}
		if err := e.gemmRows(l, NK, d, F, 0, m.y[l], operand{bf: m.hb[l]}, 0, w2, stride, F, F, d, true, 0); err != nil {
			return err
		}
		return e.launch("moe_combine", e.moeElemBlocks(N), 256, a.resid[l+1], a.mid[l], cuda.Ptr(0), m.y[l], m.rowOf[l], m.wts[l], N, d, K)
	}
	if err := e.gemmRows(l, NK, F, d, m.g[l], 0, x, m.tokOf[l], w1, stride, d, d, F, true, 0); err != nil {
		return err
	}
	if err := e.gemmRows(l, NK, F, d, m.u[l], 0, x, m.tokOf[l], w3, stride, d, d, F, true, 0); err != nil {
		return err
	}
	n := int64(NK) * int64(F)
	if err := e.launch("swiglu_fwd", blocks(n, 256), 256, m.h[l], cuda.Ptr(0), m.g[l], m.u[l], n); err != nil {
		return err
	}
	if err := e.gemmRows(l, NK, d, F, m.y[l], 0, act(m.h[l]), 0, w2, stride, F, F, d, true, 0); err != nil {
		return err
	}
	return e.launch("moe_combine", e.moeElemBlocks(N), 256, a.resid[l+1], a.mid[l], m.y[l], cuda.Ptr(0), m.rowOf[l], m.wts[l], N, d, K)
}

// moeElemBlocks is the grid of moe_combine and moe_dx over N rows: a
// thread a value, or four where the width is a multiple of 4.
func (e *Engine) moeElemBlocks(N int) int {
	n := int64(N) * int64(e.cfg.Hidden)
	if e.cfg.Hidden%4 == 0 {
		n /= 4
	}
	return blocks(n, 256)
}

// moeAux adds the load-balancing loss of the forward pass just run over N
// rows to the loss (and auxAcc) and leaves its gradient for the backward
// pass, at the micro-batch's loss scale.
func (e *Engine) moeAux(N int) error {
	c, m := e.cfg, e.moe
	rows := float32(c.Layers * N)
	return e.launch("moe_aux", 1, 64, e.lossAcc, m.auxAcc, m.shareAcc, m.auxGrad, m.countAcc, m.psumAcc, e.scal+scalMoEScale*4, c.Experts, rows, float32(c.RouterAuxCoef))
}

// moeBackward takes the gradient of layer l's output (a.dresid) through
// the sparse block: the experts' and the router's weight gradients, and
// the gradient of the block's input into a.dln (a.dlnb where dlnBF) for
// the second norm's backward.
func (e *Engine) moeBackward(l, N int) error {
	c, a, m := e.cfg, e.a, e.moe
	d, F, E, K := c.Hidden, c.Intermediate, c.Experts, c.ExpertsPerTok
	NK := N * K
	yf, yb := m.y[l], cuda.Ptr(0)
	dyf, dyb := m.dy, cuda.Ptr(0)
	if e.bf16 {
		yf, yb, dyf, dyb = 0, m.y[l], 0, m.dy
	}
	if err := e.launch("moe_combine_bwd", blocks(int64(N), 8), 256, dyf, dyb, m.dz, m.dzb, a.dresid, yf, yb,
		m.rowOf[l], m.sel[l], m.wts[l], m.probs[l], m.auxGrad, N, d, E, K); err != nil {
		return err
	}
	w1, g1, stride := e.expert(l, 0)
	w2, g2, _ := e.expert(l, 1)
	w3, g3, _ := e.expert(l, 2)
	x := actBF(a.ln2[l], at(a.ln2b, l))
	dy := actBF(dyf, dyb)
	if e.bf16 {
		// dW2 += dy^T h; dh = dy W2; SwiGLU; dW1, dW3 += dg^T x, du^T x;
		// dxg = dg W1 + du W3.
		if err := e.gemmDW(l, NK, d, F, g2, stride, dy, operand{bf: m.hb[l]}, 0, d, F); err != nil {
			return err
		}
		if err := e.gemmRows(l, NK, F, d, 0, m.dh, dy, 0, w2, stride, d, F, F, false, 0); err != nil {
			return err
		}
		if err := e.launch3("swiglu_bwd_gu", e.swigluGrid(NK), cuda.Dim3{X: 256}, m.dgub, m.dh, m.gub[l], NK, F); err != nil {
			return err
		}
		dg, du := operand{bf: m.dgub}, operand{bf: bfAt(m.dgub, F)}
		if err := e.gemmDW(l, NK, F, d, g1, stride, dg, x, m.tokOf[l], 2*F, d); err != nil {
			return err
		}
		if err := e.gemmDW(l, NK, F, d, g3, stride, du, x, m.tokOf[l], 2*F, d); err != nil {
			return err
		}
		if e.moeVec() {
			// One product over K = 2F: [dg du] (NK, 2F) times [W1; W3],
			// W3's rows F on past W2's d x F values (F rows of d).
			if err := e.gemmRowsSplit(l, NK, d, 2*F, m.dxg, 0, dg, 0, w1, stride, 2*F, d, d, false, 0, F, F); err != nil {
				return err
			}
		} else {
			if err := e.gemmRows(l, NK, d, F, m.dxg, 0, dg, 0, w1, stride, 2*F, d, d, false, 0); err != nil {
				return err
			}
			if err := e.gemmRows(l, NK, d, F, m.dxg, 0, du, 0, w3, stride, 2*F, d, d, false, 1); err != nil {
				return err
			}
		}
	} else {
		if err := e.gemmDW(l, NK, d, F, g2, stride, dy, act(m.h[l]), 0, d, F); err != nil {
			return err
		}
		if err := e.gemmRows(l, NK, F, d, m.dh, 0, dy, 0, w2, stride, d, F, F, false, 0); err != nil {
			return err
		}
		n := int64(NK) * int64(F)
		if err := e.launch("swiglu_bwd", blocks(n, 256), 256, m.dg, m.du, cuda.Ptr(0), cuda.Ptr(0), m.dh, m.g[l], m.u[l], n); err != nil {
			return err
		}
		if err := e.gemmDW(l, NK, F, d, g1, stride, act(m.dg), x, m.tokOf[l], F, d); err != nil {
			return err
		}
		if err := e.gemmDW(l, NK, F, d, g3, stride, act(m.du), x, m.tokOf[l], F, d); err != nil {
			return err
		}
		if err := e.gemmRows(l, NK, d, F, m.dxg, 0, act(m.dg), 0, w1, stride, F, d, d, false, 0); err != nil {
			return err
		}
		if err := e.gemmRows(l, NK, d, F, m.dxg, 0, act(m.du), 0, w3, stride, F, d, d, false, 1); err != nil {
			return err
		}
	}
	// The router: dWr += dz^T x, then the block input's gradient.
	ri := e.layerSpec(l, sRouter)
	if err := e.gemm(true, false, E, d, N, actBF(m.dz, m.dzb), x, 1, e.gw(ri)); err != nil {
		return err
	}
	dln, dlnb := a.dln, cuda.Ptr(0)
	if e.dlnBF() {
		dln, dlnb = 0, a.dlnb
	}
	return e.launch("moe_dx", e.moeElemBlocks(N), 256, dln, dlnb, m.dxg, m.dz, e.w(ri).f32, m.rowOf[l], N, d, E, K)
}

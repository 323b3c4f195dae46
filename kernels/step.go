package kernels

import (
	"fmt"
	"math"
	"slices"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// checkBatch rejects a batch the engine cannot take, naming what to change.
func (e *Engine) checkBatch(b model.Batch, needTargets bool) (count int, err error) {
	return e.checkRows(b, needTargets, false)
}

// checkRows is checkBatch; with rowsOnly (generation, which keeps its own
// attention buffer) only B x T must fit the activation rows.
func (e *Engine) checkRows(b model.Batch, needTargets, rowsOnly bool) (count int, err error) {
	if b.B <= 0 || b.T <= 0 || len(b.Inputs) != b.B*b.T {
		return 0, fmt.Errorf("batch of %d inputs does not match B=%d x T=%d", len(b.Inputs), b.B, b.T)
	}
	if b.B*b.T > e.maxB*e.maxT || !rowsOnly && (b.B > e.maxB || b.T > e.maxT) {
		return 0, fmt.Errorf("batch B=%d x T=%d exceeds the engine's MaxBatch=%d x MaxSeq=%d it was sized for", b.B, b.T, e.maxB, e.maxT)
	}
	if needTargets && len(b.Targets) != b.B*b.T {
		return 0, fmt.Errorf("batch of %d targets does not match B=%d x T=%d", len(b.Targets), b.B, b.T)
	}
	v := int32(e.cfg.VocabSize)
	for i, id := range b.Inputs {
		if id < 0 || id >= v {
			return 0, fmt.Errorf("input token %d at position %d is outside the vocabulary [0, %d)", id, i, v)
		}
	}
	if needTargets {
		for i, id := range b.Targets {
			if id < -1 || id >= v {
				return 0, fmt.Errorf("target token %d at position %d is outside the vocabulary [0, %d) (use -1 to ignore a position)", id, i, v)
			}
			if id >= 0 {
				count++
			}
		}
		if count == 0 {
			return 0, fmt.Errorf("batch has no targets: every target is -1")
		}
	}
	return count, nil
}

// genState is generation's KV cache: the rotated keys and values of the
// positions seen so far, (capacity, KV*D) per layer, for one sequence.
type genState struct {
	k, v []cuda.Ptr
	att  cuda.Ptr // (H, Tq, capacity) probabilities of the current rows
	cap  int
	pos  int // positions filled
	// The current rows' fp32 queries, keys, values and attention output,
	// on an engine with flash attention, whose training buffers are bf16
	// (elsewhere the engine's own a.q, a.k, a.v and a.y serve).
	q, kr, vr, y cuda.Ptr
}

// forward runs the model over b (B x T rows, whose ids stageIDs has put in
// a.ids) up to the final norm, whose
// output (a.lnf, a.lnfb) lmHead takes chunk by chunk, and leaves every
// activation the backward pass needs. With g (B = 1) the rows continue the
// cached sequence at position g.pos, their keys and values join the cache,
// and only the last row's logits are computed, into e.a.logits.
func (e *Engine) forward(b model.Batch) error { return e.forwardGen(b, nil) }

func (e *Engine) forwardGen(b model.Batch, g *genState) error {
	c, a := e.cfg, e.a
	B, T, N := b.B, b.T, b.B*b.T
	d, H, KV, D, V := c.Hidden, c.Heads, c.KVHeads, c.HeadDim, c.VocabSize
	qd, kvd := H*D, KV*D
	if err := e.launch("embed_fwd", N, 128, a.resid[0], a.ids, e.w(0).f32, N, d); err != nil {
		return err
	}
	scale := float32(1 / math.Sqrt(float64(D)))
	pos0 := 0
	if g != nil {
		pos0 = g.pos
	}
	for l := 0; l < c.Layers; l++ {
		W := func(k int) operand { return e.w(e.layerSpec(l, k)) }
		ln1 := actBF(a.ln1[l], at(a.ln1b, l))
		q, k, v, yf := a.q[l], a.k[l], a.v[l], a.y[l]
		if g != nil && g.q != 0 {
			q, k, v, yf = g.q, g.kr, g.vr, g.y
		}
		// Generation's attention (attn_fwd) writes no bf16 copy of y.
		y := act(yf)
		if g == nil {
			y = actBF(yf, at(a.yb, l))
		}
		// Training's flash attention: one projection GEMM writes q, k and
		// v in bf16, rope rotates q and k there, the flash kernels read them.
		flash := g == nil && e.flash
		P := qd + 2*kvd
		var attention []func() error
		if flash {
			qkv := a.qkvb[l]
			attention = []func() error{
				// W(sQ)'s buffers run on through the key and value weights.
				func() error { return e.gemmBF(false, true, N, P, d, ln1, W(sQ), qkv) },
				func() error { return e.ropeBF16(qkv, N, T, H+KV, P) },
				func() error {
					return e.flashForward(cuda.Ptr(0), a.yb[l], a.lse[l], qkv, bfAt(qkv, qd), bfAt(qkv, qd+kvd), B, T, H, KV, scale, P, P)
				},
			}
		} else {
			attention = []func() error{
				func() error { return e.gemm(false, true, N, qd, d, ln1, W(sQ), 0, q) },
				func() error { return e.gemm(false, true, N, kvd, d, ln1, W(sK), 0, k) },
				func() error { return e.gemm(false, true, N, kvd, d, ln1, W(sV), 0, v) },
				func() error { return e.rope(q, 0, N, T, H, pos0, 1) },
				func() error { return e.rope(k, 0, N, T, KV, pos0, 1) },
				func() error {
					if g == nil {
						return e.launch3("attn_fwd", cuda.Dim3{X: T, Y: H, Z: B}, cuda.Dim3{X: 128},
							yf, a.att[l], q, k, v, T, T, H, KV, D, 0, scale)
					}
					off := cuda.Ptr(int64(pos0*kvd) * 4)
					if err := e.dv.Copy(g.k[l]+off, k, int64(N*kvd)*4); err != nil {
						return err
					}
					if err := e.dv.Copy(g.v[l]+off, v, int64(N*kvd)*4); err != nil {
						return err
					}
					return e.launch3("attn_fwd", cuda.Dim3{X: T, Y: H, Z: 1}, cuda.Dim3{X: 128},
						yf, g.att, q, g.k[l], g.v[l], T, g.cap, H, KV, D, pos0, scale)
				},
			}
		}
		steps := []func() error{
			func() error {
				return e.rmsnorm(a.ln1[l], at(a.ln1b, l), a.rstd1[l], a.resid[l], W(sLN1).f32, N)
			},
		}
		steps = append(steps, attention...)
		steps = append(steps,
			func() error { return e.gemmAdd(false, true, N, d, qd, y, W(sO), a.resid[l], a.mid[l]) },
			func() error {
				return e.rmsnorm(a.ln2[l], at(a.ln2b, l), a.rstd2[l], a.mid[l], W(sLN2).f32, N)
			},
		)
		if c.MoE() {
			steps = append(steps, func() error { return e.moeForward(l, N) })
		} else {
			steps = append(steps, e.denseForward(l, N)...)
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return fmt.Errorf("layer %d forward: %w", l, err)
			}
		}
	}
	L := c.Layers
	if g != nil {
		g.pos += N
		last := cuda.Ptr(int64((N-1)*d) * 4)
		if err := e.rmsnorm(a.lnf, a.lnfb, a.rstdf, a.resid[L]+last, e.w(e.normSpec()).f32, 1); err != nil {
			return err
		}
		return e.headGemm(false, false, true, 1, V, d, actBF(a.lnf, a.lnfb), e.w(e.headSpec()), 0, a.logits)
	}
	return e.rmsnorm(a.lnf, a.lnfb, a.rstdf, a.resid[L], e.w(e.normSpec()).f32, N)
}

// denseForward is layer l's SwiGLU feed-forward over N rows, from the
// second norm's output to the residual stream leaving the layer.
func (e *Engine) denseForward(l, N int) []func() error {
	a, d, F := e.a, e.cfg.Hidden, e.cfg.Intermediate
	W := func(k int) operand { return e.w(e.layerSpec(l, k)) }
	ln2, h := actBF(a.ln2[l], at(a.ln2b, l)), actBF(a.h[l], at(a.hb, l))
	return []func() error{
		func() error {
			if e.bf16 {
				// W(sGate)'s buffers run on through the up projection's.
				return e.gemmBF(false, true, N, 2*F, d, ln2, W(sGate), a.gub[l])
			}
			if err := e.gemm(false, true, N, F, d, ln2, W(sGate), 0, a.g[l]); err != nil {
				return err
			}
			return e.gemm(false, true, N, F, d, ln2, W(sUp), 0, a.u[l])
		},
		func() error {
			if e.bf16 {
				return e.launch3("swiglu_fwd_gu", e.swigluGrid(N), cuda.Dim3{X: 256}, a.hb[l], a.gub[l], N, F)
			}
			n := int64(N) * int64(F)
			return e.launch("swiglu_fwd", blocks(n, 256), 256, a.h[l], cuda.Ptr(0), a.g[l], a.u[l], n)
		},
		func() error { return e.gemmAdd(false, true, N, d, F, h, W(sDown), a.mid[l], a.resid[l+1]) },
	}
}

// flashHeadDim is the head dimension flash.cu is built for.
const flashHeadDim = 64

// flashTiles is the number of 64-row tiles covering T rows.
func flashTiles(T int) int { return (T + 63) / 64 }

// The Hopper flash kernels' (flash_sm90.cu) blocks: 64 query or key rows
// and 128 threads (one warpgroup), with the dynamic shared memory of
// FLASH_H_FWD_SMEM and FLASH_H_DQ_SMEM (= FLASH_H_DKV_SMEM): swizzled 8 KB
// tiles, and 1 KB to align them.
const (
	hopperTile      = 64 * 64 * 2
	hopperFwdShared = 5*hopperTile + 1024
	hopperBwdShared = 6*hopperTile + 1024
	// flash_bwd_h's: key and value tiles, two sets of queries and output
	// gradients, the dS tile and the fp32 dq product (two tiles' bytes).
	hopperFusedShared = 9*hopperTile + 1024
)

// flashForwardKernel names the flash attention forward the engine runs.
func (e *Engine) flashForwardKernel() string {
	switch {
	case e.flashTMA:
		return "flash_fwd_ht"
	case e.hopper:
		return "flash_fwd_h"
	case e.flashRows == 128:
		return "flash_fwd128"
	}
	return "flash_fwd"
}

// flashForward launches the flash attention forward the engine runs: out
// (fp32, when set), outb (bf16) and the base-2 log-sum-exp lse of the (B,
// T, H, 64) queries q against the keys k and values v, read with row
// strides ldq and ldkv. Every forward kernel runs 128 threads a block, over
// query tiles of 64 rows (flash_fwd, flash_fwd_h) or 128 (flash_fwd128).
func (e *Engine) flashForward(out, outb, lse, q, k, v cuda.Ptr, B, T, H, KV int, scale float32, ldq, ldkv int) error {
	tiles := flashTiles(T)
	if !e.hopper && e.flashRows == 128 {
		tiles = (tiles + 1) / 2 // two 64-row tiles a block
	}
	if e.flashPairs(tiles, H, B) {
		tiles = (tiles + 1) / 2
	}
	if e.flashTMA {
		return e.flashForwardTMA(tiles, out, outb, lse, q, k, v, B, T, H, KV, scale, ldq, ldkv)
	}
	return e.launch3(e.flashForwardKernel(), flashGrid(H, B, tiles), cuda.Dim3{X: 128},
		out, outb, lse, q, k, v, T, H, KV, scale, ldq, ldkv)
}

// flashForwardTMA launches flash_fwd_ht, whose tiles the tensor memory
// accelerator copies: q, k and v must be column blocks of one (B, T, ldq)
// bf16 matrix from q on (the fused projection's output), which one tensor
// map describes (flashQKVMap).
func (e *Engine) flashForwardTMA(tiles int, out, outb, lse, q, k, v cuda.Ptr, B, T, H, KV int, scale float32, ldq, ldkv int) error {
	qkv, kcol, vcol, err := e.flashQKVMap(q, k, v, B, T, ldq, ldkv)
	if err != nil {
		return err
	}
	return e.launch3(e.flashForwardKernel(), flashGrid(H, B, tiles), cuda.Dim3{X: 128},
		out, outb, lse, qkv, 0, kcol, vcol, T, H, KV, scale)
}

// flashQKVMap makes the tensor map of the fused projection q, k and v are
// column blocks of, and says where k's and v's columns start. A map is
// made on the host in a few microseconds, so each launch makes its own; a
// recorded graph keeps the maps it was launched with.
func (e *Engine) flashQKVMap(q, k, v cuda.Ptr, B, T, ldq, ldkv int) (*cuda.TensorMap, int, int, error) {
	if ldq != ldkv || k < q || v < q {
		return nil, 0, 0, fmt.Errorf("the TMA flash kernels read q, k and v as columns of one matrix: row strides %d and %d, q at %#x, k %#x, v %#x",
			ldq, ldkv, q, k, v)
	}
	m, err := e.flashMap(q, ldq, B, T)
	return m, int(k-q) / 2, int(v-q) / 2, err
}

// flashMap is the tensor map of a (B, T, cols) bf16 matrix at base, read in
// boxes of 64 columns by 64 rows in the 128-byte swizzle the flash tiles
// use; rows past T read as zeros.
func (e *Engine) flashMap(base cuda.Ptr, cols, B, T int) (*cuda.TensorMap, error) {
	m := &cuda.TensorMap{}
	c := uint64(cols)
	err := e.dv.D.EncodeTiled(m, cuda.TensorBF16, base, []uint64{c, uint64(T), uint64(B)}, []uint64{2 * c, 2 * c * uint64(T)},
		[]uint32{flashHeadDim, 64, 1}, cuda.Swizzle128B)
	return m, err
}

// flashGrid is the grid of flash.cu's and flash_sm90.cu's forward, dq and
// dk/dv kernels: heads along x, sequences along y, tiles along z, so that
// the blocks of every head's longest tiles start first and the grid ends on
// its shortest (flash.cuh). With the tiles along x, dk/dv's blocks of the
// first key tiles, which see every query, started throughout the grid, the
// last of them when the rest were done (docs/benchmarks/cuda.md).
func flashGrid(heads, B, tiles int) cuda.Dim3 { return cuda.Dim3{X: heads, Y: B, Z: tiles} }

// flashPairs says whether the Hopper forward and dq run a pair of query
// tiles a block (flash_sm90.cu's tile_pair): every block the same work, so
// that no long tile sets the time of a wave's tail. Measured on an H200
// (docs/benchmarks/cuda.md): the pilot's shape, whose blocks fit two
// waves, gained 3-4%, and small 32 x 1024 0.6-1.3%, so it is the default;
// KILN_CUDA_FLASH_PAIR=off runs a tile a block.
func (e *Engine) flashPairs(tiles, H, B int) bool {
	return e.hopper && tiles >= 2 && e.flashPair != "off"
}

// flashBwdShared is flash.cu's FLASH_BWD_SMEM: flash_bwd's dynamic shared
// memory, seven 64-row tiles of 72 bf16 values.
const flashBwdShared = 7 * 64 * 72 * 2

// chooseFlashKernels picks the flash attention kernels and gives those
// that take dynamic shared memory theirs. On a Hopper GPU running its
// native build the kernels of flash_sm90.cu (loaded only there) replace
// flash.cu's, unless KILN_CUDA_ATTENTION=flash-sm80; flash_bwd, when
// KILN_CUDA_FLASH_BWD=fused picks it, gets two blocks an SM where the SM
// has 130 KB (an H100 or A100), one on an RTX 3060.
func (e *Engine) chooseFlashKernels() error {
	e.shared = map[string]int{}
	if !e.flash {
		return nil
	}
	// The Hopper file is loaded only where its kernels may run (open).
	_, e.hopper = e.fns["flash_fwd_h"]
	// A driver older than CUDA 12 makes no tensor maps; the cp.async
	// kernels give the same bits (TestFlashMatchesStraightforward).
	e.flashTMA = e.flashTMA && e.hopper && e.dv.D.TensorMaps()
	want := map[string]int{}
	if e.hopper {
		want = map[string]int{"flash_fwd_h": hopperFwdShared, "flash_bwd_dq_h": hopperBwdShared, "flash_bwd_dkv_h": hopperBwdShared}
		if e.flashFused {
			want["flash_bwd_h"] = hopperFusedShared
		}
		if e.flashTMA {
			want["flash_fwd_ht"], want["flash_bwd_dq_ht"], want["flash_bwd_dkv_ht"] = hopperFwdShared, hopperBwdShared, hopperBwdShared
		}
	} else if e.flashFused {
		want["flash_bwd"] = flashBwdShared
	}
	for name, n := range want {
		if err := e.fns[name].AllowSharedMemory(n); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		e.shared[name] = n
	}
	return nil
}

// flashBackward leaves layer l's attention input gradients from a.dyb,
// recomputing the probabilities from the saved log-sum-exp, in bf16 in
// their columns of a.dqkvb: dq and dk rotated back by rope inside the
// kernels, dv as it is. flash_bwd does it in one pass over the (key tile,
// query tile) pairs, summing dq's products across its blocks in a.q, the
// queries' fp32 scratch that training with flash attention leaves unused
// (only generation's attention writes it), and flash_bwd_dq_final turns
// the sums into dq.
func (e *Engine) flashBackward(l, B, T int, scale float32) error {
	a, H, KV := e.a, e.cfg.Heads, e.cfg.KVHeads
	qd, kvd := H*flashHeadDim, KV*flashHeadDim
	P := qd + 2*kvd
	qkv := a.qkvb[l]
	q, k, v := qkv, bfAt(qkv, qd), bfAt(qkv, qd+kvd)
	if !e.flashFused {
		return e.flashBackwardSplit(cuda.Ptr(0), a.dqkvb, cuda.Ptr(0), bfAt(a.dqkvb, qd), cuda.Ptr(0), bfAt(a.dqkvb, qd+kvd), a.dvec,
			q, k, v, a.dyb, a.yb[l], a.lse[l], B, T, H, KV, scale, P)
	}
	return e.flashBackwardFused(cuda.Ptr(0), a.dqkvb, cuda.Ptr(0), bfAt(a.dqkvb, qd), cuda.Ptr(0), bfAt(a.dqkvb, qd+kvd), a.q[l], a.dqsem,
		a.dvec, q, k, v, a.dyb, a.yb[l], a.lse[l], B, T, H, KV, scale, P)
}

// flashBackwardFused runs the backward in one pass over the (key tile,
// query tile) pairs: flash_bwd_dvec, then flash_bwd (flash.cu) or
// flash_bwd_h (Hopper), which sum dq's products in dqacc (fp32, (B, H, T,
// 64)) in the order the semaphores sem (B H tiles int32, zeroed here) keep,
// then flash_bwd_dq_final, which turns the sums into dq: in bf16 into dqb,
// rotated back by rope, and in fp32 into dq where set. flash_bwd's grid
// has the key tiles fastest, flash_bwd_h's slowest: each the order its
// blocks wait in (flash.cu, flash_sm90.cu).
func (e *Engine) flashBackwardFused(dq, dqb, dk, dkb, dv, dvb, dqacc, sem, dvec, q, k, v, dy, y, lse cuda.Ptr, B, T, H, KV int, scale float32, P int) error {
	tiles := flashTiles(T)
	if err := e.launch("flash_bwd_dvec", (B*T*H+15)/16, 128, dvec, dy, y, T, H, B*T*H); err != nil {
		return err
	}
	if err := e.zero(sem, int64(B*H*tiles)); err != nil {
		return err
	}
	name, grid := "flash_bwd", cuda.Dim3{X: tiles, Y: KV, Z: B}
	if e.hopper {
		name, grid = "flash_bwd_h", flashGrid(KV, B, tiles)
	}
	if err := e.launch3(name, grid, cuda.Dim3{X: 128}, dk, dkb, dv, dvb, dqacc, sem,
		q, k, v, dy, lse, dvec, e.cosT, e.sinT, T, H, KV, scale, P, P, P); err != nil {
		return err
	}
	return e.launch3("flash_bwd_dq_final", cuda.Dim3{X: (T + 7) / 8, Y: H, Z: B}, cuda.Dim3{X: 128},
		dq, dqb, dqacc, e.cosT, e.sinT, T, H, scale, P)
}

// flashBackwardSplit runs the backward as two kernels that each own their
// outputs: dq (which writes dvec too), then dk and dv; flash_sm90.cu's on
// Hopper, flash.cu's elsewhere, with the same parameters. dq, dk and dv go
// out in fp32 (where set) and in bf16 (dqb and dkb rotated back by rope,
// and dvb; row stride P), from the queries, keys and values (row stride
// P), the output gradient dout and output out (packed bf16) and the
// forward's lse.
func (e *Engine) flashBackwardSplit(dq, dqb, dk, dkb, dv, dvb, dvec, q, k, v, dout, out, lse cuda.Ptr, B, T, H, KV int, scale float32, P int) error {
	dqKernel, dkvKernel := "flash_bwd_dq", "flash_bwd_dkv"
	if e.hopper {
		dqKernel, dkvKernel = "flash_bwd_dq_h", "flash_bwd_dkv_h"
	}
	tiles, dqTiles := flashTiles(T), flashTiles(T)
	if e.flashPairs(tiles, H, B) {
		dqTiles = (tiles + 1) / 2
	}
	if e.flashTMA {
		return e.flashBackwardTMA(tiles, dqTiles, dq, dqb, dk, dkb, dv, dvb, dvec, q, k, v, dout, out, lse, B, T, H, KV, scale, P)
	}
	if err := e.launch3(dqKernel, flashGrid(H, B, dqTiles), cuda.Dim3{X: 128},
		dq, dqb, dvec, q, k, v, dout, out, lse, e.cosT, e.sinT, T, H, KV, scale, P, P, P); err != nil {
		return err
	}
	return e.launch3(dkvKernel, flashGrid(KV, B, tiles), cuda.Dim3{X: 128},
		dk, dkb, dv, dvb, q, k, v, dout, lse, dvec, e.cosT, e.sinT, T, H, KV, scale, P, P, P)
}

// flashBackwardTMA is flashBackwardSplit with the Hopper kernels whose
// tiles the tensor memory accelerator copies (flash_bwd_dq_ht,
// flash_bwd_dkv_ht): q, k and v through one map of their fused
// projection, dout and out (B, T, H 64) through one map each.
func (e *Engine) flashBackwardTMA(tiles, dqTiles int, dq, dqb, dk, dkb, dv, dvb, dvec, q, k, v, dout, out, lse cuda.Ptr, B, T, H, KV int,
	scale float32, P int) error {
	qkv, kcol, vcol, err := e.flashQKVMap(q, k, v, B, T, P, P)
	if err != nil {
		return err
	}
	dy, err := e.flashMap(dout, H*flashHeadDim, B, T)
	if err != nil {
		return err
	}
	y, err := e.flashMap(out, H*flashHeadDim, B, T)
	if err != nil {
		return err
	}
	if err := e.launch3("flash_bwd_dq_ht", flashGrid(H, B, dqTiles), cuda.Dim3{X: 128},
		dq, dqb, dvec, qkv, dy, y, kcol, vcol, lse, e.cosT, e.sinT, T, H, KV, scale, P); err != nil {
		return err
	}
	return e.launch3("flash_bwd_dkv_ht", flashGrid(KV, B, tiles), cuda.Dim3{X: 128},
		dk, dkb, dv, dvb, qkv, dy, kcol, vcol, lse, dvec, e.cosT, e.sinT, T, H, KV, scale, P)
}

func threadsFor(d int) int {
	switch {
	case d >= 1024:
		return 512
	case d >= 256:
		return 256
	default:
		return 128
	}
}

// warpNorm says whether the model's width takes the warp-per-row RMSNorm
// kernels (a multiple of 128 up to 1024).
func (e *Engine) warpNorm() bool { d := e.cfg.Hidden; return d%128 == 0 && d <= 1024 }

// warpNormKernels are the warp-per-row RMSNorm kernels of one width: fwd,
// and the backward for bf16 output gradients with the residual stream's
// gradient in fp32 (bwd) or in bf16 alone (bwdB).
type warpNormKernels struct{ fwd, bwd, bwdB string }

// warpNormFor is width d's kernels: sized exactly for the presets' 512 and
// 768 (fewer registers, more blocks an SM), else the general ones.
func warpNormFor(d int) warpNormKernels {
	switch d {
	case 512:
		return warpNormKernels{"rmsnorm_fwd_warp4", "rmsnorm_bwd_warp_bf4", "rmsnorm_bwd_warp_bf4b"}
	case 768:
		return warpNormKernels{"rmsnorm_fwd_warp6", "rmsnorm_bwd_warp_bf6", "rmsnorm_bwd_warp_bf6b"}
	}
	return warpNormKernels{"rmsnorm_fwd_warp", "rmsnorm_bwd_warp_bf", "rmsnorm_bwd_warp_bfb"}
}

// normBackBF is the warp-per-row RMSNorm backward kernel for output
// gradients in bf16, for the model's width and where its residual stream's
// gradient is kept.
func (e *Engine) normBackBF() string {
	if e.dresidBF() {
		return warpNormFor(e.cfg.Hidden).bwdB
	}
	return warpNormFor(e.cfg.Hidden).bwd
}

// dresidBF says whether the backward keeps the residual stream's gradient
// in bf16 alone (a.dresidb), as the dense bf16 path with the norms' output
// gradients in bf16 does unless KILN_CUDA_DRESID=fp32: each norm's
// backward reads and rewrites it in bf16, 6 bytes an element less than
// fp32 with a bf16 copy, the GEMMs read it as before and the embedding's
// backward reads the bf16 (docs/decisions/residual-gradient.md).
func (e *Engine) dresidBF() bool {
	return !e.kopt.dresidFP32 && e.dlnBF() && !e.cfg.MoE()
}

// rmsnorm normalises N rows of x into out and/or outb, keeping 1/rms in
// rstd.
func (e *Engine) rmsnorm(out, outb, rstd, x, w cuda.Ptr, N int) error {
	d, eps := e.cfg.Hidden, float32(e.cfg.RMSNormEps)
	if e.warpNorm() {
		return e.launch(warpNormFor(d).fwd, blocks(int64(N), 8), 256, out, outb, rstd, x, w, N, d, eps)
	}
	return e.launch("rmsnorm_fwd", N, threadsFor(d), out, outb, rstd, x, w, N, d, eps)
}

// rope rotates x (N rows of heads x HeadDim fp32 values) in place (dir -1:
// the inverse) or, with xb set, writes the result to xb in bf16 and leaves
// x alone. A thread per rotated pair of a row, warp-rounded.
func (e *Engine) rope(x, xb cuda.Ptr, N, T, heads, pos0, dir int) error {
	threads := min(1024, (heads*e.cfg.HeadDim/2+31)/32*32)
	return e.launch("rope", N, threads, x, xb, e.cosT, e.sinT, N, T, heads, e.cfg.HeadDim, pos0, dir)
}

// ropeBF16 rotates the first heads x HeadDim columns of N bf16 rows, ld
// values apart, in place (training's forward rotation, at position 0): the
// query heads and the key heads after them. A thread takes eight pairs.
func (e *Engine) ropeBF16(x cuda.Ptr, N, T, heads, ld int) error {
	D := e.cfg.HeadDim
	if D%16 != 0 || ld%8 != 0 {
		return fmt.Errorf("rope_bf16: head dimension %d and row length %d must be multiples of 16 and 8", D, ld)
	}
	return e.launch("rope_bf16", blocks(int64(N)*int64(heads*D/16), 256), 256, x, e.cosT, e.sinT, N, T, heads, D, 0, ld)
}

// swigluGrid is the grid of swiglu_fwd_gu and swiglu_bwd_gu over N rows:
// flat over column octets when the width is a multiple of 8 and they fit
// 31 bits (the kernels' octets), over column quads when it is a multiple
// of 4, else a row of pairs per blockIdx.x (256 threads each way).
func (e *Engine) swigluGrid(N int) cuda.Dim3 {
	F := e.cfg.Intermediate
	if F%8 == 0 && int64(N)*int64(F/8) < 1<<31 {
		return cuda.Dim3{X: blocks(int64(N)*int64(F/8), 256)}
	}
	if F%4 == 0 {
		return cuda.Dim3{X: blocks(int64(N)*int64(F/4), 256)}
	}
	return cuda.Dim3{X: N, Y: blocks(int64(F), 512)}
}

// bfAt is p, a bf16 matrix, offset by cols values: a column block.
func bfAt(p cuda.Ptr, cols int) cuda.Ptr { return p + cuda.Ptr(2*cols) }

// at is ps[l], or 0 where the per-layer buffers do not exist (a bf16 copy
// in fp32 precision, or the attention output's without flash attention).
func at(ps []cuda.Ptr, l int) cuda.Ptr {
	if ps == nil {
		return 0
	}
	return ps[l]
}

// stageIDs puts ids in a.ids for forward.
func (e *Engine) stageIDs(ids []int32) error { return stage(e, e.a.ids, ids) }

// ForwardBackward implements model.Engine: the batch, its loss scale and
// its embedding gradient's plan go to the device first, then the
// micro-batch's work runs, recorded as a graph after its first call at
// this shape (graph.go).
func (e *Engine) ForwardBackward(b model.Batch, scale float32) error {
	count, err := e.checkBatch(b, true)
	if err != nil {
		return err
	}
	return e.th.do(func() error {
		if err := e.stageMicro(b, count, scale); err != nil {
			return err
		}
		return e.runMicro(b, nil)
	})
}

// stageMicro copies what a micro-batch's recorded work reads from device
// memory there, in stream order: its ids, targets and loss scale, and its
// embedding gradient's plan.
func (e *Engine) stageMicro(b model.Batch, count int, scale float32) error {
	if err := e.stageIDs(b.Inputs); err != nil {
		return err
	}
	if err := e.stageTargets(b, count, scale); err != nil {
		return err
	}
	used := embedPlan(b.Inputs, e.planCount, e.planHost)
	if err := stage(e, e.plan, e.planHost[:used]); err != nil {
		return err
	}
	if e.moe != nil {
		return stage(e, e.scal+scalMoEScale*4, []float32{scale})
	}
	return nil
}

// runMicro queues the forward and backward of a staged micro-batch of b's
// shape (its ids are not read again), recorded as a graph after its first
// call at this shape (graph.go). With red, the step's last on this GPU,
// the backward marks where each bucket of gradients is final, in a graph
// of its own, and the step's gradients and loss are then summed over the
// GPUs in buckets that wait for those marks (buckets.go).
func (e *Engine) runMicro(b model.Batch, red allReducer) error {
	body := func() error {
		if e.moe != nil {
			if err := e.moeStart(); err != nil {
				return err
			}
		}
		if err := e.forward(b); err != nil {
			return err
		}
		if e.moe != nil {
			if err := e.moeAux(b.B * b.T); err != nil {
				return err
			}
		}
		if err := e.lmHead(b, headTrain, e.lossAcc, nil); err != nil {
			return err
		}
		return e.backward(b)
	}
	if red == nil {
		return e.run(graphKey{b.B, b.T, false}, body)
	}
	e.summing = true
	err := e.run(graphKey{b.B, b.T, true}, body)
	e.summing = false
	if err != nil {
		return err
	}
	if err := e.sumBuckets(red); err != nil {
		return err
	}
	e.summed = true
	return nil
}

// normGrid is the blocks of a warp-per-row RMSNorm backward over N rows:
// one wave at two blocks an SM, each warp taking rows in turn, and no more
// blocks than 8-row groups.
func (e *Engine) normGrid(N int) int { return min(blocks(int64(N), 8), 2*e.dv.SMs) }

// normBackward runs an RMSNorm backward over N rows: dx (and its bf16 copy
// dxb) gets the input gradient added from dy, the output gradient (bf16
// for the _bf kernels), and each block's share of dw goes to a row of
// e.normPart of this norm's own, which normReduce adds to dw in a fixed
// order. kernel is a warp-per-row kernel, or "" for the block-per-row pair
// that takes any width (fp32 dy).
func (e *Engine) normBackward(kernel string, dx, dxb, dw, dy, x, w, rstd cuda.Ptr, N int) error {
	d := e.cfg.Hidden
	k := len(e.normDst)
	if k == e.normSlots {
		return fmt.Errorf("RMSNorm backward: %d norms' weight gradients are waiting for normReduce, the most there is room for", k)
	}
	G := e.normGrid(N)
	if kernel == "" {
		G = min(N, 256)
	}
	if len(e.normDst) > 0 && G != e.normG {
		return fmt.Errorf("RMSNorm backward: %d blocks' shares, where the waiting norms have %d", G, e.normG)
	}
	part := e.normPart + cuda.Ptr(int64(k)*e.normStride()*4)
	e.normDst, e.normG = append(e.normDst, uint64(dw)), G
	if kernel != "" {
		return e.launch(kernel, G, 256, dx, dxb, part, dy, x, w, rstd, N, d)
	}
	if err := e.launch("rmsnorm_bwd_dx", N, threadsFor(d), dx, dxb, dy, x, w, rstd, N, d); err != nil {
		return err
	}
	return e.launch3("rmsnorm_bwd_dw", cuda.Dim3{X: blocks(int64(d), 256), Y: G}, cuda.Dim3{X: 256}, part, dy, x, rstd, N, d)
}

// normStride is the floats of e.normPart a norm's shares take.
func (e *Engine) normStride() int64 { return int64(max(2*e.dv.SMs, 256)) * int64(e.cfg.Hidden) }

// normReduce adds the waiting norms' shares (those of the backward's norms
// since its last call: once a backward, or once a bucket where buckets.go
// sums the gradients during it) to their weight gradients, in one launch.
// The gradients' addresses reach it through a table in device memory,
// written when they change: never inside a graph capture, since a
// backward's norms and their gradients are the same at every step.
func (e *Engine) normReduce() error {
	from := e.normDone
	n := len(e.normDst) - from
	if n == 0 {
		return nil
	}
	if len(e.normTable) < len(e.normDst) || !slices.Equal(e.normDst, e.normTable[:len(e.normDst)]) {
		if e.capturing {
			return fmt.Errorf("RMSNorm backward: the weight gradients' table changed inside a graph capture")
		}
		if err := cuda.Upload(e.dv, e.normTab, e.normDst); err != nil {
			return err
		}
		e.normTable = slices.Clone(e.normDst)
	}
	e.normDone = len(e.normDst)
	return e.launch3("rmsnorm_dw_reduce", cuda.Dim3{X: blocks(int64(e.cfg.Hidden), 32), Y: n}, cuda.Dim3{X: 1024},
		e.normTab+cuda.Ptr(from*8), e.normPart+cuda.Ptr(int64(from)*e.normStride()*4), e.normG, e.cfg.Hidden, e.normStride())
}

// backward adds the gradient of the loss from the final norm's output
// gradient, which lmHead left in e.a.dln (e.a.dlnb where dlnBF), down to
// the embedding.
func (e *Engine) backward(b model.Batch) error {
	c, a := e.cfg, e.a
	B, T, N := b.B, b.T, b.B*b.T
	d, H, KV, D := c.Hidden, c.Heads, c.KVHeads, c.HeadDim
	qd, kvd := H*D, KV*D
	L := c.Layers
	scale := float32(1 / math.Sqrt(float64(D)))
	normBack := func(x, w, rstd cuda.Ptr, dw cuda.Ptr) error {
		kernel, dy := "", a.dln
		if e.warpNorm() {
			kernel = "rmsnorm_bwd_warp"
			if e.dlnBF() {
				kernel, dy = e.normBackBF(), a.dlnb
			}
		}
		if err := e.beforeWrite(readsDresid); err != nil {
			return err
		}
		if e.dresidBF() {
			return e.normBackward(kernel, a.dresidb, 0, dw, dy, x, w, rstd, N)
		}
		return e.normBackward(kernel, a.dresid, a.dresidb, dw, dy, x, w, rstd, N)
	}
	e.normDst, e.normDone = e.normDst[:0], 0
	if e.dresidBF() {
		// N x d bf16 values are N x d / 2 words (d is even: a warp norm's).
		if err := e.zero(a.dresidb, int64(N*d/2)); err != nil {
			return err
		}
	} else if err := e.zero(a.dresid, int64(N*d)); err != nil {
		return err
	}
	if err := normBack(a.resid[L], e.w(e.normSpec()).f32, a.rstdf, e.gw(e.normSpec())); err != nil {
		return err
	}
	for l := L - 1; l >= 0; l-- {
		W := func(k int) operand { return e.w(e.layerSpec(l, k)) }
		G := func(k int) cuda.Ptr { return e.gw(e.layerSpec(l, k)) }
		ln1 := actBF(a.ln1[l], at(a.ln1b, l))
		y, dresid := actBF(a.y[l], at(a.yb, l)), actBF(a.dresid, a.dresidb)
		P := qd + 2*kvd
		var attention []func() error
		if e.flash {
			// q, k and v's gradients in one bf16 matrix, as their weights
			// and gradients are consecutive in the flat buffers.
			dqkv := operand{bf: a.dqkvb}
			attention = []func() error{
				func() error {
					if err := e.beforeWrite(readsDqkv); err != nil {
						return err
					}
					return e.flashBackward(l, B, T, scale)
				},
				func() error {
					return e.onSide(readsDqkv, func() error { return e.gemm(true, false, P, d, N, dqkv, ln1, 1, G(sQ)) })
				},
				func() error { return e.dlnGemm(0, N, P, dqkv, W(sQ)) },
			}
		} else {
			dq, dk, dv := actBF(a.dq, a.dqb), actBF(a.dk, a.dkb), act(a.dv)
			attention = []func() error{
				func() error {
					if err := e.launch3("attn_bwd_q", cuda.Dim3{X: T, Y: H, Z: B}, cuda.Dim3{X: 128},
						a.dq, a.ds, a.dy, a.att[l], a.k[l], a.v[l], T, T, H, KV, D, scale); err != nil {
						return err
					}
					return e.launch3("attn_bwd_kv", cuda.Dim3{X: T, Y: KV, Z: B}, cuda.Dim3{X: min(D, 256)},
						a.dk, a.dv, a.ds, a.att[l], a.q[l], a.dy, T, T, H, KV, D, scale)
				},
				func() error { return e.rope(a.dq, a.dqb, N, T, H, 0, -1) },
				func() error { return e.rope(a.dk, a.dkb, N, T, KV, 0, -1) },
				func() error { return e.gemm(true, false, qd, d, N, dq, ln1, 1, G(sQ)) },
				func() error { return e.gemm(true, false, kvd, d, N, dk, ln1, 1, G(sK)) },
				func() error { return e.gemm(true, false, kvd, d, N, dv, ln1, 1, G(sV)) },
				func() error { return e.gemm(false, false, N, d, qd, dq, W(sQ), 0, a.dln) },
				func() error { return e.gemm(false, false, N, d, kvd, dk, W(sK), 1, a.dln) },
				func() error { return e.gemm(false, false, N, d, kvd, dv, W(sV), 1, a.dln) },
			}
		}
		var steps []func() error
		if c.MoE() {
			steps = append(steps, func() error { return e.moeBackward(l, N) })
		} else {
			steps = append(steps, e.denseBackward(l, N)...)
		}
		steps = append(steps,
			func() error { return normBack(a.mid[l], W(sLN2).f32, a.rstd2[l], G(sLN2)) },
			// Attention: a.dresid is now the gradient of mid = resid[l] + y Wo^T.
			func() error {
				return e.onSide(readsDresid, func() error { return e.gemm(true, false, d, qd, N, dresid, y, 1, G(sO)) })
			},
			func() error {
				if e.flash {
					return e.gemmBF(false, false, N, qd, d, dresid, W(sO), a.dyb)
				}
				return e.gemm(false, false, N, qd, d, dresid, W(sO), 0, a.dy)
			},
		)
		steps = append(steps, attention...)
		steps = append(steps, func() error { return normBack(a.resid[l], W(sLN1).f32, a.rstd1[l], G(sLN1)) })
		for _, s := range steps {
			if err := s(); err != nil {
				return fmt.Errorf("layer %d backward: %w", l, err)
			}
		}
		if err := e.bucketAfter(l); err != nil {
			return fmt.Errorf("layer %d backward: %w", l, err)
		}
	}
	if err := e.normReduce(); err != nil {
		return err
	}
	// The tied head's weight gradient (the side stream's) is added to
	// first, as without the side stream.
	if err := e.joinSide(); err != nil {
		return err
	}
	// In the order ForwardBackward's plan gives: a block per item, then a
	// block per token too frequent for one item.
	var err error
	if e.dresidBF() {
		err = e.launch("embed_bwd_items_bf", N, 128, e.gw(0), e.embPart, e.plan, a.dresidb, N, d)
	} else {
		err = e.launch("embed_bwd_items", N, 128, e.gw(0), e.embPart, e.plan, a.dresid, N, d)
	}
	if err != nil {
		return err
	}
	return e.launch("embed_bwd_sum", embedLongMax(N), 128, e.gw(0), e.embPart, e.plan, d)
}

// denseBackward takes the gradient of layer l's output (a.dresid) through
// its SwiGLU feed-forward: the three weight gradients, and the gradient of
// its input into a.dln (a.dlnb where dlnBF) for the second norm's backward.
func (e *Engine) denseBackward(l, N int) []func() error {
	a, d, F := e.a, e.cfg.Hidden, e.cfg.Intermediate
	W := func(k int) operand { return e.w(e.layerSpec(l, k)) }
	G := func(k int) cuda.Ptr { return e.gw(e.layerSpec(l, k)) }
	ln2, h, dresid := actBF(a.ln2[l], at(a.ln2b, l)), actBF(a.h[l], at(a.hb, l)), actBF(a.dresid, a.dresidb)
	return []func() error{
		// MLP: a.dresid is the gradient of resid[l+1] = mid + h Wdown^T.
		func() error {
			return e.onSide(readsDresid, func() error { return e.gemm(true, false, d, F, N, dresid, h, 1, G(sDown)) })
		},
		func() error {
			if e.bf16 {
				return e.gemmBF(false, false, N, F, d, dresid, W(sDown), a.dhb)
			}
			return e.gemm(false, false, N, F, d, dresid, W(sDown), 0, a.dh)
		},
		func() error {
			if e.bf16 {
				if err := e.beforeWrite(readsDgub); err != nil {
					return err
				}
				return e.launch3("swiglu_bwd_gu", e.swigluGrid(N), cuda.Dim3{X: 256}, a.dgub, a.dhb, a.gub[l], N, F)
			}
			n := int64(N) * int64(F)
			return e.launch("swiglu_bwd", blocks(n, 256), 256, a.dg, a.du, cuda.Ptr(0), cuda.Ptr(0), a.dh, a.g[l], a.u[l], n)
		},
		func() error {
			if e.bf16 {
				// The gate's and the up projection's gradients, stacked
				// as their weights are.
				dgu := operand{bf: a.dgub}
				if err := e.onSide(readsDgub, func() error { return e.gemm(true, false, 2*F, d, N, dgu, ln2, 1, G(sGate)) }); err != nil {
					return err
				}
				return e.dlnGemm(0, N, 2*F, dgu, W(sGate))
			}
			dg, du := act(a.dg), act(a.du)
			for _, g := range []func() error{
				func() error { return e.gemm(true, false, F, d, N, dg, ln2, 1, G(sGate)) },
				func() error { return e.gemm(true, false, F, d, N, du, ln2, 1, G(sUp)) },
				func() error { return e.gemm(false, false, N, d, F, dg, W(sGate), 0, a.dln) },
				func() error { return e.gemm(false, false, N, d, F, du, W(sUp), 1, a.dln) },
			} {
				if err := g(); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

// Step implements model.Engine: the global norm and AdamW run on the
// device, and nothing waits for it. The step's hyperparameters and bias
// corrections go to the device first, then its work runs, recorded as a
// graph after the first call (graph.go).
func (e *Engine) Step(o model.AdamW) error {
	return e.th.do(func() error {
		// The step rewrites the weights and moments a checkpoint may still
		// be copying out.
		if err := e.beforeStateWrite(); err != nil {
			return err
		}
		e.optStep++
		t := float64(e.optStep)
		hp := []float32{float32(o.Beta1), float32(o.Beta2), float32(o.Eps), float32(1 - o.LR*o.WeightDecay), float32(o.Clip),
			float32(o.LR / (1 - math.Pow(o.Beta1, t))), float32(math.Sqrt(1 - math.Pow(o.Beta2, t)))}
		if err := stage(e, e.scal+scalAdamW*4, hp); err != nil {
			return err
		}
		return e.run(stepGraph, func() error {
			if err := e.launch("sumsq_partial", normBlocks, 256, e.partial, e.grads, e.n); err != nil {
				return err
			}
			if err := e.launch("sumsq_final", 1, 1024, e.norm, e.partial, normBlocks); err != nil {
				return err
			}
			// One launch over every parameter, four a thread, writing the
			// GEMMs' bf16 copy as it goes (e.wbf is 0 in fp32 precision).
			return e.launch("adamw_flat", blocks((e.n+3)/4, 256), 256, e.params, e.m, e.v, e.grads, e.wbf, e.norm, e.n, e.nodecay, e.nranges,
				e.scal+scalAdamW*4)
		})
	})
}

// Logits implements model.Engine.
func (e *Engine) Logits(b model.Batch) ([]float32, error) {
	if _, err := e.checkBatch(b, false); err != nil {
		return nil, err
	}
	out := make([]float32, b.B*b.T*e.cfg.VocabSize)
	err := e.th.do(func() error {
		if err := e.stageIDs(b.Inputs); err != nil {
			return err
		}
		if err := e.forward(b); err != nil {
			return err
		}
		return e.lmHead(b, headLogits, 0, out)
	})
	return out, err
}

// EvalLoss implements model.Engine.
func (e *Engine) EvalLoss(b model.Batch) (float64, error) {
	count, err := e.checkBatch(b, true)
	if err != nil {
		return 0, err
	}
	v := make([]float32, 1)
	err = e.th.do(func() error {
		if err := e.stageIDs(b.Inputs); err != nil {
			return err
		}
		if err := e.stageTargets(b, count, 1); err != nil {
			return err
		}
		if err := e.forward(b); err != nil {
			return err
		}
		if err := e.zero(e.evalAcc, 1); err != nil {
			return err
		}
		if err := e.lmHead(b, headLoss, e.evalAcc, nil); err != nil {
			return err
		}
		return cuda.Download(e.dv, v, e.evalAcc)
	})
	return float64(v[0]), err
}

package kernels

import (
	"fmt"

	"github.com/kiln-lm/kiln/kernels/cuda"
	"github.com/kiln-lm/kiln/model"
)

// The LM head and its loss run over chunks of at most headRows rows, so
// that the (N, V) logits never exist at once: at small's B 32 x T 1024 and
// V 16384 they took 2 GiB in fp32 and their bf16 gradient 1 GiB more. Per
// chunk the forward GEMM, the loss kernel and the head's two backward GEMMs
// run back to back; every row goes through the same kernels as it would in
// one chunk, so only the order in which the head's weight gradient sums
// its rows changes (beta 1 across chunks). model.HeadChunkRows sizes the
// chunks, for the engine and the memory estimate alike.

// xentKernelFor names the loss kernel for rows of V logits, bf16 where bf:
// bf16 rows of a multiple of 8 values that fit in the registers of a block
// of 256 threads (8 or 16 groups of eight values a thread) are held there
// and read from memory once (xent_fwd_bwd_r8, _r16); any other row takes
// xent_fwd_bwd, which reads it twice. The kernels give the same bits.
func xentKernelFor(V int, bf bool) string {
	if bf && V%8 == 0 {
		switch groups := (V/8 + 255) / 256; {
		case groups <= 8:
			return "xent_fwd_bwd_r8"
		case groups <= 16:
			return "xent_fwd_bwd_r16"
		}
	}
	return "xent_fwd_bwd"
}

// headMode says how the LM head's three GEMMs run in bf16 precision.
type headMode struct {
	// f32Fwd, f32Bwd: the forward or backward GEMMs in full fp32, a
	// diagnostic of what rounding the head costs.
	f32Fwd, f32Bwd bool
	// tf32: all three on fp32 operands with TF32 tensor cores. TF32 keeps
	// 10 mantissa bits to bf16's 7, at a fraction of fp32's cost: the
	// candidate against the bf16 head's loss bias (docs/benchmarks/cuda.md).
	tf32 bool
}

// fp32Grad reports whether the head's backward runs on fp32 operands and so
// reads an fp32 logit gradient, which then overwrites the chunk's fp32
// logits; otherwise the gradient is bf16 (over the bf16 logits, or in its
// own buffer behind an fp32 forward).
func (m headMode) fp32Grad() bool { return m.f32Bwd || m.tf32 }

// parseHeadMode reads KILN_CUDA_HEAD.
func parseHeadMode(v string) (headMode, error) {
	switch v {
	case "":
		return headMode{}, nil
	case "fp32":
		return headMode{f32Fwd: true, f32Bwd: true}, nil
	case "fp32-forward":
		return headMode{f32Fwd: true}, nil
	case "fp32-backward":
		return headMode{f32Bwd: true}, nil
	case "tf32":
		return headMode{tf32: true}, nil
	}
	return headMode{}, &envError{fmt.Sprintf("KILN_CUDA_HEAD=%q is not an LM head precision: set fp32, fp32-forward, fp32-backward or tf32, or unset it for the bf16 head", v)}
}

// envError is a mistyped environment setting: the user's to fix.
type envError struct{ msg string }

func (e *envError) Error() string { return e.msg }

// BadInput marks the error as the user's input (exit code 2).
func (e *envError) BadInput() bool { return true }

// allocHead (re)allocates the head's chunk buffers for chunks of rows rows.
func (e *Engine) allocHead(rows int) error {
	if rows < 1 {
		return fmt.Errorf("LM head chunk of %d rows: need at least 1", rows)
	}
	// Recorded graphs use the chunk buffers, and chunks of another size
	// are GEMMs of new shapes, to be tuned outside a recording.
	if err := e.dropGraphs(); err != nil {
		return err
	}
	clear(e.warm)
	a := e.a
	for _, p := range []*cuda.Ptr{&a.logits, &a.dlogitsb} {
		if *p != 0 {
			if err := e.mem.free(*p); err != nil {
				return err
			}
			*p = 0
		}
	}
	V := int64(e.cfg.VocabSize)
	_, size := model.HeadLogitRows(rows, e.logitsBF())
	var err error
	if a.logits, err = e.mem.alloc(fmt.Sprintf("logits (chunk of %d rows)", rows), int64(rows)*V*size); err != nil {
		return err
	}
	if e.bf16 && !e.headMode.fp32Grad() && !e.logitsBF() {
		if a.dlogitsb, err = e.mem.alloc(fmt.Sprintf("logit gradient (bf16, chunk of %d rows)", rows), int64(rows)*V*2); err != nil {
			return err
		}
	}
	e.headRows = rows
	return nil
}

// outRows is how many rows a chunk of the fp32 logits the head hands out
// holds: all of the chunk's, or half where its buffer holds bf16 rows.
func (e *Engine) outRows() int {
	out, _ := model.HeadLogitRows(e.headRows, e.logitsBF())
	return out
}

// headGemm is gemm for the LM head's forward (backward false) and
// backward products, in the precision headMode asks for.
func (e *Engine) headGemm(backward, ta, tb bool, M, N, K int, A, B operand, beta float32, C cuda.Ptr) error {
	compute, name := int32(0), ""
	switch {
	case e.headMode.tf32:
		compute, name = cuda.ComputeF32FastTF32, "cublasLt tf32 GEMM (LM head)"
	case !backward && e.headMode.f32Fwd || backward && e.headMode.f32Bwd:
		compute, name = cuda.ComputeF32, "cublasLt fp32 GEMM (LM head)"
	default:
		return e.gemm(ta, tb, M, N, K, A, B, beta, C)
	}
	if A.f32 == 0 || B.f32 == 0 {
		return fmt.Errorf("LM head GEMM %dx%dx%d in fp32 has an operand without an fp32 buffer", M, N, K)
	}
	return e.timed(name, func() error {
		return e.lt.Gemm(compute, cuda.DataF32, ta, tb, M, N, K, 1, A.f32, B.f32, beta, C, e.gws, e.wsLimit, e.gs)
	})
}

// logitsBF says whether the training head writes its logits in bf16 (as
// autocast does) and the loss kernel its gradient over them: the default
// bf16 head. Half the bytes through the loss kernel and the forward GEMM's
// output, and no separate gradient buffer.
func (e *Engine) logitsBF() bool {
	return e.bf16 && !e.headMode.f32Fwd && !e.headMode.fp32Grad()
}

// headDX writes the final norm's output gradient for rows r0 on: through
// dlnGemm like the other norms', or in fp32 from an fp32 or TF32 head
// backward.
func (e *Engine) headDX(r0, rows, V int, dlogits, W operand) error {
	if e.headMode.fp32Grad() {
		return e.headGemm(true, false, false, rows, e.cfg.Hidden, V, dlogits, W, 0, rowsAt(e.a.dln, r0, e.cfg.Hidden, 4))
	}
	return e.dlnGemm(r0, rows, V, dlogits, W)
}

// headPass is what a pass over the LM head computes.
type headPass int

const (
	headLogits headPass = iota // the logits, copied to the caller
	headLoss                   // the loss
	headTrain                  // the loss and the head's gradients
)

// rowsAt offsets p, a buffer of rows of width values of size bytes, to row
// r; a missing buffer (0) stays missing.
func rowsAt(p cuda.Ptr, r, width, size int) cuda.Ptr {
	if p == 0 {
		return 0
	}
	return p + cuda.Ptr(int64(r)*int64(width)*int64(size))
}

// stageTargets puts b's targets in a.tgt and the loss scale, scale over
// the count targeted rows, in e.scal, for lmHead.
func (e *Engine) stageTargets(b model.Batch, count int, scale float32) error {
	if err := stage(e, e.a.tgt, b.Targets); err != nil {
		return err
	}
	return stage(e, e.scal+scalLossScale*4, []float32{scale / float32(count)})
}

// lmHead runs the LM head over the final norm's output (a.lnf, a.lnfb) of
// b's N rows, chunk by chunk. headLogits copies each chunk's logits into
// out (N x V). headLoss and headTrain add the loss scale times the summed
// loss to acc, from the targets and scale stageTargets left; headTrain
// also adds the head weight's gradient into the gradients and leaves the
// final norm's output gradient in a.dln (a.dlnb where dlnBF), for
// backward.
func (e *Engine) lmHead(b model.Batch, pass headPass, acc cuda.Ptr, out []float32) error {
	a := e.a
	N, d, V := b.B*b.T, e.cfg.Hidden, e.cfg.VocabSize
	head := e.headSpec()
	W := e.w(head)
	if pass == headLogits && len(out) != N*V {
		return fmt.Errorf("logits of %d rows need %d values, the output holds %d", N, N*V, len(out))
	}
	k := e.scal + scalLossScale*4
	grad := 0
	// Without a bf16 gradient buffer (fp32 precision, or a head backward
	// on fp32 operands) the gradient overwrites the chunk's logits. With
	// bf16 logits it overwrites them too, in bf16; logits handed out
	// (headLogits: generation, verification) stay fp32.
	bfLogits, bfFlag := pass != headLogits && e.logitsBF(), 0
	if bfLogits {
		bfFlag = 1
	}
	dlogits, dlb := act(a.logits), cuda.Ptr(0)
	if pass == headTrain {
		grad = 1
		if a.dlogitsb != 0 {
			dlogits, dlb = operand{bf: a.dlogitsb}, a.dlogitsb
		}
	}
	if bfLogits {
		dlogits = operand{bf: a.logits}
	}
	step := e.headRows
	if pass == headLogits {
		step = e.outRows()
	}
	for r0 := 0; r0 < N; r0 += step {
		rows := min(step, N-r0)
		lnf := actBF(rowsAt(a.lnf, r0, d, 4), rowsAt(a.lnfb, r0, d, 2))
		// logits (rows, V) = lnf (rows, d) W^T, W (V, d).
		if err := e.beforeWrite(readsLogits); err != nil {
			return err
		}
		var err error
		if bfLogits {
			err = e.gemmBF(false, true, rows, V, d, lnf, W, a.logits)
		} else {
			err = e.headGemm(false, false, true, rows, V, d, lnf, W, 0, a.logits)
		}
		if err != nil {
			return fmt.Errorf("LM head forward: %w", err)
		}
		if pass == headLogits {
			if err := cuda.Download(e.dv, out[r0*V:(r0+rows)*V], a.logits); err != nil {
				return err
			}
			continue
		}
		if err := e.launch(xentKernelFor(V, bfLogits), rows, 256, a.logits, dlb, rowsAt(a.losses, r0, 1, 4), rowsAt(a.tgt, r0, 1, 4), V, k, grad, bfFlag); err != nil {
			return err
		}
		if pass != headTrain {
			continue
		}
		// dW (V, d) += dlogits^T (V, rows) lnf (rows, d).
		if err := e.onSide(readsLogits, func() error { return e.headGemm(true, true, false, V, d, rows, dlogits, lnf, 1, e.gw(head)) }); err != nil {
			return fmt.Errorf("LM head backward: %w", err)
		}
		// dlnf (rows, d) = dlogits (rows, V) W (V, d), into the chunk's rows.
		if err := e.headDX(r0, rows, V, dlogits, W); err != nil {
			return fmt.Errorf("LM head backward: %w", err)
		}
	}
	if pass == headLogits {
		return nil
	}
	return e.launch("loss_reduce", 1, 1024, acc, a.losses, N, k)
}
